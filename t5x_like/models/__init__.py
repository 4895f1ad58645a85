"""Model families. ``build_model(config.model)`` picks one by ``family``."""

from __future__ import annotations

from t5x_like.models.t5 import EncoderDecoder, T5Config

FAMILIES = ("encoder_decoder",)


def build_model(model_config) -> EncoderDecoder:
    family = model_config.family
    if family != "encoder_decoder":
        raise ValueError(f"Unknown model.family {family!r}; available: {FAMILIES}.")
    fields = {k: v for k, v in model_config.items() if k != "family"}
    if "mlp_activations" in fields:
        fields["mlp_activations"] = tuple(fields["mlp_activations"])
    return EncoderDecoder(T5Config(**fields))
