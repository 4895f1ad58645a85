"""Reading checkpoints back: where a run's, a step's or a pretrained folder's params
are (``source``), and the checkpoints of parameter-efficient runs, which hold only
what trains and name their base (``peft_partial``). Used by ``train`` (init_from,
resume), ``eval``, ``infer``, ``convert export``, ``peft merge``, distillation, the
embedding analyses and retrieval.

``peft_partial`` (which imports the models) is imported by name where it is needed.
"""

from t5x_like.checkpoints.param_sources.source import (
    Source,
    base_params,
    check_base,
    check_same_model,
    config_from_saved,
    join,
    load_params,
    newest_saved,
    resolve,
    restore_state,
)

__all__ = ["Source", "base_params", "check_base", "check_same_model", "config_from_saved", "join",
           "load_params", "newest_saved", "resolve", "restore_state"]
