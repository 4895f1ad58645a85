"""T5 v1.1 large (about 783M parameters): gated-GELU MLP, separate output projection (v1.1).

    python -m t5x_like.summary --config=configs/t5_1_1_large.py
    python -m t5x_like.train --config=configs/t5_1_1_large.py --workdir=runs/t5_1_1_large
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.t5_pretraining_config()
    model = config.model
    model.d_model = 1024
    model.num_heads = 16
    model.head_dim = 64
    model.d_ff = 2816
    model.num_encoder_layers = 24
    model.num_decoder_layers = 24
    return config
