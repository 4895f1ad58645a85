"""The built-in families' model specs, and the table from ``model.family`` to a spec
class that a family plug-in (``t5x_like.families``) adds its own to.

Each spec lists only what is its family's own; the shared parts (``model_parts``)
come once, their family values in ``DEFAULTS``.
"""

from __future__ import annotations

from typing import ClassVar

from t5x_like.config.model_parts import (
    Attention,
    DecoderAttention,
    DecoderPositions,
    EncoderAttention,
    EncoderPositions,
    LearnedPositions,
    ModelSpec,
    OneStack,
    Padded,
    RelativePositions,
    TransformerSpec,
    TwoStacks,
    WithExperts,
    finite,
)
from t5x_like.config.sections import Section, field, require, section, suggest
from t5x_like.errors import ConfigError

# model.family -> its spec class; families.register adds a plug-in's.
MODEL_SPECS: dict[str, type[ModelSpec]] = {}


def register_model_spec(spec_class: type[ModelSpec]) -> None:
    """Makes ``model.family = spec_class.FAMILY`` build ``spec_class``."""
    if not (isinstance(spec_class, type) and issubclass(spec_class, ModelSpec)
            and spec_class.FAMILY):
        raise TypeError(f"{spec_class!r} is not a ModelSpec subclass with FAMILY set.")
    MODEL_SPECS[spec_class.FAMILY] = spec_class


def model_spec_class(family: str) -> type[ModelSpec]:
    if family not in MODEL_SPECS:
        raise ConfigError(f"Unknown model.family {family!r}; available: {sorted(MODEL_SPECS)}."
                          f"{suggest(str(family), MODEL_SPECS)} A family of your own registers "
                          "from your --module (t5x_like.families.register).")
    return MODEL_SPECS[family]


def _refuse_head(run, why: str) -> None:
    require(not run.head.kind, why)


@section
class T5Spec(TwoStacks, WithExperts, TransformerSpec):
    """T5 v1.0, v1.1 and mT5 encoder-decoders (``models/t5.py``)."""

    logits_via_embedding: bool = False

    FAMILY: ClassVar[str] = "encoder_decoder"
    EXAMPLE_CONFIG: ClassVar[str] = "quickstart"
    VARIANTS: ClassVar[tuple[str, ...]] = ("t5", "mt5", "switch_transformers")
    SECTIONS: ClassVar = {"attention": Attention, "positions": RelativePositions}
    DEFAULTS: ClassVar = dict(vocab_size=32128, d_model=512, num_heads=6, head_dim=64, d_ff=1024,
                              num_encoder_layers=8, num_decoder_layers=8, dropout_rate=0.0,
                              mlp_activations=("gelu", "linear"), layer_norm_epsilon=1e-6)

    def check(self, path):
        super().check(path)
        self.check_experts(path)

    def check_run(self, run):
        _refuse_head(run, f"head.kind={run.head.kind!r} needs an encoder or decoder body; "
                          f"model.family={self.family!r} is an encoder-decoder, which fine-tunes "
                          "text-to-text: set --config.head.kind=''.")


@section
class BartSpec(Padded, TwoStacks, WithExperts, TransformerSpec):
    """BART and mBART (``models/bart.py``): learned positions, post- or pre-LayerNorm."""

    scale_embedding: bool = False
    pre_norm: bool = False
    final_layer_norm: bool = False
    decoder_start_from_targets: bool = False
    eos_id: int = field(2, minimum=0)
    decoder_start_id: int = field(2, minimum=0)

    FAMILY: ClassVar[str] = "bart"
    EXAMPLE_CONFIG: ClassVar[str] = "bart_base"
    VARIANTS: ClassVar[tuple[str, ...]] = ("bart", "mbart")
    SECTIONS: ClassVar = {"attention": Attention, "positions": LearnedPositions}
    DEFAULTS: ClassVar = dict(vocab_size=50265, d_model=768, num_heads=12, head_dim=64, d_ff=3072,
                              num_encoder_layers=6, num_decoder_layers=6, dropout_rate=0.0,
                              mlp_activations=("gelu_exact",), layer_norm_epsilon=1e-5,
                              pad_id=1, positions=dict(max_length=1024))

    def check(self, path):
        super().check(path)
        self.check_experts(path)

    check_run = T5Spec.check_run


