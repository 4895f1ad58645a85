"""The preprocessing cache: a task's deterministic steps run once, offline, and stored.

A task marks where its cache ends with ``pp.CacheMarker()`` in its preprocessors
(seqio's ``CacheDatasetPlaceholder``). ``python -m t5x_like.cache_tasks`` runs the
steps before the marker over every example of the task's splits with Apache Beam and
writes, per task, to ``OUTPUT_DIR/TASK/``:

- ``SPLIT-*.array_record``: one record per *source* example, in source order (the
  cached index is the source index); an example the steps dropped is an empty record,
  so the cached split keeps the source's length and every position;
- ``info.json``, written last: the fingerprint and what it is made of, per split the
  shards and statistics (examples, tokens per feature). A cache without it is not a
  cache (a build that died halfway is never read).

Reading (``Task.get_dataset`` with a cache directory in ``T5X_LIKE_CACHE_DIR`` or
``add_cache_dirs``) replaces the source with the cached records and applies only the
steps after the marker. Shuffling, host sharding (``Source.shard``'s rule, whole files
included) and the step seeds are those of the uncached pipeline, and dropped examples
are skipped where the uncached steps drop them, so a cached task yields exactly the
uncached examples for every seed and shard, and grain iterator states resume either.

The fingerprint covers the task name, the source's identity, the steps before the
marker (their classes and fields; functions by name and source text), the output
features with their vocabularies (kind, size, model file name and content hash) and
``FORMAT_VERSION``. A cache whose fingerprint is not the task's is refused, never read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence

import msgpack
import numpy as np
from etils import epath

from t5x_like.data import embedded, sources, vocabularies
from t5x_like.data import preprocessors as pp
from t5x_like.errors import DataError, UserError
from t5x_like.system import storage

# Imports inside functions: array_record loads only when a cache is written or read.

FORMAT_VERSION = 1
INFO_FILE = "info.json"
CACHE_DIR_ENV = "T5X_LIKE_CACHE_DIR"  # comma-separated cache directories, searched in order
COMMAND = "python -m t5x_like.cache_tasks"
DEFAULT_EXAMPLES_PER_SHARD = 20_000

_added_cache_dirs: list[str] = []


# -- The marker and what may come before it ----------------------------------------------------

def marker_position(steps: Sequence[pp.Step]) -> int | None:
    """The index of the task's ``CacheMarker`` in its steps, or ``None``."""
    positions = [i for i, step in enumerate(steps) if isinstance(step, pp.CacheMarker)]
    return positions[0] if positions else None


def check_steps(task_name: str, steps: Sequence[pp.Step]) -> None:
    """Refuses a marker that cannot work: more than one, or a step before it whose output
    depends on the seed (it draws random numbers) or on its neighbours in the shuffled
    stream. Called when a task is made."""
    positions = [i for i, step in enumerate(steps) if isinstance(step, pp.CacheMarker)]
    if not positions:
        return
    if len(positions) > 1:
        raise ValueError(f"Task {task_name!r} has {len(positions)} cache markers (steps "
                         f"{positions}); keep one pp.CacheMarker().")
    for index, step in enumerate(steps[:positions[0]]):
        name = _step_name(step)
        if isinstance(step, pp.ExampleStep):
            if step.uses_rng:
                raise ValueError(
                    f"Task {task_name!r}: step {index} ({name}) comes before pp.CacheMarker() but "
                    "draws random numbers (uses_rng=True): what it draws depends on the seed, so "
                    "it cannot be cached. Move it after the marker (random steps such as masking "
                    "run online), or, if it never uses its rng, make it an ExampleStep with "
                    "uses_rng = False.")
        else:
            raise ValueError(
                f"Task {task_name!r}: step {index} ({name}) comes before pp.CacheMarker() but is "
                "a stream step: it sees the examples in their shuffled order, so its output "
                "depends on the seed and cannot be cached per example. Move it after the "
                "marker; only per-example steps with uses_rng = False (Rekey, Tokenize, "
                "AppendEos, Filter) may come before it.")


def _step_name(step) -> str:
    if isinstance(step, pp.FunctionStep):
        return getattr(step.fn, "__qualname__", repr(step.fn))
    return type(step).__name__


