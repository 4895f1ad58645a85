"""Task heads for fine-tuning a pretrained encoder or decoder.

``WithHead(backbone, head)`` runs the backbone for its hidden states and adds one
small layer on top; the backbone's parameters sit under ``backbone`` so a
pretrained checkpoint drops in unchanged (``{"backbone": pretrained, "head": ...}``).
An ELECTRA backbone runs its discriminator alone; its generator is not part of the
fine-tuned model (train's ``init_from`` leaves it behind).

Heads (``HeadConfig.kind``):
- ``classification``: ``[batch, num_labels]`` logits from a pooled vector;
  regression is ``num_labels=1``;
- ``token_classification``: ``[batch, length, num_labels]`` (tagging, NER);
- ``span_extraction``: start and end logits ``[batch, length]`` (SQuAD-style QA),
  padding masked out.

Pooling for classification: ``cls`` (the first token, through the backbone's
pooler when it has one, as BERT fine-tuning does), ``last`` (the last real token,
the usual choice for decoders, whose last token has seen the whole sequence) or
``mean`` (over real tokens).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.models import layers
from t5x_like.models.layers import constrain

HEAD_KINDS = ("classification", "token_classification", "span_extraction")
POOLINGS = ("cls", "last", "mean")


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    kind: str = "classification"
    num_labels: int = 2
    pooling: str = "cls"
    dropout_rate: float = 0.1

    def __post_init__(self):
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"Unknown head kind {self.kind!r}; choose from {HEAD_KINDS}.")
        if self.pooling not in POOLINGS:
            raise ValueError(f"Unknown pooling {self.pooling!r}; choose from {POOLINGS}.")
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be at least 1, got {self.num_labels}.")


class WithHead(nn.Module):
    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("input_tokens",)

    backbone: nn.Module
    head: HeadConfig

    @nn.compact
    def __call__(self, input_tokens, token_type_ids=None, deterministic: bool = True):
        cfg = self.head
        valid = input_tokens != getattr(self.backbone.config, "pad_id", 0)
        hidden, pooled = self._backbone(input_tokens, token_type_ids, deterministic)
        dropout = nn.Dropout(cfg.dropout_rate)
        dense = lambda features: layers.DenseGeneral(  # noqa: E731
            features, kernel_axes=("embed", None), use_bias=True,
            kernel_init=nn.initializers.normal(stddev=0.02), dtype=hidden.dtype, name="head")
        if cfg.kind == "classification":
            vector = self._pool(hidden, pooled, valid)
            return dense(cfg.num_labels)(dropout(vector, deterministic=deterministic)).astype(
                jnp.float32)
        if cfg.kind == "token_classification":
            logits = dense(cfg.num_labels)(dropout(hidden, deterministic=deterministic))
            return constrain(logits.astype(jnp.float32), ("batch", "length", None))
        logits = dense(2)(dropout(hidden, deterministic=deterministic)).astype(jnp.float32)
        logits = jnp.where(valid[..., None], logits, layers.NEG_INF)
        return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}

    def _backbone(self, input_tokens, token_type_ids, deterministic):
        """``(hidden [batch, length, d], pooled or None)``: what the backbone gives a head
        (each body class says, in its ``head_features``)."""
        if not hasattr(self.backbone, "head_features"):
            raise TypeError(f"Task heads need an encoder or decoder backbone, got "
                            f"{type(self.backbone).__name__}; fine-tune encoder-decoders "
                            "text-to-text.")
        return self.backbone.head_features(input_tokens, token_type_ids,
                                           deterministic=deterministic)

    def _pool(self, hidden, pooled, valid) -> jax.Array:
        pooling = self.head.pooling
        if pooling == "cls":
            return pooled if pooled is not None else hidden[:, 0]
        if pooling == "last":
            last = jnp.maximum(valid.sum(axis=1) - 1, 0)
            return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
        weights = valid[..., None].astype(hidden.dtype)
        return (hidden * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1.0)


class RewardModel(nn.Module):
    """A reward model (InstructGPT; TRL's ``AutoModelForSequenceClassification`` with one
    label): the backbone's final-normed hidden state at each row's last real token
    (``mask``: 1 on real tokens, which may include id 0) through a bias-free projection
    to one number. Parameters: ``backbone`` (a pretrained decoder drops in) and
    ``head``."""

    init_features: ClassVar[tuple[str, ...]] = ("input_tokens",)

    backbone: nn.Module

    @nn.compact
    def __call__(self, input_tokens, mask=None, deterministic: bool = True):
        if mask is None:
            mask = input_tokens != getattr(self.backbone.config, "pad_id", 0)
        hidden, _ = self.backbone.head_features(input_tokens, None, deterministic=deterministic)
        last = jnp.maximum(mask.astype(jnp.int32).sum(axis=1) - 1, 0)
        vector = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
        reward = layers.DenseGeneral(1, kernel_axes=("embed", None), use_bias=False,
                                     kernel_init=nn.initializers.normal(stddev=0.02),
                                     dtype=hidden.dtype, name="head")(vector)
        return reward[:, 0].astype(jnp.float32)


class ValueModel(nn.Module):
    """PPO's value model (TRL's: an ``AutoModelForSequenceClassification`` with one label,
    its ``score`` read at every position): the backbone's final-normed hidden state at
    each position through a bias-free projection to one number, ``[batch, length]``. Its
    parameters are named as ``RewardModel``'s (``backbone``, ``head``), so a reward
    model's checkpoint starts it, as InstructGPT and TRL start the value model."""

    init_features: ClassVar[tuple[str, ...]] = ("input_tokens",)

    backbone: nn.Module

    @nn.compact
    def __call__(self, input_tokens, deterministic: bool = True):
        hidden, _ = self.backbone.head_features(input_tokens, None, deterministic=deterministic)
        values = layers.DenseGeneral(1, kernel_axes=("embed", None), use_bias=False,
                                     kernel_init=nn.initializers.normal(stddev=0.02),
                                     dtype=hidden.dtype, name="head")(hidden)
        return values[..., 0].astype(jnp.float32)


class PolicyAndValue(nn.Module):
    """A policy and its value model trained together (PPO; TRL's
    ``PolicyAndValueWrapper``): two separate towers, ``policy`` (a decoder, its logits)
    and ``value`` (a ``ValueModel``), one parameter tree for one optimizer."""

    init_features: ClassVar[tuple[str, ...]] = ("decoder_input_tokens",)

    policy: nn.Module
    value: nn.Module

    def __call__(self, decoder_input_tokens, deterministic: bool = True):
        return (self.policy(decoder_input_tokens, deterministic=deterministic),
                self.value(decoder_input_tokens, deterministic=deterministic))
