"""What every part of the run spec is: a frozen, typed dataclass that is built from a
plain mapping (a config file's ``ConfigDict``, a saved ``config.json``) and checks
itself, with the key and the fix in every message.

A section is read like the ``ConfigDict`` it came from (``spec.optimizer.name``,
``spec.model["d_model"]``, ``spec.head.get("kind")``, ``spec.to_dict()``) and never
changes: ``section.replace(key=value)`` makes a new one. Sections hash, so a model
spec can key a cache of built models.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from t5x_like.errors import ConfigError


class FrozenMap(Mapping):
    """A read-only, hashable ``str -> value`` mapping (task feature lengths, named
    evaluators), kept in the order it was given."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping | None = None, **more):
        self._items = dict(items or {}, **more)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"

    def to_dict(self) -> dict:
        return {k: _plain(v) for k, v in self._items.items()}


def field(default=dataclasses.MISSING, *, choices: tuple = (), minimum: float | None = None,
          doc: str = "", **kwargs):
    """A section field with what the generic checks read: ``choices`` (an enum) and
    ``minimum`` (inclusive, for numbers)."""
    metadata = {"choices": tuple(choices), "minimum": minimum, "doc": doc}
    if default is not dataclasses.MISSING and isinstance(default, (Section, FrozenMap)):
        return dataclasses.field(default_factory=lambda: default, metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def section(cls):
    """The decorator of every section class: frozen, keyword-only fields."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


@section
class Section:
    """Base of every part of the spec (see the module docstring)."""

    # -- reading, as a ConfigDict is read --------------------------------------------------
    def __getitem__(self, key: str):
        if key not in self.field_names():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key) -> bool:
        return key in self.field_names()

    def __iter__(self):
        return iter(self.field_names())

    def get(self, key: str, default=None):
        return getattr(self, key) if key in self.field_names() else default

    def keys(self):
        return self.field_names()

    def items(self):
        return [(name, getattr(self, name)) for name in self.field_names()]

    def to_dict(self) -> dict:
        """Plain nested dicts (tuples stay tuples): what ``config.json`` holds."""
        return {name: _plain(getattr(self, name)) for name in self.field_names()}

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    # -- building and checking -------------------------------------------------------------
    @classmethod
    def defaults(cls) -> dict:
        """Every key at its default, as plain values (sections as dicts)."""
        out = {}
        for f in dataclasses.fields(cls):
            default, sub = _default_of(f), cls.sub_section(f.name, {})
            if sub is not None and not isinstance(default, sub):
                out[f.name] = sub.defaults()
            elif default is not dataclasses.MISSING:
                out[f.name] = _plain(default)
        return out

    @classmethod
    def section_type(cls, name: str) -> type | None:
        """The section class of field ``name`` (None: a plain value)."""
        hint = _hints(cls).get(name)
        return hint if isinstance(hint, type) and issubclass(hint, Section) else None

    @classmethod
    def from_mapping(cls, data: Mapping, path: str = ""):
        """The section ``data`` describes: unknown keys refused with the known ones, types
        checked, sub-sections built, then its own ``check``."""
        data = dict(data)
        names = cls.field_names()
        for key in data:
            if key not in names:
                raise unknown_key(join(path, key), [join(path, n) for n in names],
                                  cls.unknown_key_hint(key))
        values = {}
        for f in dataclasses.fields(cls):
            key = join(path, f.name)
            if f.name not in data:
                default = _default_of(f)
                if default is dataclasses.MISSING:
                    raise ConfigError(f"Config key {key!r} is missing; set it, e.g. "
                                      f"--config.{key}=VALUE.")
                values[f.name] = default
                continue
            values[f.name] = cls._value(f, data[f.name], key)
        try:
            built = cls(**values)
        except TypeError as e:  # a required field of a subclass without a value
            raise ConfigError(f"{path or 'config'}: {e}.") from None
        built.check(path)
        return built

    @classmethod
    def unknown_key_hint(cls, key: str) -> str:
        """Said after an unknown key's message (e.g. where a renamed key went)."""
        return ""

    @classmethod
    def _value(cls, f: dataclasses.Field, value: Any, key: str):
        sub = cls.section_type(f.name)
        if callable(getattr(value, "to_dict", None)) and not isinstance(value, Section):
            value = value.to_dict()  # a ConfigDict section, or a FrozenMap
        if sub is not None:
            if isinstance(value, Section):
                return value
            if not isinstance(value, Mapping):
                raise ConfigError(f"Config key {key!r} is a section; give its keys, e.g. "
                                  f"--config.{key}.{sub.field_names()[0]}=...")
            return cls.sub_section(f.name, value).from_mapping(value, key)
        value = typed(value, _hints(cls)[f.name], key)
        choices, minimum = f.metadata.get("choices"), f.metadata.get("minimum")
        if choices and value not in choices:
            raise ConfigError(f"Config key {key!r} is {value!r}; choose one of {choices}."
                              f"{suggest(str(value), [str(c) for c in choices])}")
        if minimum is not None and not (math.isfinite(value) and value >= minimum):
            raise ConfigError(f"Config key {key!r} must be a finite number >= {minimum:g}, got "
                              f"{value!r}.")
        return value

    @classmethod
    def sub_section(cls, name: str, value: Mapping) -> type[Section]:
        """The class that builds field ``name`` from ``value`` (a family's own attention or
        positions class overrides this)."""
        return cls.section_type(name)

    def check(self, path: str) -> None:
        """This section's own checks beyond types, enums and minimums."""


def _default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _plain(value):
    if isinstance(value, (Section, FrozenMap)):
        return value.to_dict()
    if isinstance(value, list):
        return tuple(value)
    return value


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def unknown_key(key: str, known, hint: str = "") -> ConfigError:
    prefix = key.rpartition(".")[0]
    return ConfigError(f"Unknown config key {key!r}.{' ' + hint if hint else ''}"
                       f"{suggest(key, known)} Known keys{' under ' + repr(prefix) if prefix else ''}: "
                       f"{', '.join(sorted(known))}.")


def typed(value, hint, key: str):
    """``value`` as the type ``hint`` names, or a ``ConfigError`` naming the key."""
    origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        if isinstance(value, (tuple, list)):
            (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
            return tuple(typed(v, item, key) for v in value)
    elif hint is FrozenMap or origin is FrozenMap:
        if isinstance(value, Mapping):
            return FrozenMap(value)
    else:  # Any
        return value
    expected = getattr(hint, "__name__", str(hint))
    raise ConfigError(f"Config key {key!r} must be {expected}, got {type(value).__name__} "
                      f"{value!r}.")


def require(ok: bool, message: str) -> None:
    """A section's own check: ``message`` (key and fix) unless ``ok``."""
    if not ok:
        raise ConfigError(message)
