"""The run spec, a leaf package (no Flax, no JAX): frozen, typed, sectioned dataclasses
that check themselves (``RunSpec`` and its sections; each family's model spec built
from shared parts), the config files and ``--config.KEY=VALUE`` overrides that produce
them (``ml_collections`` stays the file and override surface), and the old spellings
they still accept.

    config file + overrides --files, overrides--> ConfigDict --spec_of--> RunSpec
                                                   (sectioned)           (checked, frozen)

What needs devices, checkpoints, files or the task registry is checked by the run
service (``t5x_like.resolving``) on top of the spec, before anything runs.
"""

from t5x_like.config import legacy
from t5x_like.config.devices import (
    batch_shards,
    check_devices,
    default_data_streams,
    microbatches_holding,
    resolve_data_streams,
    resolve_mesh_shape,
    rows_per_device,
)
from t5x_like.config.evals import EVAL_SPECS, EvalSpec, register_eval_spec
from t5x_like.config.files import load_config_file, packaged_config
from t5x_like.config.model_parts import ModelSpec
from t5x_like.config.model_specs import MODEL_SPECS, model_spec_class, register_model_spec
from t5x_like.config.overrides import apply_overrides, parse_value, split_overrides
from t5x_like.config.run import RESUME_CHANGE_KEYS, RunSpec
from t5x_like.config.schema import (
    MICROBATCHES_ASKED,
    ROWS_PER_DEVICE,
    as_config_dict,
    default_config,
    migrated,
    model_defaults,
    model_of_folder,
    model_spec_of,
    spec_of,
    t5_pretraining_config,
)
from t5x_like.config.sections import FrozenMap, Section

__all__ = ["EVAL_SPECS", "MODEL_SPECS", "RESUME_CHANGE_KEYS", "MICROBATCHES_ASKED",
           "ROWS_PER_DEVICE", "EvalSpec", "FrozenMap",
           "ModelSpec", "RunSpec", "Section", "apply_overrides", "as_config_dict",
           "batch_shards", "check_devices", "default_config", "microbatches_holding",
           "rows_per_device", "default_data_streams", "legacy",
           "load_config_file", "migrated", "packaged_config", "model_defaults", "model_of_folder", "model_spec_of",
           "model_spec_class", "parse_value",
           "register_eval_spec", "register_model_spec", "resolve_data_streams",
           "resolve_mesh_shape", "spec_of", "split_overrides", "t5_pretraining_config"]
