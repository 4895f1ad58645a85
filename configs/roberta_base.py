"""RoBERTa base (about 125M parameters with its MLM head): BERT's network, byte-level BPE
vocabulary, positions counted after the padding index, no next-sentence head.

    python -m t5x_like.summary --config=configs/roberta_base.py
    python -m t5x_like.train --config=configs/roberta_base.py --workdir=runs/roberta_base
    python -m t5x_like.convert import --hf_dir=path/to/roberta-base --out=converted/roberta_base
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
bert = bases.family("bert")


def get_config():
    config = bert.base(variant="roberta", vocab_size=50265, d_model=768, num_heads=12, d_ff=3072,
                       num_layers=12, positions=dict(max_length=514, offset=2),
                       type_vocab_size=1, pad_id=1, next_sentence_head=False,
                       layer_norm_epsilon=1e-5)
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 8192
    config.optimizer.update(learning_rate=6e-4, warmup_steps=24_000, b2=0.98)
    return config
