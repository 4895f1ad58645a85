"""T5 v1.0 small (about 60.5M parameters): ReLU MLP, output through the shared embedding scaled by d_model**-0.5 (v1.0).

    python -m t5x_like.summary --config=configs/t5_1_0_small.py
    python -m t5x_like.train --config=configs/t5_1_0_small.py --workdir=runs/t5_1_0_small
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
t5 = bases.family("t5")


def get_config():
    return t5.base(d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6, num_decoder_layers=6, **t5.V1_0)
