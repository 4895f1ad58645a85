"""GPT-2 medium (about 355M parameters): learned positions, pre-LayerNorm, GELU MLP, tied output.

    python -m t5x_like.summary --config=configs/gpt2_medium.py
    python -m t5x_like.train --config=configs/gpt2_medium.py --workdir=runs/gpt2_medium
    python -m t5x_like.convert import --hf_dir=path/to/gpt2-medium --out=converted/gpt2_medium
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    model = config.model
    model.vocab_size = 50257
    model.d_model = 1024
    model.num_heads = 16
    model.head_dim = 64
    model.d_ff = 4096
    model.num_layers = 24
    model.max_length = 1024
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 1024}
    config.batch_size = 512
    return config
