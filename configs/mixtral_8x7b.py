"""Mixtral 8x7B's shape (Jiang et al. 2024): Mistral 7B's decoder whose every MLP is 8 SwiGLU
experts, each token routed to 2 (softmax over the two chosen logits), load-balancing loss
0.02 as Hugging Face trains it. 46.7B parameters, 12.9B active per token; ``convert
import`` of the Hugging Face checkpoint loads into it.

Pretraining dispatches by capacity (1.25) in groups of 512 tokens, as this config has
since before dropless dispatch was expert-parallel (resumed runs keep it);
``--config.model.experts.dispatch=dropless`` computes every assignment, as Mixtral's own
inference does, and with ``--config.model.experts.ragged_buffer_factor=1.25`` plans
faster on a v5p-128 than capacity dispatch (docs/mixture_of_experts.md).

    python -m t5x_like.summary --config=configs/mixtral_8x7b.py
    python -m t5x_like.plan --config=configs/mixtral_8x7b.py --topology=v5p:4x4x8 \\
        --config.mesh.fsdp=-1 --config.mesh.expert=8 --config.mesh.data=1
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
gpt2 = bases.family("gpt2")


def model():
    """The model keys (shared with the tiny recipe, configs/pretrain/mixtral_tiny.py)."""
    return dict(variant="mixtral", vocab_size=32_000, d_model=4096, num_heads=32, head_dim=128,
                d_ff=14_336, num_layers=32, mlp_activations=("silu", "linear"), use_bias=False,
                norm="rmsnorm", layer_norm_epsilon=1e-5, tie_embeddings=False, bos_id=1,
                attention=dict(num_kv_heads=8),
                positions=dict(kind="rotary", max_length=32_768,
                               rope=dict(max_wavelength=1_000_000.0)),
                experts=dict(num_experts=8, num_experts_per_token=2, router_softmax="after_top_k",
                             dispatch="capacity", capacity_factor=1.25, group_size=512,
                             aux_loss_weight=0.02))


def get_config():
    config = gpt2.base(**model(), numerics=dict(scan_layers=True, remat_policy="dots_no_batch",
                                                dtype="bfloat16"))
    config.task_feature_lengths = {"targets": 4096}
    config.batch_size = 256
    config.optimizer.update(name="adamw", learning_rate=3e-4, schedule="cosine", warmup_steps=2000,
                            weight_decay=0.1, b2=0.95)
    return config
