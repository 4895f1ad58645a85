"""The parts every family's model spec is built from, each written once: the model base
(family, variant, vocabulary, dropout, numerics), the transformer dimensions, and the
sections for attention, positions (RoPE with its scaling as one section), experts and
numerics. A family (``model_specs.py``) picks its sections' classes and adds its own keys.

A shared key's value may differ by family (BERT's ``layer_norm_epsilon`` is not T5's):
the family class gives it in ``DEFAULTS`` instead of declaring the key again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from t5x_like.config.sections import Section, field, join, require, section

DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "offload")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "flash", "chunked")
LAYER_TYPES = ("full_attention", "sliding_attention")
ROPE_SCALINGS = ("default", "linear", "llama3", "yarn")
ROUTER_SOFTMAX = ("before_top_k", "after_top_k")
DISPATCH_MODES = ("capacity", "dropless")
EXPERT_IMPLEMENTATIONS = ("auto", "ragged_dot", "megablox")
MLP_ACTIVATIONS = ("gelu", "gelu_exact", "relu", "silu", "linear")  # models.layers.ACTIVATIONS


@section
class Numerics(Section):
    """How the model computes, not what: the dtype of activations, a scanned layer stack
    and what the backward pass rematerialises. Checkpoints do not depend on the last."""

    dtype: str = field("float32", choices=DTYPES)
    scan_layers: bool = False
    remat_policy: str = field("none", choices=REMAT_POLICIES)


@section
class Attention(Section):
    """``impl``: which kernel computes attention (``docs/attention.md``)."""

    impl: str = field("auto", choices=ATTENTION_IMPLEMENTATIONS)


@section
class DecoderAttention(Attention):
    """A decoder's attention switches: grouped-query heads, a sliding window (per layer
    with ``layer_types``, Gemma's alternation), Qwen2's q/k/v biases, Qwen3's and Gemma
    3's per-head q/k norms, Gemma's query scale and logit soft-cap."""

    num_kv_heads: int = field(0, minimum=0, doc="0: as many as num_heads")
    sliding_window: int = field(0, minimum=0, doc="0: attend to the whole past")
    layer_types: tuple[str, ...] = ()
    qkv_bias: bool = False
    qk_norm: bool = False
    query_pre_scalar: float = field(0.0, minimum=0.0, doc="logits times this ** -0.5; 0: head_dim")
    logit_softcap: float = field(0.0, minimum=0.0, doc="cap * tanh(logits / cap); 0: none")

    def layer_type(self, index: int) -> str:
        if self.layer_types:
            return self.layer_types[index]
        return "sliding_attention" if self.sliding_window else "full_attention"

    def window(self, layer_type: str) -> int:
        return self.sliding_window if layer_type == "sliding_attention" else 0

    def check(self, path: str) -> None:
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        require(not unknown, f"{path}.layer_types has {unknown}; each layer is one of "
                             f"{LAYER_TYPES}.")
        require("sliding_attention" not in self.layer_types or self.sliding_window,
                f"{path}.layer_types has sliding layers but {path}.sliding_window=0; set a "
                "window.")


@section
class EncoderAttention(Attention):
    """A BERT-style encoder's Longformer switches: a local window and global tokens."""

    window: int = field(0, minimum=0, doc="0: full attention; w: keys within w - 1 positions")
    global_tokens: bool = False
    max_global_tokens: int = field(64, minimum=1)


@section
class Positions(Section):
    """How positions enter a model (the family's class says which way)."""


@section
class LearnedPositions(Positions):
    """A learned position table of ``max_length`` rows."""

    max_length: int = field(minimum=1)


@section
class RelativePositions(Positions):
    """T5's bucketed relative position bias."""

    num_buckets: int = field(32, minimum=1)
    max_distance: int = field(128, minimum=1)


@section
class Rope(Section):
    """Rotary positions and their rescaling, as one section: ``max_wavelength`` (the
    base), sliding layers' own base (Gemma 3; 0: the same), and the ``scaling`` of
    Llama 3.1 (``llama3``), YaRN or plain interpolation (``linear``); ``factor`` is how
    many times the pretraining context (``original_max_length``) is extended."""

    max_wavelength: float = field(10_000.0, minimum=0.0)
    local_max_wavelength: float = field(0.0, minimum=0.0)
    scaling: str = field("default", choices=ROPE_SCALINGS)
    factor: float = field(1.0, minimum=0.0)
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_length: int = field(0, minimum=0)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = field(0.0, minimum=0.0, doc="YaRN's; 0: 0.1 ln(factor) + 1")
    truncate: bool = True


