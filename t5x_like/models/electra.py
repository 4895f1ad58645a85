"""ELECTRA (Clark et al. 2020): a small masked-LM generator and a discriminator that
share their word, position and token-type embeddings.

The generator fills the masked positions with samples from its own distribution
(Gumbel-max, so no gradient flows through the choice); the discriminator reads the
result and says, for every token, whether it was replaced. Both towers are BERT
encoders (``models.encoder.EncoderOnly``) reading one ``SharedEmbeddings``; the
generator is narrower (``generator.d_model``, a quarter to a third of the
discriminator's width in the paper) and has the tied masked-LM head, the
discriminator has the replaced-token head. Fine-tuning keeps the discriminator
(``discriminate``); the generator is left behind.

``generator.d_model = 0`` builds the discriminator alone: what a Hugging Face
``ElectraForPreTraining`` folder holds without its generator. It fine-tunes and
scores replaced tokens, but cannot pretrain.

Parameters: ``embeddings/{token,position,token_type}_embedder``, ``embeddings/
embedding_norm``, ``generator/...`` and ``discriminator/...`` (each an
``EncoderOnly`` tree without its own tables; ``embedding_projection`` where the
tower is wider or narrower than the embeddings).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.config.model_specs import ElectraSpec, EncoderSpec
from t5x_like.models.encoder import EncoderOnly, SharedEmbeddings


def tower(spec: ElectraSpec, which: str) -> EncoderSpec:
    """The encoder spec of ``"generator"`` or ``"discriminator"``: the tower's dimensions
    (``spec.generator`` or the shared ones), everything else ELECTRA's."""
    dims = spec.generator if which == "generator" else spec
    return EncoderSpec.from_mapping(dict(
        vocab_size=spec.vocab_size, dropout_rate=spec.dropout_rate,
        numerics=spec.numerics.to_dict(), pad_id=spec.pad_id, d_model=dims.d_model,
        num_heads=dims.num_heads, head_dim=dims.head_dim, d_ff=dims.d_ff,
        num_layers=dims.num_layers, mlp_activations=spec.mlp_activations,
        layer_norm_epsilon=spec.layer_norm_epsilon, attention={"impl": spec.attention.impl},
        positions={"max_length": spec.positions.max_length},
        type_vocab_size=spec.type_vocab_size, next_sentence_head=False,
        # A tower projects the shared embeddings only when its width differs.
        embedding_dim=0 if spec.embedding_width == dims.d_model else spec.embedding_width))


def gumbel_sample(rng, logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """One token per position from ``softmax(logits / temperature)`` by the Gumbel-max
    trick; ``stop_gradient``: the discriminator's loss does not reach the generator."""
    logits = jax.lax.stop_gradient(logits.astype(jnp.float32)) / temperature
    return jnp.argmax(logits + jax.random.gumbel(rng, logits.shape), axis=-1).astype(jnp.int32)


def sample_masked(rng, logits: jax.Array, masked: jax.Array, max_predictions: int = 0,
                  temperature: float = 1.0) -> jax.Array:
    """Samples ``[batch, length]`` at the masked positions: every position when
    ``max_predictions`` is 0 or covers the row, else the first ``max_predictions``
    masked positions of each row (noise drawn for those alone); the rest get the
    argmax. Unmasked positions' values are not used."""
    batch, length, _ = logits.shape
    if not max_predictions or max_predictions >= length:
        return gumbel_sample(rng, logits, temperature)
    earlier_first = jnp.where(masked, length - jnp.arange(length), 0)
    _, positions = jax.lax.top_k(earlier_first, max_predictions)  # [batch, k]
    picked = jnp.take_along_axis(logits, positions[..., None], axis=1)
    samples = gumbel_sample(rng, picked, temperature)
    fallback = jnp.argmax(jax.lax.stop_gradient(logits), axis=-1).astype(jnp.int32)
    return fallback.at[jnp.arange(batch)[:, None], positions].set(samples)


class Electra(nn.Module):
    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("encoder_input_tokens",)

    config: ElectraSpec

    def setup(self):
        cfg = self.config
        discriminator = tower(cfg, "discriminator")
        self.embeddings = SharedEmbeddings(discriminator.replace(
            embedding_dim=cfg.embedding_width))
        self.discriminator = EncoderOnly(discriminator, embeddings=self.embeddings,
                                         output_head="replaced_token")
        if cfg.has_generator:
            self.generator = EncoderOnly(tower(cfg, "generator"), embeddings=self.embeddings)

    def __call__(self, input_tokens, token_type_ids=None, input_mask=None, segment_ids=None,
                 positions=None, masked_positions=None, deterministic: bool = True) -> dict:
        """The generator reads ``input_tokens`` (masked); its samples replace the tokens
        at ``masked_positions``; the discriminator reads the result.

        Samples come from the ``"sample"`` rng; without one (initialisation) the
        generator's argmax stands in. Returns ``mlm_logits`` (generator), the
        ``corrupted_tokens`` the discriminator read, its ``rtd_logits`` and ``hidden``
        (without a generator: the discriminator on ``input_tokens`` as they are).
        """
        if not self.config.has_generator:  # a discriminator alone: nothing to corrupt with
            return self.discriminate(input_tokens, token_type_ids, input_mask, segment_ids,
                                     positions, deterministic)
        common = dict(token_type_ids=token_type_ids, input_mask=input_mask,
                      segment_ids=segment_ids, positions=positions, deterministic=deterministic)
        logits = self.generator(input_tokens, **common)["mlm_logits"]
        if masked_positions is None:
            masked_positions = jnp.zeros(input_tokens.shape, bool)
        if self.has_rng("sample"):
            sampled = sample_masked(self.make_rng("sample"), logits, masked_positions,
                                    self.config.max_predictions_per_seq,
                                    self.config.sampling_temperature)
        else:
            sampled = jnp.argmax(logits, axis=-1).astype(input_tokens.dtype)
        corrupted = jnp.where(masked_positions, sampled.astype(input_tokens.dtype), input_tokens)
        out = self.discriminator(corrupted, **common)
        return {"mlm_logits": logits, "corrupted_tokens": corrupted,
                "rtd_logits": out["rtd_logits"], "hidden": out["hidden"]}

    def head_features(self, input_tokens, token_type_ids=None, deterministic: bool = True):
        """What a task head reads: the discriminator fine-tunes (Clark et al.)."""
        out = self.discriminate(input_tokens, token_type_ids, deterministic=deterministic)
        return out["hidden"], None

    def discriminate(self, input_tokens, token_type_ids=None, input_mask=None, segment_ids=None,
                     positions=None, deterministic: bool = True) -> dict:
        """The discriminator alone (fine-tuning, replaced-token scores): ``rtd_logits``
        and ``hidden``."""
        return self.discriminator(input_tokens, token_type_ids=token_type_ids,
                                  input_mask=input_mask, segment_ids=segment_ids,
                                  positions=positions, deterministic=deterministic)
