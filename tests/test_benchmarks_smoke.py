"""Every script in ``benchmarks/`` runs: each in its ``--smoke`` mode (its own code path at
tiny sizes, ``benchmarks/_smoke.py``), checked for exit 0 and for its table (issue 58).

The docs' measured tables name the script that regenerates them; a script nobody runs
rots with every change to an API it calls (``decode_speed.py`` raised a ``KeyError`` for
months). Scripts are found by globbing, so a new one fails here until it has a smoke mode
and an entry in ``SMOKE`` saying what its table looks like.

Most scripts run in this process (``main(argv)``): they share its JAX runtime, its
compiled programs and the imports a new process would spend 5-10 s on. The TPU planners
run as subprocesses: libtpu reads its environment when it loads. Scripts that need a
checkpoint share one ``--runs`` folder, so the tiny pretraining runs (``pt_bert``,
``pt_gpt2``, ``pt_t5``) are made once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
# Helper modules (``_smoke.py``) are no benchmarks.
SCRIPTS = sorted(path.relative_to(BENCHMARKS).as_posix() for path in BENCHMARKS.rglob("*.py")
                 if not path.name.startswith("_"))


@dataclasses.dataclass(frozen=True)
class Smoke:
    """How a script's smoke run is called and checked.

    ``header``: text every run prints (its table's header row, column and row names);
    the numbers from the first of them to the end of the output must be finite, and there
    must be some. ``row``: a regular expression a line of the table must match, where
    the header alone would not show that a value was read. ``argv``: arguments besides
    ``--smoke`` (``{runs}``: the shared runs folder). ``subprocess``: run as ``python
    SCRIPT`` (scripts whose libraries read the environment when they load). ``slow``:
    over ~20 s on 2 cores."""

    header: tuple[str, ...]
    argv: tuple[str, ...] = ()
    row: str = ""
    subprocess: bool = False
    slow: bool = False


SEQIO = all(importlib.util.find_spec(m) for m in ("seqio", "t5"))
SMOKE = {
    "cache_build.py": Smoke(("| workers | seconds | wall s | cpu s | examples | tokens |",
                             "| uncached examples/s | cached examples/s |")),
    "context_parallel_cpu.py": Smoke(
        ("| mesh | compile s | step s | step vs data 8 | first loss |",
         "| data 2 x context 4, ring |")),
    "context_parallel_plan.py": Smoke(
        ("| mesh | rows x tokens | memory / chip (GiB) | fits |", "| fsdp 2 x context 2, ring |"),
        subprocess=True),
    "data_pipeline.py": Smoke(
        ("| objective | tokens | examples/s | tokens/s | tokens/CPU-s |", "| deshuffle |",
         "| span_corruption, epoch |", "packing fill ratio", "BERT-base on a TPU v5p host")
        + (() if SEQIO else ("| seqio span_corruption, epoch | not installed |",))),
    "decode_speed.py": Smoke(("t5x_like tok/s", "HF tok/s", "same tokens", "gpt2_small",
                              "t5_1_1_small", "beam 4")),
    "decode_step_flops.py": Smoke(("| config | batch | step FLOPs, projecting the encoder output "
                                   "| step FLOPs, cross cache | ratio |",)),
    "distill_bench.py": Smoke(("| model | layers | params | sequences/s |", "% of teacher",
                               "| distilled |"), ("run", "--runs={runs}"), slow=True),
    "electra_bench.py": Smoke(("| pretraining | steps | model FLOPs | held-out MLM acc |",
                               "| electra |"), ("run", "--runs={runs}"), slow=True),
    "elmo_scalar_mix.py": Smoke(("| features | pretrained | random init |", "| scalar mix |")),
    # The BERT random-init cell of spam is read from the eval run the smoke run made.
    "embedded_bench_table.py": Smoke(("| task | metric | majority |", "BERT random init"),
                                     ("--runs={runs}",),
                                     row=r"^\| spam \| \w+ \| [\d.]+ (\| - ){4}\| [\d.]+ \| - \|$"),
    "embedding_geometry.py": Smoke(("| model | layer 0 |", "UPOS linear probe accuracy",
                                    "T5 encoder (random init)"), ("--runs={runs}",), slow=True),
    "eval_sampler.py": Smoke(("| sampler | rows | batch / slots | seconds |", "| static |"),
                             ("--runs={runs}",), row=r"^\| engine \| 16 \| 8 \| [\d.]+ \(.*\| 100% \|$"),
    "eval_throughput.py": Smoke(("t5x_like ex/s", "transformers ex/s", "t5_1_1_small",
                                 "gpt2_small", "predict")),
    "harness_backend.py": Smoke(("| task | metric | t5x_like | HF backend | difference |",
                                 "same answer for"), ("--runs={runs}",)),
    "lm_eval_parity.py": Smoke(("| shots | lm-eval acc | ours acc |",), ("--runs={runs}",)),
    # Planned: the decoder's flash row; the Longformer chunked row is only built (one compile).
    "long_context_plan.py": Smoke(("| config | topology | tokens | attention | remat |",
                                   "| flash |", "the chunked row's config checked"),
                                  subprocess=True),
    "loop_overhead.py": Smoke(("ms/step", "bare train step", "full loop (train.run)",
                               "alone: checkpoint")),
    # --smoke trains gpt2_tiny (t5_tiny's rows compile half as long again).
    "low_precision.py": Smoke(("| recipe | kind | loss @1 |", "| gpt2_tiny | fp8 |"), slow=True),
    # --smoke's rows are BERT and T5; gpu/gpu_bench.py's smoke run trains its GPT-2 row.
    "model_step.py": Smoke(("t5x_like tok/s", "PyTorch tok/s", "XLA GFLOP/step", "bert_base",
                            "t5_1_1_small")),
    "instructgpt_recipe.py": Smoke(("| model | held-out rule score | reward-model score |",
                                    "| SFT |", "| PPO kl_coef 0.05, step 2 |",
                                    "| PPO kl_coef 0.5, step 2 |"),
                                   ("run", "--runs={runs}"), slow=True),
    # The recipe's own smoke run first (in RUNS/instructgpt), then TRL's PPO for 2 rollouts.
    "instructgpt_side_by_side.py": Smoke(("| rollouts | ours: rule score | TRL: rule score |",
                                          "| 2 | - |"), ("run", "--runs={runs}"), slow=True),
    "maxtext_record.py": Smoke(("| row | chips | model | seq | batch | MaxText MFU |",
                                "our predicted MFU", "| smoke | v6e x 4 | tiny decoder |"),
                               ("--out={runs}/maxtext_record",),
                               row=r"^\| smoke \|.*\| [\d.]+% \| [\d,]+ \| - \| [\d.]+% \|",
                               subprocess=True),
    "moe_capacity.py": Smoke(("held-out loss", "max load / uniform", "capacity factor 2.0",
                              "dropless", "minus dense"), ("--runs={runs}",)),
    "multilingual.py": Smoke(("| language | characters | p_i |",
                              "| language | vocabulary | tokens per character |",
                              "| task | init | metric | value | step |", "decoder_start_id")),
    "optimizers.py": Smoke(("| optimizer | lr 0.001 | best lr |", "| schedule_free_adamw |",
                            "| optimizer | s/step | vs adamw |")),
    "parquet_throughput.py": Smoke(("| objective | ours: tokens/s (one process) |",
                                    "| span_corruption |", "| lm |")),
    "peft_bench.py": Smoke(("| method | spam f1 | trainable | optimizer state |", "| lora |"),
                           ("run", "--runs={runs}"), slow=True),
    "pipeline_cpu.py": Smoke(("| mesh | bubble | compile s | step s |", "circular")),
    "pipeline_plan.py": Smoke(("| mesh | memory / chip (GiB) | fits | bubble |",
                               "| circular: 7 layers a visit |"), subprocess=True, slow=True),
    "plan_table.py": Smoke(("| config | topology | per chip | verdict | compile |",
                            "`--num_slices=2`"), subprocess=True),
    "preference_tuning.py": Smoke(("(a) DPO on embedded_austen_cloze_preference",
                                   "| cloze_accuracy", "(b) GRPO", "| GRPO final",
                                   "(c) rollouts", "(d) PPO", "| PPO final"),
                                  ("run", "--runs={runs}"), slow=True),
    "resilience_goodput.py": Smoke(("run 1: exit 0", "run 2: exit 75",
                                    "run 3: exit 0, ended at step 20", "goodput"), slow=True),
    "retrieval_rag.py": Smoke(("| retriever | queries | recall@1 |", "faiss",
                               "| model | final train loss (nats/token) | BLEU |",
                               "RAG-sequence"), ("--runs={runs}",), slow=True),
    "serving.py": Smoke(("| concurrency | requests | system | tokens/s | TTFT p50 s |",
                         "| engine |", "| static |", "| transformers |"),
                        row=r"^\| 2 \| 8 \| engine \| [\d,.]+ .*\| 100% \|$"),
    "seqio_parity.py": Smoke(("| check | seqio / t5 | detail |", "passed, 0 failed")),
    "trl_side_by_side.py": Smoke(("prompts: TRL's tokens equal ours on 8500 prompts",
                                  "| step | ours: greedy exact_answer | TRL: greedy exact_answer |",
                                  "| 2 |"), ("run", "--runs={runs}"), slow=True),
    "gpu/gpu_bench.py": Smoke(("== train step", "ours tok/s", "== decode", "t5_beam",
                               "torch.compile gpt2")),
    "gpu/low_precision_bench.py": Smoke(("| matmul (bf16, 8192^3) | XLA flags |",
                                         "| train row | side | tokens/s |",
                                         "| decode row | batch | weights |", "int8 weights"),
                                        slow=True),
}


def _param(script: str):
    smoke = SMOKE.get(script)
    return pytest.param(script, marks=[pytest.mark.slow] if smoke and smoke.slow else [],
                        id=script)


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory) -> pathlib.Path:
    """The ``--runs`` folder of every script that reads checkpoints: the tiny pretraining
    runs one script makes, the next finds."""
    return tmp_path_factory.mktemp("benchmark_runs")


def test_every_script_has_a_smoke_entry_and_no_entry_is_stale():
    """A script missing from SMOKE would be run with nothing checked but its exit."""
    assert sorted(SMOKE) == SCRIPTS, (
        "benchmarks/ and SMOKE differ: give a new script a --smoke mode and an entry "
        f"(missing {sorted(set(SCRIPTS) - set(SMOKE))}, stale {sorted(set(SMOKE) - set(SCRIPTS))})")


@pytest.mark.parametrize("script", [_param(s) for s in SCRIPTS])
def test_benchmark_runs_in_its_smoke_mode(script, shared_runs, capfd, monkeypatch):
    smoke = SMOKE.get(script)
    assert smoke is not None, f"benchmarks/{script}: no entry in SMOKE (see its docstring)"
    argv = ["--smoke", *(a.format(runs=shared_runs) for a in smoke.argv)]
    if smoke.subprocess:
        code, out, err = _run_subprocess(BENCHMARKS / script, argv)
    else:
        code, out, err = _run_in_process(BENCHMARKS / script, argv, capfd, monkeypatch)
    shown = f"{out[-6000:]}\n--- stderr ---\n{err[-4000:]}"
    assert code == 0, f"benchmarks/{script} --smoke exited {code}:\n{shown}"
    missing = [part for part in smoke.header if part not in out]
    assert not missing, f"benchmarks/{script} --smoke printed no {missing}:\n{shown}"
    table = out[out.index(smoke.header[0]):]
    assert not smoke.row or re.search(smoke.row, table, flags=re.MULTILINE), (
        f"benchmarks/{script}: no line of its table matches {smoke.row!r}:\n{table[-3000:]}")
    values = _numbers(table)
    assert values, f"benchmarks/{script}: no numbers in its table:\n{table[-3000:]}"
    bad = re.findall(r"\b(?:nan|inf)\b", table, flags=re.IGNORECASE)
    assert not bad and all(math.isfinite(v) for v in values), (
        f"benchmarks/{script}: a table value is not finite ({bad}):\n{table[-3000:]}")


def _run_in_process(path: pathlib.Path, argv: list[str], capfd, monkeypatch):
    """``main(argv)`` of the script, imported afresh; what it printed (its subprocesses'
    output too). The process is left as found: working directory, environment, module
    search path and the data pipeline's cache folders."""
    from t5x_like.data import cache

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    saved_path, saved_env = list(sys.path), dict(os.environ)
    saved_cache_dirs = list(cache._added_cache_dirs)  # noqa: SLF001 (restored below)
    sys.path[:0] = [str(path.parent), str(BENCHMARKS)]
    capfd.readouterr()
    try:
        spec = importlib.util.spec_from_file_location(
            f"benchmark_smoke_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        try:
            code = module.main(argv)
        except SystemExit as e:
            code = e.code
    finally:
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        cache._added_cache_dirs[:] = saved_cache_dirs  # noqa: SLF001
        smoke_helpers = sys.modules.get("_smoke")
        if smoke_helpers is not None:
            smoke_helpers.IN_PROCESS = False  # as a new process starts
    out, err = capfd.readouterr()
    return code or 0, out, err


def _run_subprocess(path: pathlib.Path, argv: list[str]):
    done = subprocess.run([sys.executable, str(path), *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    return done.returncode, done.stdout, done.stderr


NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _numbers(text: str) -> list[float]:
    """The numbers of a table (thousands separators allowed)."""
    return [float(match.replace(",", "")) for match in NUMBER.findall(text)]