def steps_before_marker(task) -> tuple[pp.Step, ...]:
    position = marker_position(task.preprocessors)
    if position is None:
        raise UserError(f"Task {task.name!r} has no cache marker. Add pp.CacheMarker() to its "
                        "preprocessors after the deterministic steps (e.g. [Rekey, Tokenize, "
                        "pp.CacheMarker(), ConcatenateAndSplit, SpanCorruption]).")
    return tuple(task.preprocessors[:position])


class _NoLengths(Mapping):
    """``task_feature_lengths`` while building: the cache serves every length, so the
    steps before the marker may not read them."""

    def __init__(self, task_name: str):
        self._task_name = task_name

    def _refuse(self, *args):
        raise ValueError(
            f"Task {self._task_name!r}: a step before pp.CacheMarker() reads "
            "task_feature_lengths, but the cache is built once for every length. Move that step "
            "(e.g. Truncate) after the marker.")

    __getitem__ = __iter__ = __len__ = __contains__ = _refuse


class _NoSource(Sequence):
    """``ctx.source`` while building: steps before the marker see one example at a time."""

    sequential = False

    def __init__(self, task_name: str):
        self._task_name = task_name

    def _refuse(self, *args):
        raise ValueError(f"Task {self._task_name!r}: a step before pp.CacheMarker() reads other "
                         "examples of the split (ctx.source); move it after the marker.")

    __getitem__ = __len__ = _refuse


def build_context(task, split: str) -> pp.Context:
    return pp.Context(task_name=task.name, split=split, task_feature_lengths=_NoLengths(task.name),
                      output_features=task.output_features, source=_NoSource(task.name))


def preprocess(examples: Iterable[dict], steps: Sequence[pp.Step],
               ctx: pp.Context) -> Iterator[dict | None]:
    """The steps before the marker on each example, as the uncached pipeline applies them
    (``map(example, None, ctx)`` in order); ``None`` for an example a step dropped."""
    for example in examples:
        for step in steps:
            example = step.map(example, None, ctx)
            if example is None:
                break
        yield example


# -- Fingerprint ---------------------------------------------------------------------------------

def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@functools.lru_cache(maxsize=64)
def _portable(text: str) -> str:
    """Paths inside the embedded data folder without the machine's prefix, so a cache built
    from a checkout elsewhere (a Beam worker's) has the same fingerprint."""
    prefix = str(embedded.data_dir()).rstrip("/") + "/"
    return "<data>/" + text[len(prefix):] if text.startswith(prefix) else text


def _is_vocabulary(obj) -> bool:
    return not isinstance(obj, type) and hasattr(obj, "encode") and hasattr(obj, "vocab_size")


def _function_identity(fn) -> dict:
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = code.co_code.hex() if code is not None else repr(fn)
    identity = {"function": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}",
                "source_sha256": _sha256(text)[:16]}
    defaults = getattr(fn, "__defaults__", None)
    if defaults:
        identity["defaults"] = describe(defaults)
    closure = getattr(fn, "__closure__", None)
    if closure:
        try:
            identity["closure"] = [describe(cell.cell_contents) for cell in closure]
        except ValueError:  # an empty cell
            identity["closure"] = "<empty cell>"
    return identity


