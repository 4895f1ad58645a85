"""The published sizes of the open decoder families as presets of the one decoder:
Llama 3.1/3.2, Qwen2.5, Qwen3, Gemma 2, Gemma 3 (text). Each is the shape of the Hugging
Face checkpoint (its config.json's switches: biases, norms, soft-caps, layer types,
RoPE and its scaling), so ``convert import`` of that checkpoint loads into it, and
``summary`` counts what transformers counts (``tests/test_open_decoder_presets.py``).

    python -m t5x_like.summary --config=configs/open_decoders.py:qwen3-8b
    python -m t5x_like.plan --config=configs/open_decoders.py:llama-3.1-8b --topology=v5p:2x2x1
    python -m t5x_like.train --config=configs/open_decoders.py:gemma-3-1b \\
        --config.init_from=converted/gemma-3-1b --workdir=runs/gemma3_ft

Training defaults: the modern decoder's (AdamW, cosine, bf16 activations, scanned layers
where every layer is alike; Gemma's alternating layers run as a loop).
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
gpt2 = bases.family("gpt2")

def _merged(*parts: dict) -> dict:
    """The parts' model keys, later over earlier, section by section."""
    out = {}
    for part in parts:
        for key, value in part.items():
            out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(
                out.get(key), dict) else value
    return out


def _rope(**keys):
    return dict(positions=dict(kind="rotary", rope=keys))


_MODERN = _merged(dict(mlp_activations=("silu", "linear"), use_bias=False, norm="rmsnorm",
                       layer_norm_epsilon=1e-5), _rope())
_LLAMA = _merged(_MODERN, _rope(max_wavelength=500_000.0, scaling="llama3", low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_length=8192),
                 dict(variant="llama", vocab_size=128_256, head_dim=128, bos_id=128_000,
                      positions=dict(max_length=131_072), attention=dict(num_kv_heads=8)))
_QWEN = _merged(_MODERN, _rope(max_wavelength=1_000_000.0),
                dict(layer_norm_epsilon=1e-6, vocab_size=151_936, bos_id=151_643))
_GEMMA = _merged(_rope(), dict(norm="rmsnorm", use_bias=False, mlp_activations=("gelu", "linear"),
                               layer_norm_epsilon=1e-6, post_sublayer_norms=True,
                               scale_embeddings=True, tie_embeddings=True, bos_id=2))


def _alternating(num_layers: int, every: int) -> tuple[str, ...]:
    """Gemma's layer types: each ``every``-th layer full, the rest sliding."""
    return tuple("full_attention" if (i + 1) % every == 0 else "sliding_attention"
                 for i in range(num_layers))


def _shape(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim, max_length):
    return dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                head_dim=head_dim, attention=dict(num_kv_heads=num_kv_heads),
                positions=dict(max_length=max_length))


def _gemma2(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim, scalar):
    return _merged(_GEMMA, _shape(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim,
                                  8192), _rope(max_wavelength=10_000.0),
                   dict(variant="gemma2", vocab_size=256_000, final_logit_softcap=30.0,
                        attention=dict(query_pre_scalar=scalar, sliding_window=4096,
                                       layer_types=_alternating(num_layers, 2),
                                       logit_softcap=50.0)))


def _gemma3(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim, scalar, window=1024,
            vocab_size=262_208, max_length=131_072, rope_factor=8.0):
    scaled = dict(scaling="linear", factor=rope_factor) if rope_factor != 1.0 else {}
    return _merged(_GEMMA, _shape(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim,
                                  max_length),
                   _rope(max_wavelength=1_000_000.0, local_max_wavelength=10_000.0, **scaled),
                   dict(variant="gemma3_text", vocab_size=vocab_size,
                        attention=dict(query_pre_scalar=scalar, sliding_window=window,
                                       layer_types=_alternating(num_layers, 6), qk_norm=True)))


