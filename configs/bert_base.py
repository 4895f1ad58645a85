"""BERT base (about 110M parameters with its MLM and NSP heads): post-LayerNorm encoder.

    python -m t5x_like.summary --config=configs/bert_base.py
    python -m t5x_like.train --config=configs/bert_base.py --workdir=runs/bert_base
    python -m t5x_like.convert import --hf_dir=path/to/bert-base-uncased --out=converted/bert_base
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
bert = bases.family("bert")


def get_config():
    return bert.base(d_model=768, num_heads=12, d_ff=3072, num_layers=12)
