"""T5 v1.0 small (about 60.5M parameters): ReLU MLP, output through the shared embedding scaled by d_model**-0.5 (v1.0).

    python -m t5x_like.summary --config=configs/t5_1_0_small.py
    python -m t5x_like.train --config=configs/t5_1_0_small.py --workdir=runs/t5_1_0_small
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.t5_pretraining_config()
    model = config.model
    model.d_model = 512
    model.num_heads = 8
    model.head_dim = 64
    model.d_ff = 2048
    model.num_encoder_layers = 6
    model.num_decoder_layers = 6
    model.mlp_activations = ("relu",)
    model.logits_via_embedding = True
    return config
