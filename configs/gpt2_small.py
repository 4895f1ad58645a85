"""GPT-2 small (about 124M parameters): learned positions, pre-LayerNorm, GELU MLP, tied output.

    python -m t5x_like.summary --config=configs/gpt2_small.py
    python -m t5x_like.train --config=configs/gpt2_small.py --workdir=runs/gpt2_small
    python -m t5x_like.convert import --hf_dir=path/to/gpt2-small --out=converted/gpt2_small
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    model = config.model
    model.vocab_size = 50257
    model.d_model = 768
    model.num_heads = 12
    model.head_dim = 64
    model.d_ff = 3072
    model.num_layers = 12
    model.max_length = 1024
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 1024}
    config.batch_size = 512
    return config
