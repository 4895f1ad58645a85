"""The second reward of ``trl_side_by_side.py``, one both GRPOs learn: registered for our
runs by ``--module=benchmarks._side_by_side_rewards`` and called by TRL's run directly.

``leading_one``: 1 when the completion starts with the digit 1. About 60% of the SFT
model's greedy answers do (every sum from 100 up, and 10-19), so the reward is within
reach of its samples; the side by side reads how fast each implementation turns it
into greedy behaviour, which the exact-answer reward (out of reach at this size) cannot
show.
"""

from t5x_like.metrics.rewards import RewardRegistry


def leading_one(completions, examples):
    return [float(str(c).strip().startswith("1")) for c in completions]


RewardRegistry.add("leading_one", leading_one)
