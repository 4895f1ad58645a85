"""GPT-2 medium (about 355M parameters): learned positions, pre-LayerNorm, GELU MLP, tied output.

    python -m t5x_like.summary --config=configs/gpt2_medium.py
    python -m t5x_like.train --config=configs/gpt2_medium.py --workdir=runs/gpt2_medium
    python -m t5x_like.convert import --hf_dir=path/to/gpt2-medium --out=converted/gpt2_medium
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
gpt2 = bases.family("gpt2")


def get_config():
    return gpt2.base(d_model=1024, num_heads=16, d_ff=4096, num_layers=24)
