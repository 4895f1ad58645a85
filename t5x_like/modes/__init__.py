"""Services: the training modes beyond plain pretraining and fine-tuning, each with what it
adds to a run. ``distill`` (a frozen teacher: checks, loading, the soft-target terms),
``preference`` (DPO's frozen reference, checked and loaded) and ``rl`` (online RL:
rollouts of the policy, their rewards and the old log-probabilities kept with them).
"""
