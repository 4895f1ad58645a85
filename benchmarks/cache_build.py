"""Preprocessing-cache build of the embedded corpus with Beam's DirectRunner: 1 vs 2
worker processes, and reading the task cached vs uncached.

    .venv/bin/python benchmarks/cache_build.py [--tasks embedded_en_span_corruption]
        [--workers 0,1,2] [--repeats 3] [--examples_per_shard 20000] [--read 20000] [--smoke]

Each row runs ``python -m t5x_like.cache_tasks`` in a fresh process into a new folder
with ``--direct_running_mode=multi_processing --direct_num_workers=N`` (N = 0: the
DirectRunner's default, ``in_memory``, in the command's own process). ``seconds`` is
the Beam pipeline's time as the command reports it (tokenizing and writing every
example of both splits, plus starting the workers); ``wall`` adds the command's start
(imports, registry, fingerprint, a dry run of the first example); ``cpu s`` is the CPU
time of the command and its worker processes. With ``--repeats`` the rows run in
rotation and each keeps its fastest run (other load on the machine only slows a run
down). Examples and tokens
are those of ``info.json`` (all tasks and splits; the default is the whole embedded
corpus: English with the 8k SentencePiece vocabulary, and the multilingual mixture's
four byte-level tasks). ``--read N`` then times the first N training examples of
``--read_task`` through ``Task.get_dataset`` from the source and from the cache (the
steps after the marker still run: chunking and the objective's random choices).

``--smoke``: one build of the English task's validation split in the command's own process
(``--workers 0``) and 20 examples read from it, a check that the script runs.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import pathlib
import re
import resource
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def build(tasks: str, workers: int, examples_per_shard: int, folder: str,
          splits: str = "") -> dict:
    command = [sys.executable, "-m", "t5x_like.cache_tasks", f"--tasks={tasks}",
               f"--output_dir={folder}", f"--examples_per_shard={examples_per_shard}"]
    if splits:
        command.append(f"--splits={splits}")
    if workers:
        command += ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    cpu = _children_cpu() - cpu_before
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    seconds = float(re.search(r"built \d+ task cache\(s\) in ([\d.]+) s", done.stdout).group(1))
    examples = tokens = shards = 0
    for info_file in sorted(pathlib.Path(folder).glob("*/info.json")):  # mixtures: each task
        info = json.loads(info_file.read_text())
        for split in info["splits"].values():
            examples += split["examples"]
            tokens += sum(split["tokens"].values())
            shards += len(split["shards"])
    return {"workers": workers, "seconds": seconds, "wall": wall, "cpu": cpu,
            "examples": examples, "tokens": tokens, "shards": shards}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_rate(task_name: str, n: int, cache_dir: str, split: str = "train") -> tuple[float, float]:
    """Examples/s of the first ``n`` examples of ``split``, uncached and cached."""
    importlib.import_module("t5x_like.data")  # registers the built-in tasks
    from t5x_like.data import cache, dataset_providers
    cache.add_cache_dirs(cache_dir)
    task = dataset_providers.TaskRegistry.get(task_name)
    lengths = {"inputs": 512, "targets": 114}
    rates = []
    for use_cached in (False, True):
        ds = task.get_dataset(split, lengths, seed=0, use_cached=use_cached)
        iterator = iter(ds)
        next(iterator)  # opened, vocabulary and source loaded
        started = time.perf_counter()
        for _ in itertools.islice(iterator, n):
            pass
        rates.append(n / (time.perf_counter() - started))
    return rates[0], rates[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="embedded_en_span_corruption,"
                                           "embedded_multilingual_span_corruption")
    parser.add_argument("--workers", default="0,1,2",
                        help="Worker processes per row; 0: in_memory, in-process.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples_per_shard", type=int, default=20_000)
    parser.add_argument("--read", type=int, default=20_000,
                        help="Also time reading N examples cached vs uncached (0: skip).")
    parser.add_argument("--read_task", default="embedded_en_span_corruption")
    parser.add_argument("--smoke", action="store_true",
                        help="one small build and read: a check that the script runs")
    args = parser.parse_args(argv)
    splits, read_split = "", "train"
    if args.smoke:
        args.tasks, args.workers, args.repeats, args.read = args.read_task, "0", 1, 20
        splits = read_split = "validation"
    print(f"cores: {os.cpu_count()}; load average before: {os.getloadavg()[0]:.2f}; "
          f"tasks: {args.tasks}")
    best: dict[int, dict] = {}
    last = None
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for workers in [int(w) for w in args.workers.split(",")]:
                last = os.path.join(tmp, f"workers{workers}-{repeat}")
                row = build(args.tasks, workers, args.examples_per_shard, last, splits)
                print(f"  run {repeat + 1}: workers={workers} {row['seconds']:.1f} s",
                      flush=True)
                if workers not in best or row["seconds"] < best[workers]["seconds"]:
                    best[workers] = row
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        print()
        print("| workers | seconds | wall s | cpu s | examples | tokens | shards | examples/s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for row in best.values():
            workers = row["workers"] or "in-process (in_memory)"
            print(f"| {workers} | {row['seconds']:.1f} | {row['wall']:.1f} | {row['cpu']:.1f} | "
                  f"{row['examples']:,} | {row['tokens']:,} | {row['shards']} | "
                  f"{row['examples'] / row['seconds']:,.0f} |")
        if args.read:
            print()
            print(f"| task (first {args.read:,} {read_split} examples, 512/114) | uncached "
                  "examples/s | cached examples/s |")
            print("|---|---:|---:|")
            uncached, cached = read_rate(args.read_task, args.read, last, read_split)
            print(f"| {args.read_task} | {uncached:,.0f} | {cached:,.0f} |")


if __name__ == "__main__":
    main()
