"""An IsoFLOP sweep (Hoffmann et al.'s approach 2): for each compute budget, models of
several sizes, each trained for exactly the tokens the budget buys it, each a normal
``train`` run in its own workdir.

Model shapes follow one rule, a ladder of widths at a fixed aspect ratio (Kaplan et al.
2020 found loss nearly flat over depth/width ratios across a wide range, so one ratio
serves): ``d_model`` from ``WIDTHS``, ``num_layers = d_model / ASPECT`` (at least 2),
``d_model / 64`` heads (at least one), ``d_ff = 4 d_model``. The family's structure
names its depth keys (``Structure.depth_keys``): a decoder's or an encoder's
``num_layers``, an encoder-decoder's two stacks, each that deep; the rest of the model
(vocabulary, norms, positions, MLP activations) is the base config's. Tokens per step
are the batch times every feature's length (an encoder-decoder's inputs and targets).
Parameters grow about as ``d_model**3``, so the ladder is finer than a doubling. For a budget ``C`` a model gets
``D = C / (FLOPs per token)`` tokens, ``flops.py``'s count (3 x forward, the vocabulary
projection included); steps are ``D`` over the base config's tokens per step, rounded.
Each budget runs the ``sizes`` consecutive rungs whose middle one is closest to 20
tokens per parameter (Chinchilla's optimum), so the profile brackets its minimum.
Each run's learning rate decays by a cosine to 10% of its peak at its own last step (as
Chinchilla found necessary: a schedule longer than the run overestimates its loss), and
it is evaluated once, at the end: the loss reported is the held-out loss there.

A point is finished when its ``metrics.jsonl`` has the held-out loss of its last step;
re-running the sweep skips finished points and resumes unfinished ones from their
checkpoints (``train``'s own resume). A second sweep into the same directory (other
budgets, or ``--tokens_per_param`` elsewhere) adds its points: ``results.jsonl`` keeps
the rows of earlier sweeps' points beside the new ones, so one fit reads them all.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import subprocess
import sys
import time

import jax
import numpy as np

from t5x_like import config, resolving, structures
from t5x_like.config import model_spec_of
from t5x_like.engine import flops, trainer
from t5x_like.errors import UserError
from t5x_like.system import progress

WIDTHS = (32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
          1024)
ASPECT = 32  # d_model / num_layers
HEAD_WIDTH = 64  # heads of 64 (one head below 128 wide)
TARGET_TOKENS_PER_PARAM = 20
MIN_STEPS = 20  # fewer optimizer steps than this is not a training run
FINAL_LEARNING_RATE_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class Point:
    budget: float  # the FLOPs asked for
    d_model: int
    num_layers: int
    params: int  # every parameter, embeddings included (Chinchilla's count)
    non_embedding_params: int
    steps: int
    tokens: int  # steps x tokens per step
    flops: float  # flops.py's count for those steps
    depth_keys: tuple[str, ...] = ("num_layers",)  # the family's stacks, each this deep

    @property
    def name(self) -> str:
        return f"C{self.budget:.2e}_d{self.d_model}_l{self.num_layers}".replace("+", "")

    def overrides(self, warmup_steps: int) -> list[str]:
        """``--config.`` flags that make the base config this point's run."""
        return [f"--config.model.d_model={self.d_model}",
                *(f"--config.model.{key}={self.num_layers}" for key in self.depth_keys),
                f"--config.model.num_heads={heads(self.d_model)}",
                f"--config.model.head_dim={self.d_model // heads(self.d_model)}",
                f"--config.model.d_ff={4 * self.d_model}",
                f"--config.num_train_steps={self.steps}",
                "--config.optimizer.schedule=cosine",
                f"--config.optimizer.final_learning_rate_fraction={FINAL_LEARNING_RATE_FRACTION}",
                f"--config.optimizer.warmup_steps={min(warmup_steps, self.steps // 10)}",
                f"--config.evals.held_out.every_steps={self.steps}",
                f"--config.checkpoint.every_steps={max(self.steps // 2, 1)}",
                "--config.checkpoint.keep=1"]


