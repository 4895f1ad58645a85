"""The dense retriever: a bi-encoder of two encoder-family towers (query, document),
each pooled to one vector per text; relevance is their inner product.

Two towers rather than one shared encoder, as DPR: RAG later trains the query tower
alone against a document index built (and kept fixed) with the document tower.
Both start from the same pretrained encoder checkpoint. The towers are
``models.encoder.EncoderOnly`` as they are; only their ``hidden`` output is read,
so the unused masked-LM head is dead code that XLA removes under jit.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like import structures
from t5x_like.config import ModelSpec, model_spec_of

POOLINGS = ("mean", "cls")


def pool(hidden: jax.Array, mask: jax.Array, kind: str) -> jax.Array:
    """``[batch, d]``: the mean over real tokens, or the first position ([CLS])."""
    if kind == "cls":
        return hidden[:, 0]
    if kind != "mean":
        raise ValueError(f"pooling={kind!r}; use one of {POOLINGS}.")
    mask = mask.astype(hidden.dtype)[..., None]
    return (hidden * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)


class Tower(nn.Module):
    """One encoder and its pooling (and optional L2 normalisation)."""

    model: ModelSpec  # the encoder's model spec
    pooling: str = "mean"
    normalize: bool = False

    @nn.compact
    def __call__(self, tokens):
        encoder = structures.families.of(self.model).module(self.model, name="encoder")
        mask = tokens != 0
        vector = pool(encoder(tokens, input_mask=mask)["hidden"], mask, self.pooling)
        vector = vector.astype(jnp.float32)
        if self.normalize:
            vector = vector / jnp.maximum(jnp.linalg.norm(vector, axis=-1, keepdims=True), 1e-6)
        return vector


class BiEncoder(nn.Module):
    """``encode_query`` / ``encode_doc``; params ``{"query": ..., "doc": ...}``, each
    holding the encoder's own tree under ``encoder``."""

    model: ModelSpec
    pooling: str = "mean"
    normalize: bool = False

    def setup(self):
        self.query = Tower(self.model, self.pooling, self.normalize)
        self.doc = Tower(self.model, self.pooling, self.normalize)

    def __call__(self, query_tokens, doc_tokens):
        return self.query(query_tokens), self.doc(doc_tokens)

    def encode_query(self, tokens):
        return self.query(tokens)

    def encode_doc(self, tokens):
        return self.doc(tokens)


def bi_encoder(model_config, pooling: str = "mean", normalize: bool = False) -> BiEncoder:
    """The bi-encoder of an encoder's model spec (or model section, either layout)."""
    model = model_spec_of(model_config)
    if not structures.structure_class(model.family).embeds_text:
        raise ValueError(f"The retriever's towers are encoders (model.family 'encoder'); "
                         f"got {model.family!r}.")
    return BiEncoder(model, pooling, normalize)


def init_params(model: BiEncoder, encoder_params=None, seed: int = 0, length: int = 8) -> dict:
    """Fresh params, with both towers' encoders replaced by ``encoder_params`` (a
    pretrained encoder's tree) when given."""
    tokens = jnp.ones((1, length), jnp.int32)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), tokens, tokens)["params"])
    params = jax.device_get(params)
    if encoder_params is not None:
        params = {tower: {"encoder": encoder_params} for tower in ("query", "doc")}
    return params
