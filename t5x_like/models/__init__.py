"""Model families. ``build_model(config.model)`` picks one by ``family``."""

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
# What each family's model consumes and produces, hence its objective and features:
# "encoder_decoder" (seq2seq), "decoder" (causal or prefix LM), "encoder" (masked LM;
# ELECTRA reads the same batches and adds replaced-token detection).
STRUCTURES = {"encoder_decoder": "encoder_decoder", "bart": "encoder_decoder",
              "decoder": "decoder", "encoder": "encoder", "electra": "encoder",
              "bilm": "decoder"}  # bilm: causal-LM batches, its own objective


def structure(family: str) -> str:
    if family not in STRUCTURES:
        raise ValueError(f"Unknown model.family {family!r}; available: {sorted(FAMILIES)}.")
    return STRUCTURES[family]


def family_config_fields(family: str) -> dict:
    """Default value of every model key for ``family`` (the schema of ``config.model``)."""
    if family not in FAMILIES:
        raise ValueError(f"Unknown model.family {family!r}; available: {sorted(FAMILIES)}.")
    config_cls = FAMILIES[family][0]
    return {f.name: f.default for f in dataclasses.fields(config_cls)}


def build_model(model_config):
    family = model_config["family"]
    if family not in FAMILIES:
        raise ValueError(f"Unknown model.family {family!r}; available: {sorted(FAMILIES)}.")
    config_cls, module_cls = FAMILIES[family]
    fields = {k: v for k, v in dict(model_config).items() if k != "family"}
    if "mlp_activations" in fields:
        fields["mlp_activations"] = tuple(fields["mlp_activations"])
    for key in ("filter_widths", "filter_counts"):  # bilm
        if key in fields:
            fields[key] = tuple(fields[key])
    return module_cls(config_cls(**fields))


def example_inputs(model, lengths: dict | None = None, batch_size: int = 1) -> tuple:
    """Positional inputs that ``model.init`` needs, as int32 ones (shapes only matter)."""
    import jax.numpy as jnp

    lengths = lengths or {}
    if "input_tokens" in lengths:  # a fine-tuning head (models.heads.WithHead)
        return (jnp.ones((batch_size, lengths["input_tokens"]), jnp.int32),)
    if isinstance(model, Bilm):
        return (jnp.ones((batch_size, lengths.get("decoder_target_tokens", 8)), jnp.int32),)
    if isinstance(model, DecoderOnly):
        return (jnp.ones((batch_size, lengths.get("decoder_input_tokens", 8)), jnp.int32),)
    if isinstance(model, (EncoderOnly, Electra)):
        return (jnp.ones((batch_size, lengths.get("encoder_input_tokens", 8)), jnp.int32),)
    encoder = lengths.get("encoder_input_tokens", 8)
    decoder = lengths.get("decoder_input_tokens", 8)
    return (jnp.ones((batch_size, encoder), jnp.int32), jnp.ones((batch_size, decoder), jnp.int32),
            jnp.ones((batch_size, decoder), jnp.int32))
