"""The benchmark recipe's T5 (configs/pretrain/t5_tiny.py) as a Switch Transformer: every
other feed-forward layer is 8 experts of the dense layer's width, each token routed to one
(top-1, Fedus et al.), capacity factor 1.25, load-balancing loss 0.01. A token runs
through as many FLOPs as in the dense model (plus the router), with 8x the MLP parameters
in the sparse layers. docs/mixture_of_experts.md compares the two.

    python -m t5x_like.train --config=configs/pretrain/t5_tiny_moe.py --workdir=runs/pt_t5_moe
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_t5_tiny", pathlib.Path(__file__).resolve().parent / "t5_tiny.py")
_t5_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_t5_tiny)


def get_config():
    config = _t5_tiny.get_config()
    config.model.experts.update(dict(num_experts=8, num_experts_per_token=1, every=2,
                                     capacity_factor=1.25, aux_loss_weight=0.01,
                                     dispatch="capacity"))
    return config