def _qwen(variant, d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim, max_length,
          tie_embeddings, **more):
    attention = dict(qkv_bias=True) if variant == "qwen2" else dict(qk_norm=True)
    return _merged(_QWEN, _shape(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim,
                                 max_length),
                   dict(variant=variant, tie_embeddings=tie_embeddings, attention=attention),
                   more)


def _llama(d_model, d_ff, num_layers, num_heads, rope_factor, tie_embeddings, head_dim=128):
    return _merged(_LLAMA, dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                                num_heads=num_heads, head_dim=head_dim,
                                tie_embeddings=tie_embeddings),
                   _rope(factor=rope_factor))


PRESETS = {
    # Llama 3.1 (128K context by the llama3 RoPE rescaling) and 3.2 (tied, factor 32).
    "llama-3.1-8b": _llama(4096, 14_336, 32, 32, 8.0, False),
    "llama-3.1-70b": _llama(8192, 28_672, 80, 64, 8.0, False),
    "llama-3.1-405b": _llama(16_384, 53_248, 126, 128, 8.0, False),
    "llama-3.2-1b": _llama(2048, 8192, 16, 32, 32.0, True, head_dim=64),
    "llama-3.2-3b": _llama(3072, 8192, 28, 24, 32.0, True),
    # Qwen2.5: biases on q/k/v, 64-wide heads.
    "qwen2.5-0.5b": _qwen("qwen2", 896, 4864, 24, 14, 2, 64, 32_768, True),
    "qwen2.5-1.5b": _qwen("qwen2", 1536, 8960, 28, 12, 2, 128, 32_768, True),
    "qwen2.5-7b": _qwen("qwen2", 3584, 18_944, 28, 28, 4, 128, 32_768, False,
                        vocab_size=152_064),
    # Qwen3: per-head q/k RMSNorm, no biases, 128-wide heads.
    "qwen3-0.6b": _qwen("qwen3", 1024, 3072, 28, 16, 8, 128, 40_960, True),
    "qwen3-1.7b": _qwen("qwen3", 2048, 6144, 28, 16, 8, 128, 40_960, True),
    "qwen3-4b": _qwen("qwen3", 2560, 9728, 36, 32, 8, 128, 40_960, True),
    "qwen3-8b": _qwen("qwen3", 4096, 12_288, 36, 32, 8, 128, 40_960, False),
    # Gemma 2: soft-capped logits, local/global layers alternating.
    "gemma-2-2b": _gemma2(2304, 9216, 26, 8, 4, 256, 256),
    "gemma-2-9b": _gemma2(3584, 14_336, 42, 16, 8, 256, 256),
    "gemma-2-27b": _gemma2(4608, 36_864, 46, 32, 16, 128, 144),
    # Gemma 3 (text): q/k norms, five local layers to one global.
    "gemma-3-1b": _gemma3(1152, 6912, 26, 4, 1, 256, 256, window=512, vocab_size=262_144,
                          max_length=32_768, rope_factor=1.0),
    "gemma-3-4b": _gemma3(2560, 10_240, 34, 8, 4, 256, 256),
    "gemma-3-12b": _gemma3(3840, 15_360, 48, 16, 8, 256, 256),
    "gemma-3-27b": _gemma3(5376, 21_504, 62, 32, 16, 128, 168),
}


def get_config(name: str = "qwen3-0.6b"):
    if name not in PRESETS:
        raise ValueError(f"no preset {name!r}; choose one of {', '.join(PRESETS)}")
    model = PRESETS[name]
    alike = len(set(model["attention"].get("layer_types", ()))) <= 1
    config = gpt2.base(**model, numerics=dict(scan_layers=alike, dtype="bfloat16",
                                              remat_policy="dots_no_batch" if alike else "none"))
    config.task_feature_lengths = {"targets": 2048}
    config.batch_size = 256
    config.optimizer.update(name="adamw", learning_rate=3e-4, schedule="cosine", warmup_steps=2000,
                            weight_decay=0.1, b2=0.95)
    return config
