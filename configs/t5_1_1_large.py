"""T5 v1.1 large (about 783M parameters): gated-GELU MLP, separate output projection (v1.1).

    python -m t5x_like.summary --config=configs/t5_1_1_large.py
    python -m t5x_like.train --config=configs/t5_1_1_large.py --workdir=runs/t5_1_1_large
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
t5 = bases.family("t5")


def get_config():
    return t5.base(d_model=1024, num_heads=16, d_ff=2816, num_encoder_layers=24, num_decoder_layers=24)
