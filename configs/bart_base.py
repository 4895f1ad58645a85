"""BART base (about 139M parameters): post-LayerNorm encoder-decoder with learned positions,
GELU, biases and an output tied to the shared embedding.

    python -m t5x_like.summary --config=configs/bart_base.py
    python -m t5x_like.train --config=configs/bart_base.py --workdir=runs/bart_base
    python -m t5x_like.convert import --hf_dir=path/to/bart-base --out=converted/bart_base
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
bart = bases.family("bart")


def get_config():
    return bart.base(d_model=768, num_heads=12, d_ff=3072, num_encoder_layers=6, num_decoder_layers=6)
