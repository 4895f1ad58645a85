"""PPO on ``embedded_arithmetic`` (``a+b=`` -> the sum, an exact-answer reward) from an
SFT'd small GPT-2, which is also the frozen reference of the KL penalty; the value model
starts from the SFT model's trunk with a fresh head (no reward model: the reward is a
rule; with ``--config.rl.reward_model=RUN`` it would start from that reward model):

    python -m t5x_like.train --config=configs/finetune/gpt2_tiny_arithmetic_sft.py \\
        --workdir=runs/sft_arith
    python -m t5x_like.train --config=configs/rl/gpt2_tiny_ppo_arithmetic.py \\
        --workdir=runs/ppo_arith --config.init_from=runs/sft_arith

One completion of each of 64 prompts a rollout, 4 epochs (``rl.iterations``) on it;
TRL's PPOConfig defaults otherwise (kl_coef 0.05, k1, gamma 1, lam 0.95, clip 0.2,
value clip 0.2, vf_coef 0.1).
"""

import importlib.util
import pathlib

# GRPO's recipe (the same task, rewards, sampling, learning rate and evaluations), PPO's
# algorithm on it.
_spec = importlib.util.spec_from_file_location(
    "_grpo", pathlib.Path(__file__).resolve().parent / "gpt2_tiny_grpo_arithmetic.py")
_grpo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grpo)


def get_config():
    config = _grpo.get_config()
    config.rl.algorithm = "ppo"
    config.rl.beta = 0.0  # GRPO's KL term; PPO's is rl.kl_coef, in the reward
    config.rl.iterations = 4
    return config
