"""GRPO on ``embedded_arithmetic`` (``a+b=`` -> the sum, an exact-answer reward) from an
SFT'd small GPT-2, which is also the frozen reference of the KL term:

    python -m t5x_like.train --config=configs/finetune/gpt2_tiny_arithmetic_sft.py \\
        --workdir=runs/sft_arith
    python -m t5x_like.train --config=configs/rl/gpt2_tiny_grpo_arithmetic.py \\
        --workdir=runs/grpo_arith --config.init_from=runs/sft_arith

``batch_size`` counts completions: 8 prompts x ``rl.num_generations`` 8 a step.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_sft", pathlib.Path(__file__).resolve().parents[1] / "finetune" / "gpt2_tiny_arithmetic_sft.py")
_sft = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sft)


def get_config():
    config = _sft.get_config()
    config.rl.algorithm = "grpo"
    config.rl.num_generations = 8
    config.rl.temperature = 0.7
    config.rl.beta = 0.04
    config.rl.rewards = ("exact_answer",)
    config.batch_size = 64
    config.num_train_steps = 600
    config.optimizer.learning_rate = 2e-5
    config.optimizer.schedule = "constant"
    config.optimizer.warmup_steps = 0
    config.evals.held_out = dict(kind="rollouts", every_steps=100, batches=8, samples=1)
    config.checkpoint.every_steps = 100
    config.logging.every_steps = 10
    return config