def describe(obj, depth: int = 0):
    """A JSON value that stays the same across processes and machines for equal
    configurations: dataclasses by class and fields, functions by name and source text,
    vocabularies by ``vocabularies.identity``, no memory addresses."""
    if depth > 12:
        return "<too deep>"
    nested = functools.partial(describe, depth=depth + 1)
    if obj is None or isinstance(obj, (bool, int, float)):
        return obj
    if isinstance(obj, str):
        return _portable(obj)
    if isinstance(obj, (bytes, bytearray)):
        return {"bytes_sha256": _sha256(bytes(obj))[:16]}
    if isinstance(obj, np.ndarray):
        return {"array": obj.dtype.str, "shape": list(obj.shape),
                "sha256": _sha256(np.ascontiguousarray(obj).tobytes())[:16]}
    if isinstance(obj, np.generic):
        return nested(obj.item())
    if isinstance(obj, Mapping):
        return {"map": [[nested(k), nested(v)] for k, v in sorted(obj.items(), key=lambda kv:
                                                                   repr(kv[0]))]}
    if isinstance(obj, (list, tuple)):
        return [nested(item) for item in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((nested(item) for item in obj), key=repr)
    if isinstance(obj, type):
        return {"class": f"{obj.__module__}.{obj.__qualname__}"}
    if isinstance(obj, functools.partial):
        return {"partial": nested(obj.func), "args": nested(obj.args),
                "keywords": nested(obj.keywords)}
    if inspect.ismethod(obj):
        return {"method": _function_identity(obj.__func__), "self": nested(obj.__self__)}
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethoddescriptor(obj):
        return _function_identity(obj)
    if _is_vocabulary(obj):
        return {"vocabulary": vocabularies.identity(obj)}
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if dataclasses.is_dataclass(obj):
        return {"class": kind, "fields": {f.name: nested(getattr(obj, f.name))
                                          for f in dataclasses.fields(obj)}}
    state = getattr(obj, "__dict__", None)
    if state is not None:
        return {"class": kind, "state": nested({k: v for k, v in state.items()
                                                if not k.startswith("_")})}
    if callable(obj):
        return _function_identity(obj)
    return {"class": kind, "repr": re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))}


def fingerprint_parts(task) -> dict:
    """What the fingerprint is made of; ``info.json`` keeps it, so a stale cache can say
    which part changed."""
    return {
        "format_version": FORMAT_VERSION,
        "task": task.name,
        "source": describe(task.source),
        "steps": [describe(step) for step in steps_before_marker(task)],
        "output_features": {
            name: {"vocabulary": vocabularies.identity(feature.vocabulary),
                   "add_eos": feature.add_eos, "required": feature.required}
            for name, feature in task.output_features.items()},
    }


def fingerprint_of(parts: Mapping) -> str:
    return _sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")))[:16]


def fingerprint(task) -> str:
    return fingerprint_of(fingerprint_parts(task))


# -- Records: one per source example --------------------------------------------------------------

_EXT_ARRAY, _EXT_SCALAR, _EXT_TUPLE = 1, 2, 3


def _pack(obj) -> bytes:
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True, strict_types=True)


