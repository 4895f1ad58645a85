"""ALBERT base (about 12M parameters): 128-wide factorized embeddings projected to 768, one
block shared by all 12 layers, sentence-order head.

    python -m t5x_like.summary --config=configs/albert_base.py
    python -m t5x_like.train --config=configs/albert_base.py --workdir=runs/albert_base
    python -m t5x_like.convert import --hf_dir=path/to/albert-base-v2 --out=converted/albert_base
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
bert = bases.family("bert")


def get_config():
    config = bert.base(variant="albert", vocab_size=30000, embedding_dim=128, share_layers=True, d_model=768,
                       num_heads=12, d_ff=3072, num_layers=12,
                       mlp_activations=("gelu",))  # ALBERT's gelu_new (tanh approximation)
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 4096
    # AdamW: the paper's LAMB is not in optax's standard chains here.
    config.optimizer.update(learning_rate=1.76e-3, warmup_steps=3125)
    return config
