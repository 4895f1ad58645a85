"""T5 v1.1 small (about 77M parameters): gated-GELU MLP, separate output projection (v1.1).

    python -m t5x_like.summary --config=configs/t5_1_1_small.py
    python -m t5x_like.train --config=configs/t5_1_1_small.py --workdir=runs/t5_1_1_small
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.t5_pretraining_config()
    model = config.model
    model.d_model = 512
    model.num_heads = 6
    model.head_dim = 64
    model.d_ff = 1024
    model.num_encoder_layers = 8
    model.num_decoder_layers = 8
    return config
