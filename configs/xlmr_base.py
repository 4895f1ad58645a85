"""XLM-R base (about 270M parameters, 192M of them the 250k-piece embedding): RoBERTa's
network (12 layers, 768 wide) on a 250,002-piece SentencePiece vocabulary, masked LM over
100 languages sampled q_i ∝ p_i^0.3 (Conneau et al. 2020).

    python -m t5x_like.summary --config=configs/xlmr_base.py
    python -m t5x_like.train --config=configs/xlmr_base.py --workdir=runs/xlmr_base
    python -m t5x_like.convert import --hf_dir=path/to/xlm-roberta-base --out=converted/xlmr_base

Pretraining here runs the embedded multilingual mixture (``multilingual_mlm``) on its 8k
vocabulary, so give ``--config.model.vocab_size=8192`` (or import the published
checkpoint and its tokenizer); the 250,002 rows are the published model's.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
_roberta_base = bases.config_file("roberta_base")


def get_config():
    """RoBERTa base's network and recipe on XLM-R's vocabulary and multilingual mixture."""
    config = _roberta_base.get_config()
    config.model.variant = "xlm-roberta"
    config.model.vocab_size = 250002
    config.task = "multilingual_mlm"
    return config