@section
class DecoderPositions(LearnedPositions):
    """A decoder's positions: a learned table (GPT-2) or rotary (``kind``), whose
    ``max_length`` is then what the model was built for."""

    kind: str = field("learned", choices=("learned", "rotary"))
    rope: Rope = field(Rope())


@section
class EncoderPositions(LearnedPositions):
    """BERT's learned table; RoBERTa's positions start after ``offset`` (pad + 1)."""

    offset: int = field(0, minimum=0)


@section
class Experts(Section):
    """A mixture of experts in place of MLPs (``num_experts=0``: dense). ``every``: layer
    i is sparse when (i + 1) % every == 0. ``d_ff``: each expert's width (0: the model's);
    ``shared_d_ff``: an always-on MLP beside the experts (``shared_gate``: Qwen-MoE's
    sigmoid gate on it). The loss weights multiply the mean over sparse layers."""

    num_experts: int = field(0, minimum=0)
    num_experts_per_token: int = field(1, minimum=1, doc="k: 1 is Switch, 2 is Mixtral")
    every: int = field(1, minimum=1)
    d_ff: int = field(0, minimum=0)
    shared_d_ff: int = field(0, minimum=0)
    shared_gate: bool = False
    router_softmax: str = field("before_top_k", choices=ROUTER_SOFTMAX)
    router_jitter: float = field(0.0, minimum=0.0)
    aux_loss_weight: float = field(0.01, minimum=0.0)
    z_loss_weight: float = field(0.0, minimum=0.0)
    dispatch: str = field("capacity", choices=DISPATCH_MODES)
    capacity_factor: float = 1.25
    group_size: int = field(0, minimum=0, doc="capacity dispatch: tokens per group; 0: a row")
    impl: str = field("auto", choices=EXPERT_IMPLEMENTATIONS)
    ragged_buffer_factor: float = field(
        0.0, minimum=0.0, doc="dropless over an expert axis: each device's receive buffer in "
        "multiples of its own assignments (MaxText's); assignments past it are dropped. "
        "0: room for the worst case, nothing dropped")

    def is_moe_layer(self, index: int) -> bool:
        return self.num_experts > 0 and (index + 1) % self.every == 0

    def problem(self, num_layers: int, scan: bool, path: str = "model.experts") -> str:
        """Why these settings cannot be built into ``num_layers`` layers ("" when they can)."""
        if not self.num_experts:
            return ""
        if self.num_experts_per_token > self.num_experts:
            return (f"{path}.num_experts_per_token={self.num_experts_per_token} must be in "
                    f"[1, num_experts={self.num_experts}].")
        if self.every > num_layers:
            return (f"{path}.every={self.every} leaves all {num_layers} layers dense; set it at "
                    f"most {num_layers}, or num_experts=0 for a dense model.")
        if scan and self.every > 1:
            return (f"A scanned stack repeats one layer, and {path}.every > 1 mixes dense and "
                    "sparse layers; use numerics.scan_layers=False or experts.every=1.")
        if self.dispatch == "capacity" and not self.capacity_factor > 0:
            return f"{path}.capacity_factor={self.capacity_factor} must be positive."
        return ""


