"""``--config.KEY=VALUE`` overrides: parsed to the type of the value they replace, applied
in order, old spellings moved to where their key went (``--config.eval_every_steps=50``
sets ``evals.held_out.every_steps``), and new evaluators made by name
(``--config.evals.glue.kind=benchmark --config.evals.glue.mixture=...``).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

import ml_collections

from t5x_like.config import legacy
from t5x_like.config.evals import eval_spec_class
from t5x_like.config.mode_specs import mode_spec_class
from t5x_like.config.sections import suggest
from t5x_like.errors import ConfigError


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(other flags, config overrides)``: ``--config.KEY=VALUE`` become ``KEY=VALUE``."""
    overrides = [a[len("--config."):] for a in argv if a.startswith("--config.")]
    return [a for a in argv if not a.startswith("--config.")], overrides


def parse_value(text: str, current: Any, key: str) -> Any:
    """Command-line text -> a value of the same type as ``current``."""
    if isinstance(current, bool):
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"--config.{key}={text}: expected true or false.")
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--config.{key}={text}: expected an integer, e.g. "
                              f"--config.{key}={current}.") from None
    if isinstance(current, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--config.{key}={text}: expected a number, e.g. "
                              f"--config.{key}={current}.") from None
    if isinstance(current, str):
        return text
    if isinstance(current, (tuple, list)):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = tuple(part.strip() for part in text.split(",") if part.strip())
        if isinstance(value, str):
            value = (value,)
        return type(current)(value)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
    """Applies ``key.path=value`` strings (from ``--config.key.path=value``) in place."""
    items = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--config.{item} needs a value: --config.{item}=VALUE.")
        items.append(tuple(item.split("=", 1)))
    # An evaluator's kind first: its other keys take their types from the kind's defaults.
    for path, text in sorted(items, key=lambda kv: not _is_eval_kind(kv[0])):
        _apply_one(config, path, text, f"{path}={text}")


def _is_eval_kind(path: str) -> bool:
    parts = path.split(".")
    return len(parts) == 3 and parts[0] == "evals" and parts[2] == "kind"


def _apply_one(config, path: str, text: str, item: str) -> None:
    if _has_path(config, path):
        return _set(config, path, text, item)
    parts = path.split(".")
    if parts[0] == "evals" and len(parts) == 3:
        return _set_evaluator_key(config, parts[1], parts[2], text, item)
    if parts[0] == "modes" and len(parts) == 3 and parts[1] not in config.get("modes", {}):
        _add_mode(config, parts[1])  # a registered mode of your own, at its defaults
        return _apply_one(config, path, text, item)
    if parts[0] == "eval" and len(parts) == 2:
        return _set_old_eval_key(config, parts[1], text, item)
    new = legacy.new_spelling(path)
    if new is not None and new.startswith("evals.held_out.") and "held_out" not in config.evals:
        _add_evaluator(config, "held_out", "held_out_loss")
    if new is not None and _has_path(config, new):
        return _set(config, new, text, item)
    raise _unknown(config, path, item)


def _has_path(config, path: str) -> bool:
    node = config
    for part in path.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return False
        node = node[part]
    return True


def _set(config, path: str, text: str, item: str) -> None:
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node[part]
    if isinstance(node[leaf], ml_collections.ConfigDict):
        raise ConfigError(f"--config.{item}: {path!r} is a section; set one of its keys, "
                          f"e.g. --config.{path}.{next(iter(node[leaf].keys()))}=...")
    with node.unlocked():
        node[leaf] = parse_value(text, node[leaf], path)


def _add_evaluator(config, name: str, kind: str, **values) -> None:
    spec_class = eval_spec_class(kind, f"evals.{name}")
    settings = {**spec_class.defaults(), "kind": kind, **values}
    with config.evals.unlocked():
        config.evals[name] = ml_collections.ConfigDict(settings)


def _add_mode(config, name: str) -> None:
    settings = mode_spec_class(name, f"modes.{name}").defaults()
    with config.unlocked():
        if "modes" not in config:
            config.modes = ml_collections.ConfigDict()
    with config.modes.unlocked():
        config.modes[name] = ml_collections.ConfigDict(settings)


def _set_evaluator_key(config, name: str, key: str, text: str, item: str) -> None:
    """A key of an evaluator not in the config yet: ``kind`` makes it; a key its kind
    does not have is named with the nearest one it has."""
    if name in config.evals:
        raise _unknown(config, f"evals.{name}.{key}", item)
    if key != "kind":
        raise ConfigError(f"--config.{item}: there is no evaluator {name!r}; make one first "
                          f"with --config.evals.{name}.kind=KIND (e.g. benchmark, harness, "
                          f"held_out_loss), then set its keys."
                          f"{suggest(name, list(config.evals.keys()))}")
    _add_evaluator(config, name, text)


def _set_old_eval_key(config, key: str, text: str, item: str) -> None:
    """``--config.eval.KEY``, the spelling before named evaluators: onto
    ``evals.benchmark`` (or ``evals.harness`` for ``harness_*``), made if missing at the
    held-out cadence, as ``eval`` ran then."""
    harness = key in legacy.EVAL_HARNESS_KEYS and key != "batch_size"
    name, kind = ("harness", "harness") if harness else ("benchmark", "benchmark")
    known = legacy.EVAL_HARNESS_KEYS if harness else {**legacy.EVAL_BENCHMARK_KEYS,
                                                       "every_steps": "every_steps"}
    if key not in known:
        raise ConfigError(f"--config.{item}: the eval section is now named evaluators "
                          f"(config.evals.<name>) and had no key {key!r}; see docs/configs.md.")
    held_out = config.evals.held_out.every_steps if "held_out" in config.evals else 0
    cadence = held_out if held_out > 0 else -1
    if name not in config.evals:
        _add_evaluator(config, name, kind, every_steps=cadence)
    new_key = known[key]
    if new_key == "every_steps" and text.strip() == "0":
        text = str(cadence)  # eval.every_steps=0 followed the held-out evaluation
    _set(config, f"evals.{name}.{new_key}", text, item)
    if key == "batch_size" and "harness" in config.evals:
        _set(config, "evals.harness.batch_size", text, item)


def _unknown(config, path: str, item: str) -> ConfigError:
    parts = path.split(".")
    node, depth = config, 0
    while depth < len(parts) - 1 and isinstance(node, ml_collections.ConfigDict) \
            and parts[depth] in node and isinstance(node[parts[depth]], ml_collections.ConfigDict):
        node, depth = node[parts[depth]], depth + 1
    if not isinstance(node, ml_collections.ConfigDict):
        return ConfigError(f"--config.{item}: {'.'.join(parts[:depth])!r} is a value, not a "
                           "section.")
    prefix = ".".join(parts[:depth])
    sub_path = ".".join(parts[:depth + 1])
    if depth < len(parts) - 1 and parts[depth] in node:
        return ConfigError(f"--config.{item}: {sub_path!r} is a value, not a section.")
    siblings = [f"{prefix}.{k}" if prefix else k for k in node.keys()]
    family = ""
    if parts[0] == "model" and "family" in config.model:
        family = (f" model.family={config.model.family!r} has no such key; a key of another "
                  "family needs a config written for that family.")
    return ConfigError(
        f"Unknown config key {sub_path!r} (from --config.{item}).{family}"
        f"{suggest(sub_path, siblings)} Known keys{' under ' + repr(prefix) if prefix else ''}: "
        f"{', '.join(sorted(siblings))}.")
