"""Longformer base (Beltagy et al. 2020): RoBERTa base with local attention (a window of
512, 256 tokens each side) and global tokens that see and are seen by every token through
their own query/key/value projections; 4,096 positions. Memory grows linearly with the
length (``model.attention.impl="auto"`` computes the window in blocks).

    python -m t5x_like.summary --config=configs/longformer_base.py
    python -m t5x_like.plan --config=configs/longformer_base.py --topology=v5e:4x4
    python -m t5x_like.convert import --hf_dir=path/to/longformer-base-4096 --out=converted/longformer
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
_roberta_base = bases.config_file("roberta_base")


def get_config():
    config = _roberta_base.get_config()
    model = config.model
    model.variant = "longformer"
    model.positions.max_length = 4098  # 4,096 positions after RoBERTa's padding offset of 2
    model.attention.window = 257  # keys within 256 positions: Hugging Face's window of 512
    model.attention.global_tokens = True
    model.attention.max_global_tokens = 64
    config.task_feature_lengths = {"inputs": 4096}
    config.batch_size = 64
    return config
