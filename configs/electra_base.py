"""ELECTRA-Base (Clark et al. 2020): BERT-base's discriminator (768 wide, 12 layers,
no embedding projection) trained against a generator a third of its width.

The discriminator is 109,483,009 parameters with its replaced-token head (the
paper's 110M); the generator adds 9,903,418 in its own 256-wide tower. Recipe of the paper's
Table 6: sequences of 512, batch 256, AdamW at 2e-4 with 10k warmup steps, 766k
steps, 15% masked, λ = 50.

    python -m t5x_like.summary --config=configs/electra_base.py
    python -m t5x_like.train --config=configs/electra_base.py --workdir=runs/electra_base
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
electra = bases.family("electra")


def get_config():
    config = electra.base(d_model=768, num_heads=12, d_ff=3072, embedding_dim=768,
                          generator=dict(d_model=256, num_heads=4, d_ff=1024),
                          max_predictions_per_seq=79)
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 256
    config.num_train_steps = 766_000
    config.optimizer.learning_rate = 2e-4
    return config
