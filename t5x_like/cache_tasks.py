"""Builds the preprocessing cache of tasks with Apache Beam (seqio's ``cache_tasks_main``).

    python -m t5x_like.cache_tasks --tasks=embedded_en_span_corruption --output_dir=/tmp/cache
    python -m t5x_like.cache_tasks --tasks=my_task --module=my_tasks --output_dir=DIR \\
        --direct_num_workers=2 --direct_running_mode=multi_processing
    python -m t5x_like.cache_tasks --tasks=c4_span_corruption --output_dir=gs://BUCKET/cache \\
        --runner=DataflowRunner --project=P --region=R --temp_location=gs://BUCKET/tmp

Runs the steps before each task's ``pp.CacheMarker()`` over every example of its splits
and writes ``OUTPUT_DIR/TASK/``: ArrayRecord shards in source order, then ``info.json``
(fingerprint, shards, examples and tokens per feature). Mixtures stand for their tasks.
Flags this command does not know go to Beam (``--runner``, default DirectRunner, and
the runner's own options). Read a cache by pointing ``T5X_LIKE_CACHE_DIR`` at
OUTPUT_DIR; see docs/preprocessing_cache.md.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import sys
import threading
import time

from t5x_like import cli_flags, errors
from t5x_like.data import cache, dataset_providers
from t5x_like.errors import UserError
from t5x_like.system import progress, storage

# Imports inside functions: Apache Beam (the `beam` extra) loads only for a Beam run, not the
# in-process one.


class _DropApitoolsWarning(logging.Filter):
    """Beam's BigQuery module warns on import when the ``gcp`` extra is missing; this
    command never uses BigQuery."""

    def filter(self, record):
        return "apitools not found" not in record.getMessage()


def _import_beam():
    root = logging.getLogger()
    quiet, handler = _DropApitoolsWarning(), logging.NullHandler()
    root.addFilter(quiet)
    added = not root.handlers
    if added:  # logging.warning would otherwise install a stderr handler for good
        root.addHandler(handler)
    try:
        import apache_beam
        return apache_beam
    except ImportError:
        return None
    finally:
        root.removeFilter(quiet)
        if added:
            root.removeHandler(handler)


beam = _import_beam()
_DoFn = beam.DoFn if beam is not None else object
_CombineFn = beam.CombineFn if beam is not None else object

OUR_FLAGS = ("--tasks", "--output_dir", "--module", "--splits", "--examples_per_shard",
             "--overwrite")


def _registry(modules):
    """Tasks and mixtures, with the user's modules imported (also in Beam workers)."""
    cli_flags.import_modules(modules)
    return dataset_providers


class _TaskDoFn(_DoFn):
    """A DoFn that looks tasks up in its worker's registry, checking that each has the
    fingerprint the build started with (the same code and data everywhere)."""

    def __init__(self, modules, fingerprints):
        self._modules, self._fingerprints = list(modules), dict(fingerprints)

    def setup(self):
        self._td = _registry(self._modules)
        self._tasks = {}

    def task(self, name):
        if name not in self._tasks:
            task = self._td.TaskRegistry.get(name)
            found = cache.fingerprint(task)
            if found != self._fingerprints[name]:
                raise RuntimeError(
                    f"Task {name!r} has fingerprint {found} in this Beam worker but "
                    f"{self._fingerprints[name]} where the build started: give the workers the "
                    "same code, vocabulary and --module.")
            self._tasks[name] = task
        return self._tasks[name]


class _WriteShard(_TaskDoFn):
    """A unit -> an ArrayRecord shard file, and its ``info.json`` entry with statistics."""

    def __init__(self, modules, fingerprints, output_dir):
        super().__init__(modules, fingerprints)
        self._output_dir = output_dir

    def process(self, unit):
        task = self.task(unit.task)
        records = cache.load_records(task, unit)
        yield (unit.task, unit.split), cache.write_shard(task, unit, records, self._output_dir)


class _CollectShards(_CombineFn):
    """A split's shard entries, gathered (the statistics are summed in ``split_info``)."""

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, shard):
        accumulator.append(shard)
        return accumulator

    def merge_accumulators(self, accumulators):
        return [shard for accumulator in accumulators for shard in accumulator]

    def extract_output(self, accumulator):
        return accumulator


class _WriteInfo(_TaskDoFn):
    """A task's splits -> ``info.json``, written last."""

    def __init__(self, modules, fingerprints, output_dir):
        super().__init__(modules, fingerprints)
        self._output_dir = output_dir

    def process(self, item):
        name, splits = item
        task = self.task(name)
        infos = {split: cache.split_info(task, split, shards) for split, shards in splits}
        info = cache.write_info(task, self._output_dir, infos, self._modules,
                                expected_fingerprint=self._fingerprints[name])
        yield name, info["fingerprint"]


