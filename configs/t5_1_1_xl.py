"""T5 v1.1 XL (about 2.85B parameters): gated-GELU MLP, separate output projection (v1.1).

    python -m t5x_like.summary --config=configs/t5_1_1_xl.py
    python -m t5x_like.plan --config=configs/t5_1_1_xl.py --topology=v5p:4x4x4
    python -m t5x_like.train --config=configs/t5_1_1_xl.py --workdir=runs/t5_1_1_xl
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
t5 = bases.family("t5")


def get_config():
    config = t5.base(d_model=2048, num_heads=32, d_ff=5120, num_encoder_layers=24, num_decoder_layers=24)
    bases.shard_fully(config)  # as T5X trains T5 v1.1: activations in bfloat16
    config.partitioning.rules = "fsdp"
    # One compiled layer per stack (compile time and host memory stay small) and
    # activations recomputed in the backward pass except matmul outputs.
    config.model.numerics.update(scan_layers=True, remat_policy="dots_no_batch")
    return config
