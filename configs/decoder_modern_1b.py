"""A modern 1.1B decoder (TinyLlama's shape): rotary positions, RMSNorm, SwiGLU, no biases,
grouped-query attention (32 query heads over 4 key/value heads), untied output; scanned
layers with remat so the compile stays small and activations fit.

    python -m t5x_like.summary --config=configs/decoder_modern_1b.py
    python -m t5x_like.train --config=configs/decoder_modern_1b.py --workdir=runs/decoder_modern_1b
    python -m t5x_like.convert import --hf_dir=path/to/TinyLlama-1.1B --out=converted/tinyllama
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    model = config.model
    model.vocab_size = 32000
    model.d_model = 2048
    model.num_heads = 32
    model.num_kv_heads = 4
    model.head_dim = 64
    model.d_ff = 5632
    model.num_layers = 22
    model.max_length = 2048
    model.mlp_activations = ("silu", "linear")
    model.use_bias = False
    model.norm = "rmsnorm"
    model.layer_norm_epsilon = 1e-5
    model.position_embedding = "rotary"
    model.tie_embeddings = False
    model.scan_layers = True
    model.remat_policy = "dots_no_batch"
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 2048}
    config.batch_size = 512
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 4e-4
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 2000
    config.optimizer.weight_decay = 0.1
    config.optimizer.b2 = 0.95
    return config
