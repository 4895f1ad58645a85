"""Config files: a Python module with ``get_config() -> ml_collections.ConfigDict`` that
starts from ``config_lib.default_config()``. ``path:ARG`` calls ``get_config(ARG)``
(ml_collections' convention). A packaged config is named by its path under ``configs/``
without ``.py`` (``quickstart``, ``pretrain/t5_tiny``): from a clone or an installed
wheel, from any directory. Old spellings in the file are moved to the sectioned layout as
it is read, so an override of the new spelling applies on top of them.
"""

from __future__ import annotations

import difflib
import importlib.machinery
import importlib.util
import inspect
import pathlib
import re
import traceback

import ml_collections

from t5x_like import resources
from t5x_like.config import legacy, schema
from t5x_like.errors import ConfigError


def load_config_file(path: str, run_spec: bool = True) -> ml_collections.ConfigDict:
    """The config ``path`` (or ``path:ARG``) makes, in the sectioned layout (``run_spec``
    False: as the file made it, for configs of other things, such as retrieval runs)."""
    path, argument = _split_argument(path)
    file = _located(path)
    if file is None:
        raise ConfigError(_missing_config_message(path))
    module = _run_module(file, path)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"Config file {path!r} has no get_config() function; define one that "
                          "returns an ml_collections.ConfigDict.")
    if argument is not None and not inspect.signature(module.get_config).parameters:
        raise ConfigError(f"Config file {path!r} takes no argument, but --config gave it "
                          f"{argument!r}; drop ':{argument}'.")
    config = _call_get_config(module, argument, path, file)
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config() in {path!r} returned {type(config).__name__}; return "
                          "an ml_collections.ConfigDict built from config_lib.default_config().")
    if not run_spec:
        return config
    tree, _ = schema.migrated(config)
    return schema.as_config_dict(tree)


def packaged_config(name: str, argument: str | None = None) -> ml_collections.ConfigDict:
    """Packaged config ``name`` (``quickstart``, ``gpt2_small``) in the sectioned layout: a
    user's own config file starts from it and changes what it needs."""
    if resources.config_file(name) is None:
        raise ConfigError(_missing_config_message(name))
    return load_config_file(name if argument is None else f"{name}:{argument}")


def _located(path: str) -> pathlib.Path | None:
    """The file ``path`` names: a file (relative to here or absolute), else a packaged
    config by name."""
    file = pathlib.Path(path)
    return file if file.is_file() else resources.config_file(path)


def _split_argument(path: str) -> tuple[str, str | None]:
    if _located(path) is not None or ":" not in path:
        return path, None
    head, argument = path.rsplit(":", 1)
    return (head, argument) if _located(head) is not None else (path, None)


def _close_names(path: str, names: list[str]) -> list[str]:
    """Packaged names near ``path``: the same file in another folder first, then spellings."""
    query = path.removesuffix(".py").removeprefix("configs/")
    same_file = [n for n in names if n.rsplit("/", 1)[-1] == query.rsplit("/", 1)[-1]]
    spelled = difflib.get_close_matches(query, names, n=3, cutoff=0.75)
    return (same_file + [n for n in spelled if n not in same_file])[:3]


def _missing_config_message(path: str) -> str:
    names = resources.config_names()
    close = [repr(n) for n in _close_names(path, names)]
    either = ", ".join(close[:-1]) + " or " + close[-1] if len(close) > 1 else "".join(close)
    hint = f"; did you mean {either}?" if close else "."
    return (f"Config {path!r} is neither a file nor a packaged config{hint} Pass a path, or one "
            f"of the {len(names)} packaged names (`t5xl configs` lists them), e.g. "
            "--config=quickstart.")


def _run_module(file: pathlib.Path, path: str):
    name = f"_t5x_like_config_{file.stem}"
    # The loader is named: a config file without the .py suffix is still Python.
    spec = importlib.util.spec_from_file_location(
        name, file, loader=importlib.machinery.SourceFileLoader(name, str(file)))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"Config file {path!r} has a syntax error at line {e.lineno}: {e.msg}"
                          f"{': ' + e.text.strip() if e.text else ''}. Fix the file.") from None
    except ImportError as e:
        raise ConfigError(f"Config file {path!r} imports what is not installed or not "
                          f"importable ({e}).") from None
    except Exception as e:  # noqa: BLE001 - any error running the user's file is theirs
        raise ConfigError(f"Running config file {path!r} raised {type(e).__name__}: {e} "
                          f"(line {_user_line(e, file)}). Fix the file.") from None
    return module


def _call_get_config(module, argument, path: str, file: pathlib.Path):
    try:
        return module.get_config() if argument is None else module.get_config(argument)
    except TypeError as e:
        # ConfigDict refuses to change a field's type, e.g. an int key set to a string.
        raise ConfigError(f"In {path}: {e}. Use a value of the key's type "
                          "(see t5x_like.config_lib.default_config).") from None
    except (AttributeError, KeyError) as e:
        # A key the defaults lack: an old spelling of a section (config.eval.mixture), or a typo.
        raise ConfigError(f"In {path}, get_config() (line {_user_line(e, file)}): "
                          f"{_missing_key_message(e)}") from None
    except ValueError as e:  # the file's own refusal of its argument (an unknown preset)
        raise ConfigError(f"{path}:{argument}: {e}.") from None


def _missing_key_message(error: BaseException) -> str:
    text = " ".join(str(error.args[0] if error.args else error).split())
    quoted = re.search(r"'([^']+)'", text)
    key = quoted.group(1) if quoted else text
    new = legacy.new_spelling(key) or legacy.new_spelling(f"model.{key}")
    if key == "eval":
        return ("config.eval is now named evaluators: config.evals.benchmark = dict(kind="
                "'benchmark', mixture=...) (or kind='harness', tasks=...); see docs/configs.md.")
    if new:
        return f"{key!r} is now {new!r}; use that spelling."
    return f"{text}. Use only keys of t5x_like.config_lib.default_config()."


def _user_line(error: BaseException, file: pathlib.Path) -> int | str:
    """The line of the user's config file the error was raised under."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if pathlib.Path(f.filename).resolve() == file.resolve()]
    return frames[-1].lineno if frames else "?"
