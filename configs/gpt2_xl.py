"""GPT-2 xl (about 1.56B parameters): learned positions, pre-LayerNorm, GELU MLP, tied output.

    python -m t5x_like.summary --config=configs/gpt2_xl.py
    python -m t5x_like.plan --config=configs/gpt2_xl.py --topology=v5e:4x4
    python -m t5x_like.train --config=configs/gpt2_xl.py --workdir=runs/gpt2_xl
    python -m t5x_like.convert import --hf_dir=path/to/gpt2-xl --out=converted/gpt2_xl
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
gpt2 = bases.family("gpt2")


def get_config():
    config = gpt2.base(d_model=1600, num_heads=25, d_ff=6400, num_layers=48)
    # 1.5B parameters at GPT-2's batch (512 x 1024 tokens): shard parameters and optimizer
    # state over all chips, compute in bfloat16, one scanned layer recomputed in the
    # backward pass, and 8 microbatches so the [batch, 1024, 50257] logits fit
    # (`plan` on v5e:4x4: 4.7 GiB of 16 per chip).
    bases.shard_fully(config)
    config.model.numerics.update(scan_layers=True, remat_policy="full")
    config.optimizer.microbatches = 8
    return config