def _pack_default(obj):
    """What msgpack does not store as it is (``strict_types``: subclasses land here too)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("the cache stores numeric and fixed-width string arrays, not object "
                            "arrays; make the step before the marker return such an array")
        array = np.ascontiguousarray(obj)
        return msgpack.ExtType(_EXT_ARRAY, _pack([array.dtype.str, list(array.shape),
                                                  array.tobytes()]))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(_EXT_SCALAR, _pack([obj.dtype.str, obj.tobytes()]))
    if isinstance(obj, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _pack(list(obj)))
    for plain in (bool, int, float, str, bytes, list):
        if isinstance(obj, plain):
            return plain(obj)
    if isinstance(obj, bytearray):
        return bytes(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"the cache cannot store a {type(obj).__name__} ({obj!r:.60}); steps before "
                    "the marker must return dicts of numpy arrays, strings, bytes and numbers")


def _ext_hook(code: int, data: bytes):
    if code == _EXT_ARRAY:
        dtype, shape, raw = _unpack(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    if code == _EXT_SCALAR:
        dtype, raw = _unpack(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    return msgpack.ExtType(code, data)


def _unpack(data: bytes):
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def encode(example: dict | None) -> bytes:
    """An example as a record (msgpack; numpy arrays keep dtype and shape); a dropped
    example (``None``) is the empty record."""
    if example is None:
        return b""
    if not isinstance(example, dict):
        raise TypeError(f"a step before the cache marker returned a {type(example).__name__}, "
                        "not a dict")
    return _pack(example)


def decode(record: bytes) -> dict | None:
    return None if not record else _unpack(record)


# -- Building (pure parts; ``t5x_like.cache_tasks`` runs them with Beam) --------------------------

@dataclasses.dataclass(frozen=True)
class Unit:
    """One shard to build: source examples ``[start, stop)`` of a split (``stop=None``: to
    the end), or the whole source file ``file_index`` (``path``) of a file source."""

    task: str
    split: str
    part: int
    start: int
    stop: int | None
    file_index: int | None = None
    path: str | None = None

    @property
    def shard_name(self) -> str:
        if self.file_index is None:
            return f"{self.split}-{self.part:05d}.array_record"
        return f"{self.split}-file{self.file_index:05d}.array_record"

    @property
    def order(self) -> tuple[int, int]:
        return (-1 if self.file_index is None else self.file_index, self.start)


def is_file_source(source) -> bool:
    return isinstance(source, sources.FileSource)


def plan_units(task, split: str, examples_per_shard: int = DEFAULT_EXAMPLES_PER_SHARD
               ) -> list[Unit]:
    """The shards of a split: one per source file for a file source (a worker reads the
    file once and writes its shard; whole files are also how such a source is sharded
    across hosts), else ranges of ``examples_per_shard`` source examples."""
    if split not in task.splits:
        raise UserError(f"Task {task.name!r} has no split {split!r}; it has {task.splits}.")
    if is_file_source(task.source):
        try:
            files = task.source.files()
        except FileNotFoundError as e:
            raise UserError(f"Task {task.name!r}: {e}") from None
        return [Unit(task.name, split, 0, 0, None, index, path) for index, path in enumerate(files)]
    total = len(load_records(task, Unit(task.name, split, 0, 0, None)))
    size = max(1, int(examples_per_shard))
    starts = range(0, total, size) if total else [0]
    return [Unit(task.name, split, part, start, min(start + size, total))
            for part, start in enumerate(starts)]


def load_records(task, unit: Unit) -> Sequence[dict]:
    """The raw examples ``unit`` reads from: its file's, or the split's."""
    if unit.path is not None:
        return task.source.load_files(unit.split, (unit.path,))
    records = task.source.get(unit.split)
    if getattr(records, "sequential", False):
        raise UserError(f"Task {task.name!r}: split {unit.split!r} is read from TFRecord files, "
                        "which cannot be read by index; prepare the TFDS dataset as array_record "
                        "(tfds build --file_format=array_record) to cache it.")
    return records


def empty_stats() -> dict:
    return {"source_examples": 0, "examples": 0, "tokens": {}, "max_length": {}}


def add_stats(stats: dict, example: dict | None, features: Iterable[str]) -> None:
    stats["source_examples"] += 1
    if example is None:
        return
    stats["examples"] += 1
    for key in features:
        value = example.get(key)
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            stats["tokens"][key] = stats["tokens"].get(key, 0) + int(value.size)
            stats["max_length"][key] = max(stats["max_length"].get(key, 0), int(value.size))


def merge_stats(many: Iterable[dict]) -> dict:
    total = empty_stats()
    for stats in many:
        total["source_examples"] += stats["source_examples"]
        total["examples"] += stats["examples"]
        for key, value in stats["tokens"].items():
            total["tokens"][key] = total["tokens"].get(key, 0) + value
        for key, value in stats["max_length"].items():
            total["max_length"][key] = max(total["max_length"].get(key, 0), value)
    return total


def write_shard(task, unit: Unit, records: Sequence[dict], output_dir: str) -> dict:
    """Runs the steps before the marker on the unit's examples and writes them as one
    ArrayRecord file (``group_size:1``: grain's random access) in
    ``output_dir/TASK/``. ArrayRecord writes local files only, so a bucket shard is
    written to a local temporary file first and then copied. Returns the shard's entry
    for ``info.json`` with its statistics."""
    from array_record.python.array_record_module import ArrayRecordWriter

    ctx = build_context(task, unit.split)
    steps = steps_before_marker(task)
    stop = len(records) if unit.stop is None else min(unit.stop, len(records))
    examples = (records[i] for i in range(unit.start, stop))
    stats = empty_stats()
    target = storage.path(output_dir) / task.name / unit.shard_name
    remote = storage.is_remote(target)
    if remote:
        handle, local = tempfile.mkstemp(suffix=".array_record", prefix="t5x_like_cache_")
        os.close(handle)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        local = f"{target}.tmp-{os.getpid()}"
    try:
        writer = ArrayRecordWriter(local, "group_size:1")
        if not writer.ok():
            raise OSError(f"cannot write {local}")
        try:
            for example in preprocess(examples, steps, ctx):
                add_stats(stats, example, task.output_features)
                writer.write(encode(example))
        except DataError as e:  # about one example: named with its record
            if not e.lookup:
                raise
            raise sources.located(e, [task.source], unit.split, f"Task {task.name!r}") from None
        writer.close()
        if remote:
            epath.Path(local).copy(target, overwrite=True)
        else:
            os.replace(local, target)
    finally:
        if os.path.exists(local):
            os.remove(local)
    return {"task": unit.task, "split": unit.split, "file": unit.shard_name,
            "records": stats["source_examples"], "file_index": unit.file_index,
            "source_file": None if unit.path is None else _portable(unit.path),
            "order": list(unit.order), "stats": stats}


def split_info(task, split: str, shards: Sequence[dict]) -> dict:
    """A split's entry in ``info.json`` from its shards' entries (any order)."""
    shards = sorted(shards, key=lambda shard: tuple(shard["order"]))
    stats = merge_stats(shard["stats"] for shard in shards)
    file_sharded = is_file_source(task.source)
    num_files = len({shard["file_index"] for shard in shards}) if file_sharded else 0
    return {
        "source_examples": stats["source_examples"], "examples": stats["examples"],
        "dropped": stats["source_examples"] - stats["examples"], "tokens": stats["tokens"],
        "max_length": stats["max_length"], "file_sharded": file_sharded, "num_files": num_files,
        "shards": [{"file": shard["file"], "records": shard["records"],
                    "file_index": shard["file_index"], "source_file": shard["source_file"]}
                   for shard in shards],
    }


def task_folder(output_dir: str, task_name: str):
    return storage.path(output_dir) / task_name


def invalidate(output_dir: str, task_name: str) -> None:
    """Removes ``info.json`` first: from here until the new one is written, the folder
    is not a cache."""
    info = task_folder(output_dir, task_name) / INFO_FILE
    if info.exists():
        info.unlink()


def write_info(task, output_dir: str, splits: Mapping[str, dict], modules: Sequence[str] = (),
               expected_fingerprint: str | None = None) -> dict:
    """Writes ``info.json`` (last: it makes the folder a cache) and removes shard files
    of earlier builds that it does not list."""
    parts = fingerprint_parts(task)
    current = fingerprint_of(parts)
    if expected_fingerprint is not None and current != expected_fingerprint:
        raise RuntimeError(
            f"Task {task.name!r} has fingerprint {current} here but "
            f"{expected_fingerprint} where the build started: the workers define the task "
            "differently (other code, vocabulary or data files). Give them the same code.")
    info = {"format_version": FORMAT_VERSION, "task": task.name,
            "fingerprint": current, "fingerprint_parts": parts,
            "modules": list(modules), "splits": {name: splits[name] for name in sorted(splits)}}
    folder = task_folder(output_dir, task.name)
    folder.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(folder / INFO_FILE, json.dumps(info, indent=1, sort_keys=True) + "\n")
    listed = {shard["file"] for split in splits.values() for shard in split["shards"]}
    for file in folder.glob("*.array_record*"):  # earlier builds' shards, dead builds' temps
        if file.name not in listed:
            file.unlink()
    return info


# -- Reading --------------------------------------------------------------------------------------

def add_cache_dirs(*dirs: str) -> None:
    """Cache directories searched (after ``T5X_LIKE_CACHE_DIR``'s) by every task of this
    process; seqio's ``add_global_cache_dirs``."""
    for folder in dirs:
        if folder and folder not in _added_cache_dirs:
            _added_cache_dirs.append(os.fspath(folder))


def clear_cache_dirs() -> None:
    _added_cache_dirs.clear()


def cache_dirs() -> list[str]:
    from_env = [d.strip() for d in os.environ.get(CACHE_DIR_ENV, "").split(",") if d.strip()]
    return from_env + [d for d in _added_cache_dirs if d not in from_env]


def build_command(task_name: str, output_dir: str, modules: Sequence[str] = (),
                  splits: Sequence[str] | None = None) -> str:
    command = f"{COMMAND} --tasks={task_name} --output_dir={output_dir}"
    command += "".join(f" --module={module}" for module in modules)
    if splits:
        command += f" --splits={','.join(splits)}"
    return command


def _differences(saved: Mapping, current: Mapping) -> str:
    changed = []
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) == current.get(key):
            continue
        if key == "output_features" and isinstance(saved.get(key), Mapping):
            for name in sorted(set(saved[key]) | set(current.get(key, {}))):
                was, now = saved[key].get(name), current[key].get(name)
                if was != now:
                    changed.append(f"output feature {name!r} (cached {json.dumps(was)}, task now "
                                   f"{json.dumps(now)})")
        elif key == "steps":
            changed.append("the steps before the cache marker")
        else:
            changed.append({"source": "the source", "task": "the task name",
                            "format_version": "the cache format version"}.get(key, key))
    return "; ".join(changed) or "nothing recorded (an older cache)"


def lookup(task, split: str, use_cached: bool | None = None) -> CachedSplit | None:
    """The cache to read ``split`` of ``task`` from, or ``None`` to read the source.

    ``use_cached``: ``None`` reads a cache when a cache directory has one (a stale one
    is an error, never silently skipped), ``True`` insists on one, ``False`` reads the
    source (unless the marker is ``required``)."""
    position = marker_position(task.preprocessors)
    required = position is not None and task.preprocessors[position].required
    if position is None:
        if use_cached:
            raise UserError(f"Task {task.name!r} has no cache marker, so it has no cache; add "
                            "pp.CacheMarker() to its preprocessors or read it uncached.")
        return None
    if use_cached is False and not required:
        return None
    dirs = cache_dirs()
    for folder in dirs:
        info_file = task_folder(folder, task.name) / INFO_FILE
        if info_file.exists():
            return _open(task, split, folder, json.loads(info_file.read_text()))
    if use_cached or required:
        why = "its marker is required" if required else "use_cached=True"
        where = (f"in {', '.join(dirs)}" if dirs else
                 f"(no cache directory: set {CACHE_DIR_ENV}=DIR)")
        raise UserError(f"Task {task.name!r} must be read from its cache ({why}), but there is "
                        f"none {where}. Build it: "
                        f"{build_command(task.name, dirs[0] if dirs else 'DIR')}")
    return None


def _open(task, split: str, folder: str, info: dict) -> CachedSplit:
    parts = fingerprint_parts(task)
    current = fingerprint_of(parts)
    modules = info.get("modules") or []
    if info.get("fingerprint") != current:
        raise UserError(
            f"Task {task.name!r}: the cache in {storage.display(task_folder(folder, task.name))} "
            f"has fingerprint {info.get('fingerprint')}, but the task now has {current}: "
            f"{_differences(info.get('fingerprint_parts') or {}, parts)} changed. Rebuild it: "
            f"{build_command(task.name, folder, modules, sorted(info.get('splits', {})))}  "
            f"(or read the task uncached: use_cached=False, or drop {folder} from "
            f"{CACHE_DIR_ENV}).")
    if split not in info.get("splits", {}):
        raise UserError(
            f"Task {task.name!r}: the cache in {storage.display(task_folder(folder, task.name))} "
            f"has the splits {sorted(info.get('splits', {}))}, not {split!r}. Build it: "
            f"{build_command(task.name, folder, modules, [split])}")
    return CachedSplit(task.name, split, _local_folder(task_folder(folder, task.name), info, split),
                       info["splits"][split], marker_position(task.preprocessors))


def _local_folder(folder, info: dict, split: str) -> str:
    """``folder`` itself on disk. ArrayRecord reads local files only, so a bucket cache's
    shards of ``split`` are copied once to ``~/.cache/t5x_like/data_cache`` (per
    fingerprint; a copy is checked by size)."""
    if not storage.is_remote(folder):
        return str(folder)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    local = os.path.join(base, "t5x_like", "data_cache", _sha256(str(folder))[:16],
                         info["fingerprint"])
    os.makedirs(local, exist_ok=True)
    for shard in info["splits"][split]["shards"]:
        if not shard["records"]:
            continue
        remote, target = folder / shard["file"], os.path.join(local, shard["file"])
        if os.path.exists(target) and os.path.getsize(target) == storage.file_size(remote):
            continue
        partial = f"{target}.tmp-{os.getpid()}"
        remote.copy(epath.Path(partial), overwrite=True)
        os.replace(partial, target)
    return local


@dataclasses.dataclass(frozen=True)
class CachedSplit:
    """One split of a task's cache: its shards, read in source order."""

    task_name: str
    split: str
    folder: str
    info: dict
    marker: int

    def shard(self, shard_index: int, num_shards: int) -> CachedRecords:
        """The cached records of ``Source.shard(split, shard_index, num_shards)``: whole
        source files ``shard_index::num_shards`` when a file source has at least
        ``num_shards`` files, else every ``num_shards``-th example."""
        shards = self.info["shards"]
        counts = [shard["records"] for shard in shards]
        total = sum(counts)
        if total == 0:
            raise DataError(f"split {self.split!r} has no examples (the cache in {self.folder} "
                            "holds none): the data files were empty when it was built.")
        starts = np.cumsum([0] + counts[:-1])
        if self.info.get("file_sharded") and num_shards > 1 and \
                self.info.get("num_files", 0) >= num_shards:
            files = sorted({shard["file_index"] for shard in shards})[shard_index::num_shards]
            mine = set(files)
            ranges = [np.arange(start, start + count, dtype=np.int64)
                      for start, count, shard in zip(starts, counts, shards, strict=False)
                      if shard["file_index"] in mine]
            indices = np.concatenate(ranges) if ranges else np.zeros(0, np.int64)
            if not len(indices):
                sources_read = sorted({shard["source_file"] for shard in shards
                                       if shard["file_index"] in mine})
                raise DataError(
                    f"Shard {shard_index} of {num_shards} reads the files {sources_read}, which "
                    f"hold no {self.split!r} examples; use fewer shards (in training: a smaller "
                    "data_streams) or fewer, larger files.")
        else:
            indices = np.arange(shard_index, total, num_shards, dtype=np.int64)
        stored = [shard for shard in shards if shard["records"]]
        return CachedRecords([os.path.join(self.folder, shard["file"]) for shard in stored],
                             [shard["records"] for shard in stored], indices)

    def apply_steps(self, ds, steps: Sequence[pp.Step], ctx: pp.Context, seed: int):
        """The steps after the marker, numbered as in the uncached pipeline; examples the
        cached steps dropped are skipped first, where the uncached steps skip them."""
        ds = pp.base._PlainMapDataset(ds, _keep)
        return pp.apply_steps(ds, steps, ctx, seed, start=self.marker + 1)


def _keep(example):
    return example


class CachedRecords(Sequence):
    """Cached examples of one shard by index (``None``: dropped before the marker);
    picklable for grain's worker processes (each opens its own readers).

    Records are read with ArrayRecord's range read, ``read(i, i + 1)``: one record by
    ``read([i])``, which grain's ``ArrayRecordDataSource`` uses, costs time linear in the
    file's record count in array_record 0.8.6 (60 us a record at 20,000 records, 380 us at
    117,000), the range read about 7 us at any size."""

    def __init__(self, files: Sequence[str], counts: Sequence[int], indices: np.ndarray):
        self._files, self._indices = list(files), indices
        self._ends = np.cumsum(np.asarray(counts, np.int64))
        self._readers: list = [None] * len(self._files)

    def __getstate__(self):
        return {"_files": self._files, "_indices": self._indices, "_ends": self._ends}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._readers = [None] * len(self._files)

    def __len__(self):
        return len(self._indices)

    def _read(self, key: int) -> bytes:
        file = int(np.searchsorted(self._ends, key, side="right"))
        reader = self._readers[file]
        if reader is None:
            from array_record.python.array_record_module import ArrayRecordReader
            reader = self._readers[file] = ArrayRecordReader(self._files[file],
                                                             "readahead_buffer_size:0")
        position = key - (int(self._ends[file - 1]) if file else 0)
        return reader.read(position, position + 1)[0]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return decode(self._read(int(self._indices[index])))


class SourceShard(Sequence):
    """``ctx.source`` of a cached task: the raw shard the uncached pipeline would pass,
    read only if a step after the marker asks for it (next-sentence pairs do)."""

    def __init__(self, source, split: str, shard_index: int, num_shards: int):
        self._args = (source, split, shard_index, num_shards)
        self._records = None

    def _load(self):
        if self._records is None:
            source, split, shard_index, num_shards = self._args
            self._records = source.shard(split, shard_index, num_shards)
        return self._records

    @property
    def sequential(self) -> bool:
        return getattr(self._load(), "sequential", False)

    def __len__(self):
        return len(self._load())

    def __getitem__(self, index):
        return self._load()[index]

