"""ELECTRA (Clark et al. 2020): a small masked-LM generator and a discriminator that
share their word, position and token-type embeddings.

The generator fills the masked positions with samples from its own distribution
(Gumbel-max, so no gradient flows through the choice); the discriminator reads the
result and says, for every token, whether it was replaced. Both towers are BERT
encoders (``models.encoder.EncoderOnly``) reading one ``SharedEmbeddings``; the
generator is narrower (``generator_d_model``, a quarter to a third of the
discriminator's width in the paper) and has the tied masked-LM head, the
discriminator has the replaced-token head. Fine-tuning keeps the discriminator
(``discriminate``); the generator is left behind.

``generator_d_model = 0`` builds the discriminator alone: what a Hugging Face
``ElectraForPreTraining`` folder holds without its generator. It fine-tunes and
scores replaced tokens, but cannot pretrain.

Parameters: ``embeddings/{token,position,token_type}_embedder``, ``embeddings/
embedding_norm``, ``generator/...`` and ``discriminator/...`` (each an
``EncoderOnly`` tree without its own tables; ``embedding_projection`` where the
tower is wider or narrower than the embeddings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.models.encoder import EncoderConfig, EncoderOnly, SharedEmbeddings


@dataclasses.dataclass(frozen=True)
class ElectraConfig:
    vocab_size: int = 30522
    # The discriminator (what fine-tunes): BERT's shape.
    d_model: int = 256
    num_heads: int = 4
    head_dim: int = 64
    d_ff: int = 1024
    num_layers: int = 12
    # Width of the shared embeddings (0: d_model); each tower projects it to its own width.
    embedding_dim: int = 128
    # The generator: a narrower encoder of the same depth (0 width: no generator).
    generator_d_model: int = 64
    generator_num_heads: int = 1
    generator_head_dim: int = 64
    generator_d_ff: int = 256
    generator_num_layers: int = 12
    # The discriminator's loss weight λ against the generator's masked-LM loss (the paper: 50).
    discriminator_loss_weight: float = 50.0
    # Softmax temperature of the generator's samples (1.0: its own distribution).
    sampling_temperature: float = 1.0
    # Sample at most this many masked positions per row (the first ones), as ELECTRA's
    # max_predictions_per_seq; further masked positions get the generator's argmax.
    # 0: every position. Drawing Gumbel noise for the whole [batch, length, vocab]
    # costs more than the tiny models' step on a CPU.
    max_predictions_per_seq: int = 0
    max_length: int = 512
    type_vocab_size: int = 2
    mlp_activations: Sequence[str] = ("gelu_exact",)
    layer_norm_epsilon: float = 1e-12
    pad_id: int = 0
    dropout_rate: float = 0.0
    dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"

    @property
    def has_generator(self) -> bool:
        return self.generator_d_model > 0

    @property
    def embedding_width(self) -> int:
        return self.embedding_dim or self.d_model

    def tower(self, which: str) -> EncoderConfig:
        """The EncoderConfig of ``"generator"`` or ``"discriminator"``."""
        prefix = "generator_" if which == "generator" else ""
        d_model = getattr(self, f"{prefix}d_model")
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(EncoderConfig)
                  if hasattr(self, f.name) and f.name not in (
                      "d_model", "num_heads", "head_dim", "d_ff", "num_layers", "embedding_dim")}
        return EncoderConfig(
            **shared, d_model=d_model, num_heads=getattr(self, f"{prefix}num_heads"),
            head_dim=getattr(self, f"{prefix}head_dim"), d_ff=getattr(self, f"{prefix}d_ff"),
            num_layers=getattr(self, f"{prefix}num_layers"),
            # A tower projects the shared embeddings only when its width differs.
            embedding_dim=0 if self.embedding_width == d_model else self.embedding_width,
            next_sentence_head=False)


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

    config: ElectraConfig

    def setup(self):
        cfg = self.config
        self.embeddings = SharedEmbeddings(dataclasses.replace(
            cfg.tower("discriminator"), embedding_dim=cfg.embedding_width))
        self.discriminator = EncoderOnly(cfg.tower("discriminator"), embeddings=self.embeddings,
                                         output_head="replaced_token")
        if cfg.has_generator:
            self.generator = EncoderOnly(cfg.tower("generator"), embeddings=self.embeddings)

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
