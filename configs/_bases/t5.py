"""T5 v1.1 (Raffel et al. 2020; the v1.1 checkpoints): gated-GELU MLP, separate output
projection, 64-wide heads, on ``config_lib.t5_pretraining_config()`` (span corruption at
512/114, batch 128, Adafactor). The sizes (configs/t5_1_*.py) give their width, heads, MLP and
depth; v1.0 (``V1_0``) is a ReLU MLP with the output through the shared embedding scaled by
d_model**-0.5."""

from t5x_like import config_lib

V1_0 = dict(mlp_activations=("relu",), logits_via_embedding=True)


def base(**model):
    """T5's pretraining recipe on the encoder-decoder with ``model``'s keys."""
    config = config_lib.t5_pretraining_config()
    config.model.update(dict(variant="t5", head_dim=64))
    config.model.update(model)
    return config
