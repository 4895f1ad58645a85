"""Services: the training modes, registered like families (``registry.py``): each a
``Mode`` record of what it adds to a run. ``head`` (a fine-tuning head: its structure
only), ``distill`` (a frozen teacher: checks, loading, the soft-target terms, the
student's start from its layers), ``preference`` (DPO's frozen reference, checked and
loaded) and ``rl`` (online RL: rollouts of the policy, their rewards and the old
log-probabilities kept with them, as the loop's batches; PPO's value model's start). Pretraining is no mode: the
family's own structure on the task's rows.
"""

import importlib
import pkgutil

from t5x_like.modes.registry import (
    MODES,
    BatchSource,
    Frozen,
    Mode,
    active,
    batch_source,
    frozen_of,
    init_params,
    register,
    start_from,
)

__all__ = ["MODES", "BatchSource", "Frozen", "Mode", "active", "batch_source", "frozen_of",
           "init_params", "register", "start_from"]

# The folder is the registry (as big_vision's evaluators are a folder): every module here
# but ``registry`` is one mode's record, which registers itself as it loads; a new mode adds
# its file and no line here.
for _module in pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")
