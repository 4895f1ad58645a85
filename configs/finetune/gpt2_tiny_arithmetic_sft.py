"""Supervised fine-tuning of the small GPT-2 shape on ``embedded_arithmetic`` (``a+b=`` ->
the sum), from scratch: the SFT model GRPO starts from
(``configs/rl/gpt2_tiny_grpo_arithmetic.py``).

    python -m t5x_like.train --config=configs/finetune/gpt2_tiny_arithmetic_sft.py \\
        --workdir=runs/sft_arith
"""

import importlib.util
import pathlib

from t5x_like import config_lib

_spec = importlib.util.spec_from_file_location(
    "_gpt2_tiny", pathlib.Path(__file__).resolve().parents[1] / "pretrain" / "gpt2_tiny.py")
_gpt2_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gpt2_tiny)


def get_config():
    config = config_lib.default_config()
    config.model = _gpt2_tiny.model_config()
    config.task = "embedded_arithmetic"
    config.task_feature_lengths = {"inputs": 8, "targets": 5}  # "▁", up to 3 digits, EOS
    config.data.prefix_attention = "causal"
    config.num_train_steps = 700
    config.batch_size = 64
    config.logging.every_steps = 50
    config.checkpoint.every_steps = 700
    config.evals.held_out.every_steps = 700
    config.evals.held_out.batches = 4
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-3
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 30
    return config
