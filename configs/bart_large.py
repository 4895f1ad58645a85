"""BART large (about 406M parameters): BART base's layout, wider and twice as deep.

    python -m t5x_like.summary --config=configs/bart_large.py
    python -m t5x_like.train --config=configs/bart_large.py --workdir=runs/bart_large
    python -m t5x_like.convert import --hf_dir=path/to/bart-large --out=converted/bart_large
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
bart = bases.family("bart")


def get_config():
    return bart.base(d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=12, num_decoder_layers=12)