def build_pipeline(pipeline, units, fingerprints, output_dir, modules):
    """The Beam graph: shards to write -> shard files and entries -> per-split entries ->
    ``info.json`` per task."""
    shards = (
        pipeline
        | "Shards" >> beam.Create(units)
        | "Spread shards" >> beam.Reshuffle()
        | "Write shards" >> beam.ParDo(_WriteShard(modules, fingerprints, output_dir)))
    return (
        shards
        | "Collect per split" >> beam.CombinePerKey(_CollectShards())
        | "By task" >> beam.Map(lambda item: (item[0][0], (item[0][1], item[1])))
        | "Group splits" >> beam.GroupByKey()
        | "Write info.json" >> beam.ParDo(_WriteInfo(modules, fingerprints, output_dir)))


def _leaf_tasks(td, name: str, seen: list[str]) -> None:
    if name in td.MixtureRegistry.names():
        for component, _ in td.MixtureRegistry.get(name).components:
            _leaf_tasks(td, component, seen)
        return
    if name not in td.TaskRegistry.names():
        hint = td.suggest(name, td.TaskRegistry.names() + td.MixtureRegistry.names())
        raise UserError(f"--tasks: no task or mixture named {name!r}.{hint} List them with "
                        "python -m t5x_like.tasks list (and --module=YOUR.TASKS for yours).")
    if name not in seen:
        seen.append(name)


def _check_beam_args(beam_args) -> None:
    """A flag Beam does not know would be dropped with a warning; one that looks like ours
    is a typo."""
    for arg in beam_args:
        if not arg.startswith("--"):
            continue  # the value of a Beam flag given as "--flag value"
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, OUR_FLAGS, n=1, cutoff=0.75)
        if close and name not in OUR_FLAGS:
            raise UserError(f"unknown flag {name}; did you mean {close[0]}?")


def _pipeline_options(beam_args):
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    options = PipelineOptions(list(beam_args))
    if not options.view_as(StandardOptions).runner:
        options.view_as(StandardOptions).runner = "DirectRunner"
    return options


@errors.command_line("cache_tasks")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m t5x_like.cache_tasks", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True,
                        help="Comma-separated tasks or mixtures (a mixture: all its tasks).")
    parser.add_argument("--output_dir", required=True,
                        help="Cache directory (local or gs://, s3://); each task gets a folder.")
    cli_flags.add_module_flag(parser)
    parser.add_argument("--splits", default="",
                        help="Comma-separated splits (default: every split of each task).")
    parser.add_argument("--examples_per_shard", type=int,
                        default=cache.DEFAULT_EXAMPLES_PER_SHARD,
                        help="Source examples per ArrayRecord shard; a file source (text, "
                             "JSONL) gets one shard per file instead.")
    parser.add_argument("--overwrite", action="store_true",
                        help="Rebuild caches that are already complete and current.")
    args, beam_args = parser.parse_known_args(argv)
    _check_beam_args(beam_args)
    if beam is None:
        raise UserError("Apache Beam is not installed. Install it (without dependency "
                        "resolution, see beam-requirements.txt): pip install -c constraints.txt "
                        "--no-deps -r beam-requirements.txt")
    if args.examples_per_shard < 1:
        raise UserError(f"--examples_per_shard={args.examples_per_shard}; use 1 or more.")
    try:
        td = _registry(args.module)
    except ValueError as e:  # a task defined wrongly in the user's module (e.g. its marker)
        raise UserError(f"--module: {e}") from None
    names: list[str] = []
    for name in filter(None, (n.strip() for n in args.tasks.split(","))):
        _leaf_tasks(td, name, names)
    if not names:
        raise UserError("--tasks is empty; name tasks or mixtures, e.g. --tasks=embedded_en_lm.")
    cli_flags.check_writable_folder(args.output_dir, "--output_dir")
    wanted_splits = [s.strip() for s in args.splits.split(",") if s.strip()]

    units, fingerprints, skipped = [], {}, []
    for name in names:
        task = td.TaskRegistry.get(name)
        cache.steps_before_marker(task)  # UserError without a marker
        try:
            fingerprints[name] = cache.fingerprint(task)
        except (OSError, ValueError) as e:
            raise UserError(f"Task {name!r}: cannot fingerprint it ({e}).") from None
        splits = wanted_splits or list(task.splits)
        if not args.overwrite and _is_current(args.output_dir, name, fingerprints[name], splits):
            skipped.append(name)
            continue
        for split in splits:
            split_units = cache.plan_units(task, split, args.examples_per_shard)
            if split == splits[0]:
                _dry_run(task, split_units[0])
            units += split_units
    for name in skipped:
        print(f"{name}: cache in {_folder(args.output_dir, name)} is current (fingerprint "
              f"{fingerprints[name]}); --overwrite rebuilds it.")
    building = [n for n in names if n not in skipped]
    if not building:
        return 0
    for name in building:
        cache.invalidate(args.output_dir, name)
    options = _pipeline_options(beam_args)
    started = time.perf_counter()
    with ShardsWritten(args.output_dir, units), _data_errors_unwrapped():
        with beam.Pipeline(options=options) as pipeline:
            build_pipeline(pipeline, units, {n: fingerprints[n] for n in building},
                           args.output_dir, args.module)
    seconds = time.perf_counter() - started
    _report(args.output_dir, building, seconds)
    return 0


