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

_MODERN = dict(mlp_activations=("silu", "linear"), use_bias=False, norm="rmsnorm",
               position_embedding="rotary", layer_norm_epsilon=1e-5)
_LLAMA3_ROPE = dict(rotary_max_wavelength=500_000.0, rope_type="llama3", rope_low_freq_factor=1.0,
                    rope_high_freq_factor=4.0, rope_original_max_length=8192)
_LLAMA = dict(_MODERN, **_LLAMA3_ROPE, vocab_size=128_256, max_length=131_072, num_kv_heads=8,
              head_dim=128, bos_id=128_000)
_QWEN = dict(_MODERN, layer_norm_epsilon=1e-6, rotary_max_wavelength=1_000_000.0,
             vocab_size=151_936, bos_id=151_643)
_GEMMA = dict(norm="rmsnorm", use_bias=False, mlp_activations=("gelu", "linear"),
              position_embedding="rotary", layer_norm_epsilon=1e-6, post_sublayer_norms=True,
              scale_embeddings=True, tie_embeddings=True, bos_id=2)


def _alternating(num_layers: int, every: int) -> tuple[str, ...]:
    """Gemma's layer types: each ``every``-th layer full, the rest sliding."""
    return tuple("full_attention" if (i + 1) % every == 0 else "sliding_attention"
                 for i in range(num_layers))


def _gemma2(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim, scalar):
    return dict(_GEMMA, vocab_size=256_000, max_length=8192, d_model=d_model, d_ff=d_ff,
                num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, query_pre_attention_scalar=scalar, sliding_window=4096,
                layer_types=_alternating(num_layers, 2), attention_logit_softcap=50.0,
                final_logit_softcap=30.0, rotary_max_wavelength=10_000.0)


def _gemma3(d_model, d_ff, num_layers, num_heads, num_kv_heads, head_dim, scalar, window=1024,
            vocab_size=262_208, max_length=131_072, rope_factor=8.0):
    scaled = dict(rope_type="linear", rope_factor=rope_factor) if rope_factor != 1.0 else {}
    return dict(_GEMMA, vocab_size=vocab_size, max_length=max_length, d_model=d_model, d_ff=d_ff,
                num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, query_pre_attention_scalar=scalar, sliding_window=window,
                layer_types=_alternating(num_layers, 6), qk_norm=True,
                rotary_max_wavelength=1_000_000.0, local_rotary_max_wavelength=10_000.0, **scaled)


PRESETS = {
    # Llama 3.1 (128K context by the llama3 RoPE rescaling) and 3.2 (tied, factor 32).
    "llama-3.1-8b": dict(_LLAMA, d_model=4096, d_ff=14_336, num_layers=32, num_heads=32,
                         rope_factor=8.0, tie_embeddings=False),
    "llama-3.1-70b": dict(_LLAMA, d_model=8192, d_ff=28_672, num_layers=80, num_heads=64,
                          rope_factor=8.0, tie_embeddings=False),
    "llama-3.2-1b": dict(_LLAMA, d_model=2048, d_ff=8192, num_layers=16, num_heads=32,
                         head_dim=64, rope_factor=32.0, tie_embeddings=True),
    "llama-3.2-3b": dict(_LLAMA, d_model=3072, d_ff=8192, num_layers=28, num_heads=24,
                         rope_factor=32.0, tie_embeddings=True),
    # Qwen2.5: biases on q/k/v, 64-wide heads.
    "qwen2.5-0.5b": dict(_QWEN, qkv_bias=True, d_model=896, d_ff=4864, num_layers=24,
                         num_heads=14, num_kv_heads=2, head_dim=64, max_length=32_768,
                         tie_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN, qkv_bias=True, d_model=1536, d_ff=8960, num_layers=28,
                         num_heads=12, num_kv_heads=2, head_dim=128, max_length=32_768,
                         tie_embeddings=True),
    "qwen2.5-7b": dict(_QWEN, qkv_bias=True, vocab_size=152_064, d_model=3584, d_ff=18_944,
                       num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                       max_length=32_768, tie_embeddings=False),
    # Qwen3: per-head q/k RMSNorm, no biases, 128-wide heads.
    "qwen3-0.6b": dict(_QWEN, qk_norm=True, d_model=1024, d_ff=3072, num_layers=28,
                       num_heads=16, num_kv_heads=8, head_dim=128, max_length=40_960,
                       tie_embeddings=True),
    "qwen3-1.7b": dict(_QWEN, qk_norm=True, d_model=2048, d_ff=6144, num_layers=28,
                       num_heads=16, num_kv_heads=8, head_dim=128, max_length=40_960,
                       tie_embeddings=True),
    "qwen3-4b": dict(_QWEN, qk_norm=True, d_model=2560, d_ff=9728, num_layers=36,
                     num_heads=32, num_kv_heads=8, head_dim=128, max_length=40_960,
                     tie_embeddings=True),
    "qwen3-8b": dict(_QWEN, qk_norm=True, d_model=4096, d_ff=12_288, num_layers=36,
                     num_heads=32, num_kv_heads=8, head_dim=128, max_length=40_960,
                     tie_embeddings=False),
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
    model = dict(PRESETS[name])
    alike = len(set(model.get("layer_types", ()))) <= 1
    config = gpt2.base(**model, scan_layers=alike, remat_policy="dots_no_batch" if alike else "none",
                       dtype="bfloat16")
    config.task_feature_lengths = {"targets": 2048}
    config.batch_size = 256
    config.optimizer.update(name="adamw", learning_rate=3e-4, schedule="cosine", warmup_steps=2000,
                            weight_decay=0.1, b2=0.95)
    return config