@section
class DecoderSpec(OneStack, WithExperts, TransformerSpec):
    """GPT-2 by default; Llama, Mistral, Qwen2/3, Gemma 2/3 and Mixtral by their switches
    (``models/decoder.py``; presets: ``configs/open_decoders.py``)."""

    use_bias: bool = True
    norm: str = field("layernorm", choices=("layernorm", "rmsnorm"))
    tie_embeddings: bool = True
    post_sublayer_norms: bool = False
    scale_embeddings: bool = False
    final_logit_softcap: float = field(0.0, minimum=0.0)
    bos_id: int = field(-1, minimum=-1, doc=(
        "the first input of every sequence; -1: decided when a run starts (a resume or "
        "init_from keeps the checkpoint's, a new run takes its vocabulary's BOS, else its "
        "EOS: never the pad id, which transformers' generate and TRL mask)"))

    FAMILY: ClassVar[str] = "decoder"
    EXAMPLE_CONFIG: ClassVar[str] = "pretrain/gpt2_tiny"
    VARIANTS: ClassVar[tuple[str, ...]] = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2",
                                           "gemma3_text", "mixtral", "qwen2_moe")
    SECTIONS: ClassVar = {"attention": DecoderAttention, "positions": DecoderPositions}
    CONTEXT_PARALLEL: ClassVar[str] = "causal"
    PIPELINE: ClassVar[bool] = True
    DEFAULTS: ClassVar = dict(vocab_size=50257, d_model=768, num_heads=12, head_dim=64, d_ff=3072,
                              num_layers=12, dropout_rate=0.0, mlp_activations=("gelu",),
                              layer_norm_epsilon=1e-5, positions=dict(max_length=1024))

    def check(self, path):
        super().check(path)
        types = self.attention.layer_types
        require(not types or len(types) == self.num_layers,
                f"{path}.attention.layer_types names {len(types)} layers; the model has "
                f"num_layers={self.num_layers}.")
        require(not (self.numerics.scan_layers and len(set(types)) > 1),
                f"A scanned stack repeats one layer, and {path}.attention.layer_types mixes "
                "sliding and full attention; use numerics.scan_layers=False.")
        self.check_experts(path)

    def check_run(self, run):
        require(not (run.head.kind in ("classification", "regression")
                     and run.head.pooling == "cls"),
                "A decoder's first token has seen nothing but itself; pool a decoder body at "
                "its last token: --config.head.pooling=last.")

    @property
    def rotary(self) -> bool:
        return self.positions.kind == "rotary"

    def context_refusal(self) -> str:
        if self.attention.logit_softcap:
            return ("attention.logit_softcap (Gemma 2) is not built into context-parallel "
                    "attention; set --config.model.attention.logit_softcap=0 or mesh.context=1")
        return ""


@section
class EncoderSpec(Padded, OneStack, WithExperts, TransformerSpec):
    """BERT, RoBERTa, ALBERT, SpanBERT, DistilBERT, XLM-R and Longformer
    (``models/encoder.py``)."""

    type_vocab_size: int = field(2, minimum=0)
    next_sentence_head: bool = True
    embedding_dim: int = field(0, minimum=0, doc="ALBERT's factorised embeddings; 0: d_model")
    share_layers: bool = False
    span_boundary_head: bool = False
    max_span_length: int = field(10, minimum=1)

    FAMILY: ClassVar[str] = "encoder"
    EXAMPLE_CONFIG: ClassVar[str] = "pretrain/bert_tiny"
    VARIANTS: ClassVar[tuple[str, ...]] = ("bert", "roberta", "xlm-roberta", "albert",
                                           "distilbert", "longformer")
    SECTIONS: ClassVar = {"attention": EncoderAttention, "positions": EncoderPositions}
    CONTEXT_PARALLEL: ClassVar[str] = "bidirectional"
    PIPELINE: ClassVar[bool] = True
    DEFAULTS: ClassVar = dict(vocab_size=30522, d_model=768, num_heads=12, head_dim=64, d_ff=3072,
                              num_layers=12, dropout_rate=0.0, mlp_activations=("gelu_exact",),
                              layer_norm_epsilon=1e-12, positions=dict(max_length=512))

    def check(self, path):
        super().check(path)
        self.check_experts(path)
        require(not (self.experts.num_experts and self.share_layers and self.experts.every > 1),
                f"{path}.share_layers repeats one layer, and {path}.experts.every > 1 mixes "
                "dense and sparse layers; use experts.every=1 or share_layers=False.")

    def pipeline_refusal(self) -> str:
        if self.share_layers:
            return ("share_layers (ALBERT) applies one layer repeatedly, which has no layers "
                    "to split over stages; set --config.mesh.stage=1")
        return ""

    def context_refusal(self) -> str:
        if self.attention.global_tokens:
            return ("Longformer's global tokens attend across the whole row, which context-"
                    "parallel attention does not build; use its local window with mesh.context=1")
        return ""


@section
class GeneratorTower(Section):
    """ELECTRA's generator tower (``d_model=0``: none, a discriminator alone)."""

    d_model: int = field(64, minimum=0)
    num_heads: int = field(1, minimum=1)
    head_dim: int = field(64, minimum=1)
    d_ff: int = field(256, minimum=1)
    num_layers: int = field(12, minimum=1)