class _DropDataErrorTracebacks(logging.Filter):
    """Beam logs a failed DoFn's traceback before it re-raises; a data error is said once,
    as its one line, by the command line."""

    def filter(self, record):
        return not (record.exc_info and errors.data_error_in(record.exc_info[1]))


@contextlib.contextmanager
def _data_errors_unwrapped():
    """A bad record a Beam worker met reaches the command line as its ``DataError`` (one
    line), not as the exception the runner wrapped it in: Beam re-raises it with the
    step's name over the original in this process, and as a traceback's text from
    worker processes (``errors.data_error_in``). Every other failure passes as it is."""
    beam_logger, quiet = logging.getLogger("apache_beam.runners.common"), _DropDataErrorTracebacks()
    beam_logger.addFilter(quiet)
    try:
        yield
    except Exception as e:
        found = errors.data_error_in(e)
        if found is None:
            raise
        raise found from None
    finally:
        beam_logger.removeFilter(quiet)


class ShardsWritten:
    """Progress of a pipeline however it runs (in this process, worker processes, Dataflow):
    a thread counts the shard files in the output folders every ``interval_s`` (a shard
    appears whole, renamed or copied into place when written)."""

    def __init__(self, output_dir: str, units, interval_s: float = 2.0):
        self._folders: dict[str, set[str]] = {}
        for unit in units:
            self._folders.setdefault(unit.task, set()).add(unit.shard_name)
        self._root, self._interval_s = storage.path(output_dir), interval_s
        self._stop = threading.Event()
        self._meter = progress.Meter("cache_tasks", len(units), "shards",
                                     from_first_advance=False)
        self._thread = threading.Thread(target=self._watch, name="cache-progress", daemon=True)

    def written(self) -> int:
        count = 0
        for task, names in self._folders.items():
            folder = self._root / task
            if folder.exists():
                count += len(names & {p.name for p in folder.iterdir()})
        return count

    def _watch(self) -> None:
        while True:
            done = self.written()
            if done > self._meter.done:
                self._meter.advance(done - self._meter.done)
            if self._stop.wait(self._interval_s):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        written = self.written() if exc[0] is None else 0
        if written > self._meter.done:
            self._meter.advance(written - self._meter.done)
        self._meter.close()


def _folder(output_dir: str, name: str) -> str:
    return storage.display(cache.task_folder(output_dir, name))


def _is_current(output_dir: str, name: str, fingerprint: str, splits) -> bool:
    info_file = cache.task_folder(output_dir, name) / cache.INFO_FILE
    if not info_file.exists():
        return False
    info = json.loads(info_file.read_text())
    return info.get("fingerprint") == fingerprint and set(splits) <= set(info.get("splits", {}))


def _dry_run(task, unit) -> None:
    """The first example through the steps before the marker, here: a step that cannot
    be cached (it reads lengths or other examples) fails now, with its message, rather
    than in a Beam worker."""
    ctx = cache.build_context(task, unit.split)
    try:
        for step in cache.steps_before_marker(task):
            step.check(ctx)
        records = cache.load_records(task, unit)
        first = [records[0]] if len(records) else []
        list(cache.preprocess(first, cache.steps_before_marker(task), ctx))
    except UserError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"Task {task.name!r}, split {unit.split!r}: {e}") from None


def _report(output_dir: str, names, seconds: float) -> None:
    print(f"built {len(names)} task cache(s) in {seconds:.1f} s")
    for name in names:
        info_file = cache.task_folder(output_dir, name) / cache.INFO_FILE
        if not info_file.exists():  # e.g. a runner that returns before the job ends
            print(f"{name}: {_folder(output_dir, name)} (info.json not written yet)")
            continue
        info = json.loads(info_file.read_text())
        for split, entry in info["splits"].items():
            tokens = ", ".join(f"{k} {v:,}" for k, v in sorted(entry["tokens"].items()))
            print(f"{name} {split}: {entry['examples']:,} examples ({entry['dropped']:,} dropped) "
                  f"in {len(entry['shards'])} shard(s); tokens: {tokens or 'none'}")
        print(f"{name}: {_folder(output_dir, name)} fingerprint {info['fingerprint']}")


if __name__ == "__main__":
    # Run under the module's own name, so Beam pickles the DoFns by reference to
    # t5x_like.cache_tasks (importable in every worker), not to __main__.
    from t5x_like import cache_tasks as _module
    sys.exit(_module.main())