@section
class ModelSpec(Section):
    """What every family's model spec has: ``family`` (which plug-in builds it), the
    ``variant`` it is (``llama``, ``qwen2``, ``gemma2``, ...; export reads it, "" for a
    model of this framework's own layout), the vocabulary's size, dropout and numerics.

    Class attributes a family sets: ``FAMILY``; ``DEFAULTS``, the family's values of
    shared keys (nested dicts for sections); ``SECTIONS``, its classes of the shared
    sections; ``VARIANTS``, the architectures it records."""

    family: str
    variant: str = ""
    vocab_size: int = field(minimum=1)
    dropout_rate: float = field(minimum=0.0)
    numerics: Numerics = field(Numerics())

    FAMILY: ClassVar[str] = ""
    DEFAULTS: ClassVar[Mapping] = {}
    SECTIONS: ClassVar[Mapping[str, type]] = {}
    VARIANTS: ClassVar[tuple[str, ...]] = ()
    #: a config file that starts this family (named when a key belongs to another family)
    EXAMPLE_CONFIG: ClassVar[str] = ""
    #: how the family's sequence splits over a ``mesh.context`` axis: "" not at all (the
    #: run is refused), "causal" (decoders: rows load-balanced, ``context_parallel``) or
    #: "bidirectional" (encoders)
    CONTEXT_PARALLEL: ClassVar[str] = ""
    #: whether the family's one scanned stack runs as a pipeline over a ``mesh.stage`` axis
    #: (``models/pipeline_parallel.py``); encoder-decoders' two stacks would be two pipelines
    PIPELINE: ClassVar[bool] = False

    def pipeline_refusal(self) -> str:
        """Why this model cannot run as a pipeline ("" if it can), beyond ``PIPELINE``."""
        return ""

    def context_refusal(self) -> str:
        """Why this model cannot split its sequence over a context axis ("" if it can),
        beyond its family's ``CONTEXT_PARALLEL``: a switch of its own."""
        return ""

    @classmethod
    def unknown_key_hint(cls, key: str) -> str:
        example = f" (e.g. --config={cls.EXAMPLE_CONFIG})" if cls.EXAMPLE_CONFIG else ""
        return (f"model.family={cls.FAMILY!r} has no such key; the model section holds another "
                "family's keys: if you changed model.family on the command line, start from a "
                f"config written for that family instead{example}.")

    @classmethod
    def sub_section(cls, name: str, value: Mapping):
        return cls.SECTIONS.get(name) or cls.section_type(name)

    @classmethod
    def defaults(cls) -> dict:
        return deep_merge({**super().defaults(), "family": cls.FAMILY}, cls.DEFAULTS)

    @classmethod
    def from_mapping(cls, data: Mapping, path: str = "model"):
        return super().from_mapping(deep_merge(cls.defaults(), data), path)

    @property
    def compute_dtype(self) -> str:
        """The dtype name activations are computed in (``jnp.dtype`` takes it)."""
        return self.numerics.dtype

    def check(self, path: str) -> None:
        require(self.family == self.FAMILY, f"{path}.family={self.family!r} is built by "
                                            f"another spec than {type(self).__name__}.")
        require(not self.variant or self.variant in self.VARIANTS,
                f"{path}.variant={self.variant!r} is not one of model.family={self.family!r}'s "
                f"variants {self.VARIANTS} (or '' for this framework's own layout).")
        for activation in getattr(self, "mlp_activations", ()):
            require(activation in MLP_ACTIVATIONS,
                    f"{path}.mlp_activations has {activation!r}; use some of {MLP_ACTIVATIONS}.")

    def check_run(self, run) -> None:
        """The family's checks against the rest of the run (its task lengths, head, packing,
        PEFT); ``ConfigError``s name the key and the fix."""

    def depth(self) -> int:
        """The layers of the deepest stack (for the experts' and scan checks)."""
        return 0

    @property
    def expert_count(self) -> int:
        """Experts per sparse layer (0: a dense model, or a family without experts)."""
        return 0


@section
class TransformerSpec(ModelSpec):
    """The transformer dimensions every transformer family writes once."""

    d_model: int = field(minimum=1)
    num_heads: int = field(minimum=1)
    head_dim: int = field(minimum=1)
    d_ff: int = field(minimum=1)
    mlp_activations: tuple[str, ...] = field(minimum=None)
    layer_norm_epsilon: float = field(minimum=0.0)
    # Each family's own class of these (``SECTIONS``): a decoder's attention has windows
    # and grouped heads, T5's positions are relative buckets.
    attention: Attention
    positions: Positions


@section
class WithExperts(Section):
    """Families whose MLPs may be mixtures of experts."""

    experts: Experts = field(Experts())

    @property
    def expert_count(self) -> int:
        return self.experts.num_experts

    def check_experts(self, path: str) -> None:
        problem = self.experts.problem(self.depth(), self.numerics.scan_layers,
                                       join(path, "experts"))
        require(not problem, problem)


@section
class OneStack(Section):
    """Families with one stack of layers."""

    num_layers: int = field(minimum=1)

    def depth(self) -> int:
        return self.num_layers


@section
class TwoStacks(Section):
    """Encoder-decoders: an encoder and a decoder stack."""

    num_encoder_layers: int = field(minimum=1)
    num_decoder_layers: int = field(minimum=1)

    def depth(self) -> int:
        return min(self.num_encoder_layers, self.num_decoder_layers)


@section
class Padded(Section):
    """Families that mask a padding id of their own (BART pads with 1)."""

    pad_id: int = field(0, minimum=0)


def deep_merge(base: Mapping, update: Mapping) -> dict:
    """``base`` with ``update`` over it, section by section."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
