"""What config files import: ``from t5x_like import config_lib`` then
``config_lib.default_config()`` (every key at its default, in the sectioned layout),
``config_lib.model_defaults(family)``, or ``config_lib.packaged_config("quickstart")`` to
start from a config the package carries. The spec itself is ``t5x_like.config``; the
names here accept a ``ConfigDict`` (old spellings included) as well as a ``RunSpec``.
"""

from __future__ import annotations

from t5x_like.config import (
    RunSpec,
    apply_overrides,
    as_config_dict,
    check_devices,
    default_config,
    default_data_streams,
    load_config_file,
    model_defaults,
    model_of_folder,
    model_spec_of,
    packaged_config,
    parse_value,
    resolve_mesh_shape,
    spec_of,
    split_overrides,
    t5_pretraining_config,
)
from t5x_like.config import resolve_data_streams as _resolve_data_streams
from t5x_like.errors import ConfigError

__all__ = ["ConfigError", "RunSpec", "apply_overrides", "as_config_dict", "default_config",
           "default_data_streams", "load_config_file", "model_defaults", "model_of_folder",
           "model_spec_of", "packaged_config", "parse_value",
           "resolve_data_streams", "resolve_mesh_shape", "spec_of", "split_overrides",
           "t5_pretraining_config", "validate", "validate_for_devices"]


def validate(config) -> RunSpec:
    """The checks that need no devices; returns the spec (``ConfigError`` names the key)."""
    return spec_of(config)


def validate_for_devices(config, num_devices: int, process_count: int = 1,
                         num_slices: int = 1) -> dict[str, int]:
    """Mesh and batch checks that need the device count; returns the resolved mesh shape."""
    return check_devices(spec_of(config), num_devices, process_count, num_slices)


def resolve_data_streams(config, process_count: int, saved_config: dict | None = None) -> int:
    return _resolve_data_streams(spec_of(config), process_count, saved_config)
