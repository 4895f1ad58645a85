# plugin_family.py: a model family of your own, registered from your module.
"""A causal convolutional language model as a plug-in family: its spec (the model
section, checked like every other), its Flax module, its structure (the decoder's
batches, loss and scoring, with its own FLOPs), and the sharding rule of its own
axis, registered in one call. Load it with ``--module=plugin_family``; nothing in
t5x_like/ changes."""

import flax.linen as nn
import jax.numpy as jnp

from t5x_like.config.model_parts import ModelSpec, OneStack
from t5x_like.config.sections import field, require, section
from t5x_like.models import layers
from t5x_like.structures import families
from t5x_like.structures.decoder import DecoderStructure


@section
class ConvLMSpec(OneStack, ModelSpec):
    """``model.family = "conv_lm"``: ``num_layers`` blocks of a causal depthwise
    convolution over ``kernel_size`` tokens and a gated MLP, each with a residual."""

    d_model: int = field(64, minimum=1)
    kernel_size: int = field(4, minimum=1)

    FAMILY = "conv_lm"
    DEFAULTS = dict(vocab_size=8192, dropout_rate=0.0, num_layers=2)
    EXAMPLE_CONFIG = "plugin_family_config.py"

    def check_run(self, run):
        require(not run.data.pack, "model.family='conv_lm' reads one document a row; its "
                                   "convolution would cross packed documents: set "
                                   "--config.data.pack=False.")


class ConvBlock(nn.Module):
    config: ConvLMSpec

    @nn.compact
    def __call__(self, x):
        cfg, dtype = self.config, layers.compute_dtype(self.config)
        taps = self.param("taps", nn.with_logical_partitioning(
            nn.initializers.normal(0.1), ("taps", "embed")), (cfg.kernel_size, cfg.d_model))
        h = layers.RMSNorm(dtype=dtype, name="conv_norm")(x)
        padded = jnp.pad(h, ((0, 0), (cfg.kernel_size - 1, 0), (0, 0)))  # causal: past only
        x = x + sum(padded[:, i:i + x.shape[1]] * taps[i].astype(dtype)
                    for i in range(cfg.kernel_size))
        h = layers.RMSNorm(dtype=dtype, name="mlp_norm")(x)
        return x + layers.Mlp(4 * cfg.d_model, ("silu", "linear"), dtype=dtype, name="mlp")(h)


class ConvLM(nn.Module):
    """``__call__(decoder_input_tokens, ...) -> logits [batch, length, vocab]`` (the
    decoder structure's call)."""

    init_features = ("decoder_input_tokens",)
    config: ConvLMSpec

    @nn.compact
    def __call__(self, decoder_input_tokens, deterministic=True, **unused_features):
        cfg = self.config
        embed = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=layers.compute_dtype(cfg),
                             embedding_init=nn.initializers.normal(cfg.d_model ** -0.5),
                             name="token_embedder")
        x = embed(decoder_input_tokens)
        for i in range(cfg.num_layers):
            x = ConvBlock(cfg, name=f"layers_{i}")(x)
        x = layers.RMSNorm(dtype=layers.compute_dtype(cfg), name="final_norm")(x)
        self.sow("intermediates", "final_hidden", x)
        return embed.attend(x).astype(jnp.float32)


class ConvLMStructure(DecoderStructure):
    """The decoder's causal-LM batches, loss and scoring; no positions to run out of, no
    cache to generate with, and FLOPs of its own."""

    name = "conv_lm"
    distillable = False
    depth_keys = ("num_layers",)

    @classmethod
    def positions_needed(cls, config, lengths):
        return 0

    def forward_flops_per_sequence(self, model, lengths):
        d, s = model.d_model, lengths.get("inputs", 0) + lengths["targets"]
        per_token = model.num_layers * (2 * model.kernel_size * d + 3 * 2 * d * 4 * d)
        return s * (per_token + 2 * d * model.vocab_size)


families.register(families.Family(
    "conv_lm", ConvLMSpec, ConvLM, ConvLMStructure,
    rules={"*": (("taps", None),)}))  # the kernel's taps are replicated on every rule set
