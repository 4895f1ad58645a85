"""T5 v1.1 base (about 248M parameters): gated-GELU MLP, separate output projection (v1.1).

    python -m t5x_like.summary --config=configs/t5_1_1_base.py
    python -m t5x_like.train --config=configs/t5_1_1_base.py --workdir=runs/t5_1_1_base
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
t5 = bases.family("t5")


def get_config():
    return t5.base(d_model=768, num_heads=12, d_ff=2048, num_encoder_layers=12, num_decoder_layers=12)
