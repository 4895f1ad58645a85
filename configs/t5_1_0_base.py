"""T5 v1.0 base (about 223M parameters): ReLU MLP, output through the shared embedding scaled by d_model**-0.5 (v1.0).

    python -m t5x_like.summary --config=configs/t5_1_0_base.py
    python -m t5x_like.train --config=configs/t5_1_0_base.py --workdir=runs/t5_1_0_base
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
t5 = bases.family("t5")


def get_config():
    return t5.base(d_model=768, num_heads=12, d_ff=3072, num_encoder_layers=12, num_decoder_layers=12, **t5.V1_0)
