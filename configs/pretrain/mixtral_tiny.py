"""The benchmark recipe's GPT-2 data and schedule (configs/pretrain/gpt2_tiny.py) on a
Mixtral-shaped decoder: rotary positions, RMSNorm, SwiGLU, grouped-query attention, and
every MLP 8 experts with top-2 routing (softmax over the two chosen logits), dropless.

    python -m t5x_like.train --config=configs/pretrain/mixtral_tiny.py --workdir=runs/pt_mixtral
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_gpt2_tiny", pathlib.Path(__file__).resolve().parent / "gpt2_tiny.py")
_gpt2_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gpt2_tiny)


def get_config():
    config = _gpt2_tiny.get_config()
    config.model.update(dict(variant="mixtral", d_ff=256, mlp_activations=("silu", "linear"),
                             use_bias=False, norm="rmsnorm", tie_embeddings=False,
                             attention=dict(num_kv_heads=2), positions=dict(kind="rotary"),
                             experts=dict(num_experts=8, num_experts_per_token=2,
                                          router_softmax="after_top_k", dispatch="dropless",
                                          aux_loss_weight=0.02)))
    return config
