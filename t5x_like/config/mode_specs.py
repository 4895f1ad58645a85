"""The sections of training modes of your own: ``config.modes.<name>`` holds the settings
of a mode a user's module registers (``t5x_like.modes.register``), typed by the section
class it registers here (``register_mode_spec``) and checked like every section. A run
is in such a mode when its section is present (``--config.modes.NAME.KEY=VALUE`` makes
it with the section's defaults). The built-in modes keep their own top-level sections
(``head``, ``distill``, ``preference``, ``rl``).
"""

from __future__ import annotations

from collections.abc import Mapping

from t5x_like.config.sections import FrozenMap, Section, join, suggest
from t5x_like.errors import ConfigError

MODE_SPECS: dict[str, type[Section]] = {}


def register_mode_spec(name: str, spec_class: type[Section]) -> None:
    """Makes ``config.modes.<name>`` a section of ``spec_class``."""
    if not (isinstance(spec_class, type) and issubclass(spec_class, Section)):
        raise TypeError(f"Mode {name!r}: {spec_class!r} is not a config Section subclass "
                        "(t5x_like.config.sections.section).")
    MODE_SPECS[name] = spec_class


def mode_spec_class(name: str, key: str) -> type[Section]:
    if name not in MODE_SPECS:
        registered = sorted(MODE_SPECS)
        raise ConfigError(f"{key}: no mode {name!r} is registered (registered: "
                          f"{registered or 'none'}); pass the module that registers it with "
                          f"--module=NAME.{suggest(name, registered)}")
    return MODE_SPECS[name]


def modes_from_mapping(data, path: str = "modes") -> FrozenMap:
    """``{name: settings}`` -> ``{name: section}``, each by its registered class."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"Config key {path!r} is a section of modes by name, e.g. "
                          f"--config.{path}.NAME.KEY=VALUE.")
    out = {}
    for name, settings in data.items():
        key = join(path, name)
        if isinstance(settings, Section):
            out[name] = settings
            continue
        if callable(getattr(settings, "to_dict", None)):
            settings = settings.to_dict()
        if not isinstance(settings, Mapping):
            raise ConfigError(f"Config key {key!r} is a mode's section; give its keys, e.g. "
                              f"--config.{key}.KEY=VALUE.")
        out[name] = mode_spec_class(name, key).from_mapping(settings, key)
    return FrozenMap(out)
