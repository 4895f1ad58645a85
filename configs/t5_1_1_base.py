"""T5 v1.1 base (about 248M parameters): gated-GELU MLP, separate output projection (v1.1).

    python -m t5x_like.summary --config=configs/t5_1_1_base.py
    python -m t5x_like.train --config=configs/t5_1_1_base.py --workdir=runs/t5_1_1_base
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.t5_pretraining_config()
    model = config.model
    model.d_model = 768
    model.num_heads = 12
    model.head_dim = 64
    model.d_ff = 2048
    model.num_encoder_layers = 12
    model.num_decoder_layers = 12
    return config
