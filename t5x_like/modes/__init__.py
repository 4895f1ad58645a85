"""Services: the training modes, registered like families (``registry.py``): each a
``Mode`` record of what it adds to a run. ``head`` (a fine-tuning head: its structure
only), ``distill`` (a frozen teacher: checks, loading, the soft-target terms, the
student's start from its layers), ``preference`` (DPO's frozen reference, checked and
loaded) and ``rl`` (online RL: rollouts of the policy, their rewards and the old
log-probabilities kept with them, as the loop's batches). Pretraining is no mode: the
family's own structure on the task's rows.
"""

from t5x_like.modes import distill, preference, rl
from t5x_like.modes.registry import (
    MODES,
    BatchSource,
    Frozen,
    Mode,
    active,
    batch_source,
    frozen_of,
    register,
    start_from,
)
from t5x_like.structures import head

__all__ = ["MODES", "BatchSource", "Frozen", "Mode", "active", "batch_source", "frozen_of",
           "register", "start_from"]

for _mode in (Mode("head", head.MODE.active, structure=head.MODE), distill.MODE,
              preference.MODE, rl.MODE):
    register(_mode)