def shape(d_model: int) -> tuple[int, int]:
    return d_model, max(2, d_model // ASPECT)


def heads(d_model: int) -> int:
    return max(1, d_model // HEAD_WIDTH)


def _model_config(base, d_model: int, num_layers: int):
    return base.model.replace(d_model=d_model, num_heads=heads(d_model),
                              head_dim=d_model // heads(d_model), d_ff=4 * d_model,
                              **dict.fromkeys(depth_keys(base), num_layers))


class PointFailed(Exception):
    """A point's ``train`` run ended without its final held-out loss (not the user's
    mistake: the run's outcome; its log says why)."""


def count_params(model_config, lengths) -> tuple[int, int]:
    """(all parameters, without the token and position embeddings)."""
    return _count_params(model_spec_of(model_config), tuple(sorted(lengths.items())))


@functools.lru_cache(maxsize=256)
def _count_params(model_spec, lengths: tuple) -> tuple[int, int]:
    lengths = dict(lengths)
    model = structures.build_model(model_spec)
    structure = structures.structure_class(model_spec.family)(model)
    shapes = trainer.abstract_boxed_params(model, structure.model_feature_lengths(lengths))
    total, embedding = 0, 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        size = int(np.prod(leaf.shape))
        total += size
        if any("embedder" in str(getattr(k, "key", "")) for k in path):
            embedding += size
    return total, total - embedding


def depth_keys(base) -> tuple[str, ...]:
    """The model keys that set the depth of the base family's stacks (a decoder's or an
    encoder's ``num_layers``; an encoder-decoder's two, kept equal). Refuses a family
    without a transformer depth ladder (ELECTRA's two towers, ELMo's LSTMs)."""
    keys = structures.structure_class(base.model.family).depth_keys
    if not keys:
        ladders = sorted(name for name in structures.families.names()
                         if structures.structure_class(name).depth_keys)
        raise UserError(f"scaling sweep and plan build model shapes for {', '.join(ladders)}; "
                        f"model.family={base.model.family!r} has no depth ladder.")
    return keys


def candidates(base, budget: float) -> list[Point]:
    """Every rung of the ladder that ``budget`` trains for at least ``MIN_STEPS`` steps,
    smallest first."""
    depth_keys(base)  # refuses a family without a ladder
    lengths = dict(base.task_feature_lengths)
    tokens_per_step = base.batch_size * sum(lengths.values())
    points = []
    for width in WIDTHS:
        d_model, num_layers = shape(width)
        model_config = _model_config(base, d_model, num_layers)
        per_step = flops.train_flops_per_step(model_config, lengths, base.batch_size)
        steps = round(budget / per_step)
        if steps < MIN_STEPS:
            continue
        params, non_embedding = count_params(model_config, lengths)
        points.append(Point(budget, d_model, num_layers, params, non_embedding, steps,
                            steps * tokens_per_step, steps * per_step, depth_keys(base)))
    return points


def plan_points(base, budgets, sizes: int,
                tokens_per_param: float = TARGET_TOKENS_PER_PARAM) -> list[Point]:
    """The sweep's points, budget by budget, smallest model first: per budget the
    ``sizes`` consecutive rungs whose middle one is nearest ``tokens_per_param`` (a
    sweep whose minima fell outside its sizes centres the next one where they fell).
    Refuses a budget that cannot give ``sizes`` rungs of at least ``MIN_STEPS`` steps."""
    depth_keys(base)  # refuses a family without a ladder
    if sizes < 2:
        raise UserError(f"--sizes={sizes}: give 2 or more (approach 2's parabolas need 3 per "
                        "budget).")
    points = []
    for budget in budgets:
        rungs = candidates(base, budget)
        if len(rungs) < sizes:
            d_model, num_layers = shape(WIDTHS[0])
            model_config = _model_config(base, d_model, num_layers)
            needed = MIN_STEPS * flops.train_flops_per_step(
                model_config, dict(base.task_feature_lengths), base.batch_size)
            raise UserError(
                f"budget {budget:.3g} FLOPs trains {len(rungs)} model size(s) for at least "
                f"{MIN_STEPS} steps, fewer than --sizes={sizes} (the smallest model, d_model "
                f"{d_model}, needs {needed:.3g} FLOPs for {MIN_STEPS} steps); raise the budget "
                "or lower --sizes.")
        if not (math.isfinite(tokens_per_param) and tokens_per_param > 0):
            raise UserError(f"--tokens_per_param={tokens_per_param}: give a positive number.")
        ratio = [math.log(p.tokens / p.params / tokens_per_param) for p in rungs]
        start = min(range(len(rungs) - sizes + 1), key=lambda i: abs(ratio[i + sizes // 2]))
        points += rungs[start:start + sizes]
    return points


def final_loss(workdir: pathlib.Path, steps: int) -> float | None:
    """The held-out loss at the run's last step, or None while the run is unfinished."""
    metrics = workdir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    loss = None
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by an interrupted write
        if record.get("step") == steps and "eval_loss" in record:
            loss = float(record["eval_loss"])
    return loss


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def run_sweep(config_path: str, overrides: list[str], output_dir: str, budgets, sizes: int,
              dry_run: bool = False, modules=(), log=print,
              tokens_per_param: float = TARGET_TOKENS_PER_PARAM) -> list[dict]:
    """Trains every unfinished point (one ``train`` process each, given ``modules`` as
    ``--module``) and writes ``output_dir/results.jsonl`` (one row per finished point)
    after each. The tasks must be registered (``cli_flags.import_modules``)."""
    base = resolving.load_and_validate(config_path, overrides)
    # Every point trains on this machine's devices: refuse a batch they cannot split now.
    config.check_devices(base, jax.device_count())
    points = plan_points(base, sorted(budgets), sizes, tokens_per_param)
    output = pathlib.Path(output_dir)
    log(f"{len(points)} runs: {len(budgets)} budgets x {sizes} sizes, "
        f"{sum(p.flops for p in points):.3g} FLOPs in all; workdirs under {output / 'points'}")
    results = output / "results.jsonl"
    planned = {str(output / "points" / p.name) for p in points}
    earlier = [r for r in _read_rows(results) if r.get("workdir") not in planned]
    rows, done_flops, spent = [], 0.0, 0.0
    finished = [final_loss(output / "points" / p.name, p.steps) for p in points]
    # The ETA counts the points still to train (finished ones may come later in the grid).
    remaining = sum(p.flops for p, loss in zip(points, finished, strict=True) if loss is None)
    for index, (point, loss) in enumerate(zip(points, finished, strict=True), 1):
        workdir = output / "points" / point.name
        head = (f"[{index}/{len(points)}] C={point.budget:.3g} d_model={point.d_model} "
                f"layers={point.num_layers} N={point.params:,} D={point.tokens:,} "
                f"({point.tokens / point.params:.1f} per parameter) steps={point.steps}")
        if dry_run:
            log(f"{head}: {'finished' if loss is not None else 'to run'}")
            continue
        if loss is None:
            workdir.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            with open(workdir / "train.log", "a") as out:
                result = subprocess.run(
                    [sys.executable, "-m", "t5x_like.train", f"--config={config_path}",
                     f"--workdir={workdir}", "--quiet", *(f"--module={m}" for m in modules),
                     *(f"--config.{o}" for o in overrides),
                     *point.overrides(int(base.optimizer.warmup_steps))],
                    stdout=out, stderr=subprocess.STDOUT, check=False)
            seconds = time.perf_counter() - started
            loss = final_loss(workdir, point.steps)
            if result.returncode != 0 or loss is None:
                raise PointFailed(f"{head}: train exited with status {result.returncode} "
                                   f"without a final held-out loss; see {workdir / 'train.log'}")
            done_flops += point.flops
            spent += seconds
            remaining -= point.flops
            eta = spent / done_flops * remaining
            log(f"{head}: loss {loss:.4f} in {_duration(seconds)} at "
                f"{progress.amount(done_flops / spent)}FLOP/s; ETA {_duration(eta)}")
        else:
            log(f"{head}: loss {loss:.4f} (finished before, skipped)")
        rows.append(dict(budget=point.budget, params=point.params,
                         non_embedding_params=point.non_embedding_params,
                         tokens=point.tokens, flops=point.flops, loss=loss,
                         d_model=point.d_model, num_layers=point.num_layers,
                         steps=point.steps, workdir=str(workdir)))
        output.mkdir(parents=True, exist_ok=True)
        results.write_text("".join(json.dumps(r) + "\n" for r in earlier + rows))
    return rows


def _read_rows(results: pathlib.Path) -> list[dict]:
    """The rows an earlier sweep wrote (none when there is no file yet)."""
    if not results.is_file():
        return []
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
