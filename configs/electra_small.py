"""ELECTRA-Small (Clark et al. 2020): a 12-layer, 256-wide discriminator on 128-wide
shared embeddings, trained against a generator a quarter of its width.

The discriminator is 13,549,057 parameters (Hugging Face's count for
google/electra-small-discriminator; the paper rounds it to 14M); the generator adds
647,162 of its own (14.2M in all). Recipe of the paper's Table 6: sequences of 128, batch 128,
AdamW at 5e-4 with 10k warmup steps and linear decay, 15% masked, λ = 50.

    python -m t5x_like.summary --config=configs/electra_small.py
    python -m t5x_like.train --config=configs/electra_small.py --workdir=runs/electra_small
    python -m t5x_like.convert import --hf_dir=path/to/electra-small-discriminator \\
        --generator_dir=path/to/electra-small-generator --out=converted/electra_small
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
electra = bases.family("electra")


def get_config():
    config = electra.base(d_model=256, num_heads=4, d_ff=1024, embedding_dim=128,
                          generator=dict(d_model=64, num_heads=1, d_ff=256),
                          max_predictions_per_seq=19)
    config.task_feature_lengths = {"inputs": 128}
    config.batch_size = 128
    config.num_train_steps = 1_000_000
    config.optimizer.learning_rate = 5e-4
    return config
