"""lm-evaluation-harness tasks, found and loaded before any model work, and run.

Shared by ``python -m t5x_like.harness`` and ``train`` (``config.eval.harness_tasks``):
the harness is optional (the ``lm_eval`` extra), so this module imports it only in
its functions, after ``check_installed`` has named the install line.
"""

from __future__ import annotations

import difflib
import importlib.util

from t5x_like import errors
from t5x_like.errors import UserError
from t5x_like.system import storage

# Imports inside functions: lm-eval (optional) loads only when a harness task is read; keep
# JAX out of the commands' start-up: this module is imported before the config is read, and
# what needs JAX loads after it.


def check_installed(what: str = "The harness command") -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise UserError(f"{what} needs lm-evaluation-harness, which is not installed: "
                        f"{errors.install_hint('lm_eval')}")


def check_decoder(config, what: str, instead: str) -> None:
    """The harness scores language models: a family whose structure does not score
    choices as lm-eval does (encoders, encoder-decoders here) is refused."""
    from t5x_like import structures
    if not structures.structure_class(config.model.family).scores_choices_as_lm_eval:
        raise UserError(f"{what} runs lm-evaluation-harness on decoder language models; this "
                        f"is a {config.model.family!r} model. {instead}")


def task_names(value: str, flag: str = "--tasks") -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise UserError(f"{flag} names no task; e.g. {flag}=lambada_openai,hellaswag.")
    return names


def load(names: list[str], include_path: str = "") -> list:
    """The harness's task (and group) objects for ``names``, their datasets loaded, from
    its catalogue and the YAML files under ``include_path``."""
    if include_path and not storage.path(include_path).is_dir():
        raise UserError(f"include_path {include_path} is not a folder of task YAML files.")
    manager = _task_manager(include_path)
    known = set(manager.all_tasks)
    objects = []
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UserError(f"lm-eval knows no task, group or tag {name!r}.{hint} Put its YAML "
                            "in a folder given as the include path, or list the catalogue "
                            "with `lm-eval ls tasks`.")
        try:
            loaded = manager.load(name)
        except Exception as e:  # the datasets library raises many kinds; all mean "not here"
            first = str(e).splitlines()[0] if str(e) else ""
            raise UserError(f"Task {name!r} could not load its dataset ({type(e).__name__}: "
                            f"{first}). Offline, a task reads local files: point its "
                            "dataset_kwargs at JSONL files.") from None
        objects += ([loaded["groups"][name]] if name in loaded["groups"]
                    else list(loaded["tasks"].values()))
    return objects


# One index a process: lm-eval's TaskManager reads every YAML file of its catalogue (about
# 15,000 tasks, 8 s on 2 cores) when it is made, and a process that loads tasks again (a
# run's harness evaluator and its checks, a notebook, the tests) would pay that each time.
# Keyed on the include path's YAML files as they are now, so an edited task is read anew.
_MANAGERS: dict[tuple, object] = {}


def _task_manager(include_path: str):
    from lm_eval.tasks import TaskManager

    key = (include_path, _yaml_fingerprint(include_path)) if include_path else ("",)
    if key not in _MANAGERS:
        _MANAGERS[key] = TaskManager(include_path=include_path or None)
    return _MANAGERS[key]


def _yaml_fingerprint(include_path: str) -> tuple:
    """The YAML files under ``include_path``: names, sizes and modification times."""
    files = sorted(p for p in storage.files_under(include_path)
                   if str(p).endswith((".yaml", ".yml")))
    return tuple((str(p), stat.length, stat.mtime) for p, stat in ((p, p.stat()) for p in files))


def evaluate(lm, tasks: list, *, include_path: str = "", num_fewshot: int | None = None,
             limit: float = 0, log_samples: bool = False, bootstrap_iters: int = 0,
             fewshot_seed: int = 1234) -> dict:
    """lm-eval's ``simple_evaluate`` of ``lm`` on ``tasks`` loaded by ``load`` from
    ``include_path`` (its whole output). The index that loaded them is handed to it:
    given none, ``simple_evaluate`` builds its own, the whole catalogue read again."""
    import lm_eval
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, num_fewshot=num_fewshot,
                                   task_manager=_task_manager(include_path),
                                   limit=limit or None, log_samples=log_samples,
                                   bootstrap_iters=bootstrap_iters,
                                   fewshot_random_seed=fewshot_seed)


def scalars(out: dict, prefix: str = "harness") -> dict[str, float]:
    """``{"harness/<task>/<metric>": value}`` for the metrics file: each task's and
    group's numbers, without standard errors (the ``none`` filter unnamed); ``prefix``
    "" leaves ``<task>/<metric>``."""
    record = {}
    for section in ("results", "groups"):
        for task, values in out.get(section, {}).items():
            for key, value in values.items():
                metric, _, filter_name = key.partition(",")
                if "_stderr" in metric or not isinstance(value, (int, float)) or isinstance(
                        value, bool):
                    continue
                name = metric if filter_name in ("", "none") else f"{metric}_{filter_name}"
                record[f"{prefix}/{task}/{name}" if prefix else f"{task}/{name}"] = float(value)
    return record


def format_table(out: dict) -> str:
    """lm-eval's results as its table's columns (task, version, filter, n-shot, metric,
    value, stderr). Written here: lm-eval's ``make_table`` forks worker processes, which
    a process running JAX must not do."""
    rows = [("Tasks", "Version", "Filter", "n-shot", "Metric", "Value", "Stderr")]
    for section in ("results", "groups"):
        for task, values in out.get(section, {}).items():
            version = str(out.get("versions", {}).get(task, ""))
            shots = str(out.get("n-shot", {}).get(task, ""))
            for key, value in values.items():
                metric, _, filter_name = key.partition(",")
                if "_stderr" in metric or key == "alias" or not filter_name:
                    continue
                stderr = values.get(f"{metric}_stderr,{filter_name}", "")
                rows.append((values.get("alias", task), version, filter_name, shots, metric,
                             _number(value), _number(stderr)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["|" + "|".join(f" {c:<{w}} " for c, w in zip(r, widths, strict=True)) + "|"
             for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _number(value) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.4f}"
    return str(value)
