"""Switch-Base with 8 experts (Fedus et al. 2021; Hugging Face's google/switch-base-8):
T5 base (v1.0: ReLU MLP, logits through the shared embedding) with every other
feed-forward layer 8 experts with top-1 routing, capacity factor 1.25, load-balancing
loss 0.01 and router input jitter 0.01 as the paper trains it. 619M parameters, of which
a token runs through 223M (both as transformers counts them).

    python -m t5x_like.summary --config=configs/switch_base_8.py
    python -m t5x_like.train --config=configs/switch_base_8.py --workdir=runs/switch_base_8
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
t5 = bases.family("t5")


def get_config():
    return t5.base(variant="switch_transformers", d_model=768, num_heads=12, d_ff=3072,
                   num_encoder_layers=12, num_decoder_layers=12, **t5.V1_0,
                   experts=dict(num_experts=8, num_experts_per_token=1, every=2,
                                capacity_factor=1.25, aux_loss_weight=0.01, router_jitter=0.01,
                                dispatch="capacity"))
