"""T5 v1.1 XL (about 2.85B parameters): gated-GELU MLP, separate output projection (v1.1).

    python -m t5x_like.summary --config=configs/t5_1_1_xl.py
    python -m t5x_like.plan --config=configs/t5_1_1_xl.py --topology=v5p:4x4x4
    python -m t5x_like.train --config=configs/t5_1_1_xl.py --workdir=runs/t5_1_1_xl
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.t5_pretraining_config()
    model = config.model
    model.d_model = 2048
    model.num_heads = 32
    model.head_dim = 64
    model.d_ff = 5120
    model.num_encoder_layers = 24
    model.num_decoder_layers = 24
    # Activations in bfloat16, as T5X trains T5 v1.1 (parameters stay float32): half
    # the HBM traffic of float32 activations, and the MXU's native input type.
    model.dtype = "bfloat16"
    # Too large to replicate: shard parameters and optimizer state over all chips.
    config.mesh.data = 1
    config.mesh.fsdp = -1
    config.partitioning.rules = "fsdp"
    # One compiled layer per stack (compile time and host memory stay small) and
    # activations recomputed in the backward pass except matmul outputs.
    model.scan_layers = True
    model.remat_policy = "dots_no_batch"
    return config