@section
class ElectraSpec(Padded, OneStack, TransformerSpec):
    """ELECTRA's generator and discriminator on shared embeddings (``models/electra.py``);
    the shared dimensions are the discriminator's."""

    embedding_dim: int = field(128, minimum=0)
    generator: GeneratorTower = field(GeneratorTower())
    discriminator_loss_weight: float = field(50.0, minimum=0.0)
    sampling_temperature: float = 1.0
    max_predictions_per_seq: int = field(0, minimum=0, doc="0: sample every masked position")
    type_vocab_size: int = field(2, minimum=0)

    FAMILY: ClassVar[str] = "electra"
    EXAMPLE_CONFIG: ClassVar[str] = "pretrain/electra_tiny"
    VARIANTS: ClassVar[tuple[str, ...]] = ("electra",)
    SECTIONS: ClassVar = {"attention": Attention, "positions": LearnedPositions}
    DEFAULTS: ClassVar = dict(vocab_size=30522, d_model=256, num_heads=4, head_dim=64, d_ff=1024,
                              num_layers=12, dropout_rate=0.0, mlp_activations=("gelu_exact",),
                              layer_norm_epsilon=1e-12, positions=dict(max_length=512))

    def check(self, path):
        super().check(path)
        require(finite(self.sampling_temperature) and self.sampling_temperature > 0,
                f"{path}.sampling_temperature={self.sampling_temperature} must be a finite "
                "number > 0 (1.0 samples from the generator's own distribution).")

    def check_run(self, run):
        require(self.generator.d_model or run.head.kind,
                "model.generator.d_model=0: this ELECTRA is a discriminator without a generator, "
                "which fine-tunes (set head.kind) but cannot pretrain. Give it a generator, e.g. "
                "--config.model.generator.d_model=64 (a quarter of the discriminator's width), "
                "or import one with convert import --generator_dir=...")

    @property
    def has_generator(self) -> bool:
        return self.generator.d_model > 0

    @property
    def embedding_width(self) -> int:
        return self.embedding_dim or self.d_model


@section
class BilmSpec(Padded, ModelSpec):
    """ELMo's biLM: a character CNN, forward and backward LSTMs (``models/bilm.py``)."""

    char_vocabulary: str = field("embedded", choices=("embedded", ""),
                                 doc="'embedded': the embedded SentencePiece's pieces; '': bytes")
    max_chars: int = field(50, minimum=1)
    char_embed_dim: int = field(16, minimum=1)
    filter_widths: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
    filter_counts: tuple[int, ...] = (32, 32, 64, 128, 256, 512, 1024)
    num_highway: int = field(2, minimum=0)
    projection_dim: int = field(512, minimum=1)
    lstm_dim: int = field(4096, minimum=1)
    num_layers: int = field(2, minimum=1)
    cell_clip: float = 3.0
    proj_clip: float = 3.0
    eos_id: int = field(1, minimum=0)

    FAMILY: ClassVar[str] = "bilm"
    EXAMPLE_CONFIG: ClassVar[str] = "pretrain/elmo_tiny"
    VARIANTS: ClassVar[tuple[str, ...]] = ("elmo",)
    DEFAULTS: ClassVar = dict(vocab_size=8192, dropout_rate=0.1)

    def check(self, path):
        super().check(path)
        widths, counts = self.filter_widths, self.filter_counts
        require(widths and len(widths) == len(counts),
                f"{path}.filter_widths={widths} and {path}.filter_counts={counts} must be "
                "non-empty and of equal length (one count per convolution width).")
        require(max(widths) <= self.max_chars,
                f"{path}.max_chars={self.max_chars} is shorter than the widest filter "
                f"({max(widths)}); raise max_chars.")
        require(not self.numerics.scan_layers and self.numerics.remat_policy == "none",
                f"{path}.numerics: the biLM's LSTMs are neither scanned nor rematerialised; set "
                "scan_layers=False and remat_policy='none'.")

    def check_run(self, run):
        require(not run.data.pack,
                "model.family='bilm' reads unpacked, right-padded rows (its backward LSTM "
                "reverses each row within its length, and packed segments would leak state "
                "across examples); set --config.data.pack=False.")
        require("inputs" not in run.task_feature_lengths,
                "model.family='bilm' is a language model over one sequence; give it a task "
                "with 'targets' only (e.g. --config.task=embedded_en_lm), not inputs and "
                "targets.")
        _refuse_head(run, "model.family='bilm' has no fine-tuning heads; use its features "
                          "(benchmarks/elmo_scalar_mix.py) and set --config.head.kind=''.")

    def depth(self) -> int:
        return self.num_layers


for _spec in (T5Spec, BartSpec, DecoderSpec, EncoderSpec, ElectraSpec, BilmSpec):
    register_model_spec(_spec)
