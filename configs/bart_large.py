"""BART large (about 406M parameters): BART base's layout, wider and twice as deep.

    python -m t5x_like.summary --config=configs/bart_large.py
    python -m t5x_like.train --config=configs/bart_large.py --workdir=runs/bart_large
    python -m t5x_like.convert import --hf_dir=path/to/bart-large --out=converted/bart_large
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bart_base", pathlib.Path(__file__).with_name("bart_base.py"))
_bart_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bart_base)


def get_config():
    config = _bart_base.get_config()
    model = config.model
    model.d_model = 1024
    model.num_heads = 16
    model.d_ff = 4096
    model.num_encoder_layers = 12
    model.num_decoder_layers = 12
    return config
