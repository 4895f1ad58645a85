"""A modern 1.1B decoder (TinyLlama's shape): rotary positions, RMSNorm, SwiGLU, no biases,
grouped-query attention (32 query heads over 4 key/value heads), untied output; scanned
layers with remat so the compile stays small and activations fit.

    python -m t5x_like.summary --config=configs/decoder_modern_1b.py
    python -m t5x_like.train --config=configs/decoder_modern_1b.py --workdir=runs/decoder_modern_1b
    python -m t5x_like.convert import --hf_dir=path/to/TinyLlama-1.1B --out=converted/tinyllama
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
gpt2 = bases.family("gpt2")


def get_config():
    config = gpt2.base(variant="llama", vocab_size=32000, d_model=2048, num_heads=32, d_ff=5632,
                       num_layers=22, mlp_activations=("silu", "linear"), use_bias=False,
                       norm="rmsnorm", layer_norm_epsilon=1e-5, tie_embeddings=False,
                       attention=dict(num_kv_heads=4),
                       positions=dict(kind="rotary", max_length=2048),
                       numerics=dict(scan_layers=True, remat_policy="dots_no_batch"))
    config.optimizer.update(name="adamw", learning_rate=4e-4, schedule="cosine", warmup_steps=2000,
                            weight_decay=0.1, b2=0.95)
    return config
