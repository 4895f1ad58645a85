"""Model families: each family's config dataclass and Flax module (``FAMILIES``);
``build_model(config.model)`` builds one. Which structure a family has (its batches,
loss, scoring, decoding) is the structure registry's (``t5x_like.structures``)."""

from __future__ import annotations

import dataclasses

from t5x_like.models.bart import BartConfig, BartEncoderDecoder
from t5x_like.models.bilm import Bilm, BilmConfig
from t5x_like.models.decoder import DecoderConfig, DecoderOnly
from t5x_like.models.electra import Electra, ElectraConfig
from t5x_like.models.encoder import EncoderConfig, EncoderOnly
from t5x_like.models.t5 import EncoderDecoder, T5Config

FAMILIES = {
    "encoder_decoder": (T5Config, EncoderDecoder),
    "bart": (BartConfig, BartEncoderDecoder),
    "decoder": (DecoderConfig, DecoderOnly),
    "encoder": (EncoderConfig, EncoderOnly),
    "electra": (ElectraConfig, Electra),
    "bilm": (BilmConfig, Bilm),
}
def family_config_fields(family: str) -> dict:
    """Default value of every model key for ``family`` (the schema of ``config.model``)."""
    if family not in FAMILIES:
        raise ValueError(f"Unknown model.family {family!r}; available: {sorted(FAMILIES)}.")
    config_cls = FAMILIES[family][0]
    return {f.name: f.default for f in dataclasses.fields(config_cls)}


def family_config(model_config):
    """The family's config dataclass for ``config.model`` (its own checks raise
    ``ValueError``: a bad ``layer_types``, experts that cannot be built)."""
    family = model_config["family"]
    if family not in FAMILIES:
        raise ValueError(f"Unknown model.family {family!r}; available: {sorted(FAMILIES)}.")
    fields = {k: v for k, v in dict(model_config).items() if k != "family"}
    for key in ("mlp_activations", "filter_widths", "filter_counts", "layer_types"):
        if key in fields:  # lists from a config file or JSON; the dataclasses hash tuples
            fields[key] = tuple(fields[key])
    return FAMILIES[family][0](**fields)


def build_model(model_config):
    config = family_config(model_config)
    return FAMILIES[model_config["family"]][1](config)


def example_inputs(model, lengths: dict | None = None, batch_size: int = 1) -> tuple:
    """Positional inputs that ``model.init`` needs, as int32 ones (shapes only matter):
    one per feature the model's class names in ``init_features``, at its length in
    ``lengths`` (8 where absent)."""
    import jax.numpy as jnp

    lengths = lengths or {}
    return tuple(jnp.ones((batch_size, lengths.get(name, 8)), jnp.int32)
                 for name in type(model).init_features)
