"""Fitting scaling laws to training runs: Hoffmann et al. 2022's approaches 2 and 3,
with bootstrap intervals.

- Approach 2 (IsoFLOP profiles): for each compute budget, a parabola of the loss in
  ``ln N``; its minimum is that budget's best size; power laws through the minima give
  ``N_opt ∝ C**a`` and ``D_opt ∝ C**b``.
- Approach 3 (the parametric law): ``L(N, D) = E + A / N**alpha + B / D**beta`` fitted
  on the log-loss with a Huber loss (delta 1e-3), L-BFGS started from Hoffmann et al.'s
  grid, in their parametrisation ``A = exp(a0), B = exp(b0), E = exp(e0)``. Their
  published fit was under-converged (Besiroglu et al. 2024), so the tolerances are tight
  and the gradient exact.
- Intervals: the 2.5th and 97.5th percentiles over fits to resampled runs (rows drawn
  with replacement; for approach 2 within each budget).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import pathlib

import numpy as np
import scipy.optimize
import scipy.special

from t5x_like.errors import MissingFile, UserError
from t5x_like.scaling import laws

HUBER_DELTA = 1e-3
# Hoffmann et al.'s initialisation grid (alpha, beta, e0, a0, b0).
GRID = dict(alpha=np.arange(0.0, 2.01, 0.5), beta=np.arange(0.0, 2.01, 0.5),
            e0=np.arange(-1.0, 1.01, 0.5), a0=np.arange(0.0, 25.1, 5.0),
            b0=np.arange(0.0, 25.1, 5.0))
# Runs whose FLOPs agree within this factor share a budget (when no ``budget`` column).
SAME_BUDGET = 1.15


@dataclasses.dataclass(frozen=True)
class Runs:
    """One row per training run: parameters, training tokens, final loss, FLOPs (given,
    else ``6 N D``) and the budget it belongs to (given, else grouped by FLOPs)."""

    params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    flops: np.ndarray
    budget: np.ndarray

    def __len__(self) -> int:
        return len(self.loss)

    def take(self, rows: np.ndarray) -> Runs:
        return Runs(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


def runs_from_columns(params, tokens, loss, flops=None, budget=None) -> Runs:
    params, tokens, loss = (np.asarray(x, np.float64) for x in (params, tokens, loss))
    flops = (laws.FLOPS_PER_PARAM_TOKEN * params * tokens if flops is None
             else np.asarray(flops, np.float64))
    budget = group_budgets(flops) if budget is None else np.asarray(budget, np.float64)
    return Runs(params, tokens, loss, flops, budget)


def group_budgets(flops: np.ndarray) -> np.ndarray:
    """Each run's budget: the geometric mean of the FLOPs of the runs within
    ``SAME_BUDGET`` of each other (sorted runs, a new budget where the gap is larger)."""
    order = np.argsort(flops)
    budget = np.empty_like(flops)
    group = [order[0]] if len(order) else []
    for previous, current in itertools.pairwise(order):
        if flops[current] > flops[previous] * SAME_BUDGET:
            budget[group] = math.exp(np.mean(np.log(flops[group])))
            group = []
        group.append(current)
    if group:
        budget[group] = math.exp(np.mean(np.log(flops[group])))
    return budget


def read_runs(path: str | pathlib.Path) -> Runs:
    """A CSV (header row) or JSONL file with ``params``, ``tokens``, ``loss`` and optionally
    ``flops`` and ``budget`` per run (``scaling sweep`` writes ``results.jsonl``)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise MissingFile(f"--results={path}: no such file; give the sweep's results.jsonl or "
                          "a CSV/JSONL with columns params, tokens, loss.")
    text = path.read_text()
    if path.suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{number}: not valid JSON ({e.msg}); the results "
                                    "need one JSON object per line.") from None
    if not rows:
        raise UserError(f"{path} has no runs; it needs one row per run with params, tokens "
                        "and loss.")
    missing = [c for c in ("params", "tokens", "loss") if c not in rows[0]]
    if missing:
        raise UserError(f"{path}: no column {', '.join(missing)}; the results need params, "
                        "tokens and loss (flops and budget optional).")
    columns = {}
    for name in ("params", "tokens", "loss", "flops", "budget"):
        if name not in rows[0]:
            continue
        try:
            values = np.array([float(r[name]) for r in rows])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}: column {name} must be a number in every row.") from None
        if not np.all(np.isfinite(values) & (values > 0)):
            bad = int(np.argmin(np.isfinite(values) & (values > 0))) + 1
            raise UserError(f"{path}: row {bad} has {name}={values[bad - 1]}; every {name} "
                            "must be a positive number.")
        columns[name] = values
    return runs_from_columns(**columns)


# -- approach 2: IsoFLOP profiles ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class IsoFlopFit:
    budgets: list[dict]  # per budget: flops, parabola (c2, c1, c0 in ln N), N_opt, D_opt, loss
    a: float  # N_opt ∝ C**a
    b: float  # D_opt ∝ C**b
    log_kn: float  # ln N_opt = a ln C + log_kn
    log_kd: float

    def optimum(self, flops: float) -> tuple[float, float]:
        return (math.exp(self.a * math.log(flops) + self.log_kn),
                math.exp(self.b * math.log(flops) + self.log_kd))


def fit_isoflop(runs: Runs) -> IsoFlopFit:
    """Approach 2. Budgets with fewer than three sizes, or whose parabola opens downwards
    (no minimum inside), are left out and said so in ``budgets``."""
    profiles = []
    for flops in np.unique(runs.budget):
        rows = runs.budget == flops
        x, y = np.log(runs.params[rows]), runs.loss[rows]
        entry = {"flops": float(flops), "runs": int(rows.sum())}
        if len(np.unique(x)) < 3:
            entry["left_out"] = "fewer than 3 model sizes"
        else:
            c2, c1, c0 = np.polyfit(x, y, 2)
            entry["parabola"] = [float(c2), float(c1), float(c0)]
            if c2 <= 0:
                entry["left_out"] = "the loss has no minimum in ln N (parabola opens downward)"
            else:
                n_opt = math.exp(-c1 / (2 * c2))
                entry.update(N_opt=n_opt, D_opt=float(flops) / (laws.FLOPS_PER_PARAM_TOKEN * n_opt),
                             loss=float(c0 - c1 * c1 / (4 * c2)),
                             inside=bool(x.min() <= math.log(n_opt) <= x.max()))
        profiles.append(entry)
    used = [p for p in profiles if "N_opt" in p]
    if len(used) < 2:
        raise UserError(f"approach 2 needs at least 2 budgets with 3 or more model sizes and a "
                        f"minimum; these runs have {len(used)} ({len(profiles)} budgets).")
    log_c = np.log([p["flops"] for p in used])
    a, log_kn = np.polyfit(log_c, np.log([p["N_opt"] for p in used]), 1)
    b, log_kd = np.polyfit(log_c, np.log([p["D_opt"] for p in used]), 1)
    return IsoFlopFit(profiles, float(a), float(b), float(log_kn), float(log_kd))


# -- approach 3: the parametric law ----------------------------------------------------

def _objective(theta: np.ndarray, log_n, log_d, log_loss, delta: float):
    """Summed Huber loss of the predicted log-loss, and its gradient in
    ``(a0, b0, e0, alpha, beta)``."""
    a0, b0, e0, alpha, beta = theta
    terms = np.stack([a0 - alpha * log_n, b0 - beta * log_d, np.full_like(log_n, e0)])
    top = terms.max(axis=0)
    exps = np.exp(terms - top)
    total = exps.sum(axis=0)
    predicted = top + np.log(total)  # logsumexp, written out: called thousands of times
    weights = exps / total  # d predicted / d term
    residual = predicted - log_loss
    small = np.abs(residual) <= delta
    value = np.where(small, 0.5 * residual ** 2, delta * (np.abs(residual) - 0.5 * delta)).sum()
    slope = np.where(small, residual, delta * np.sign(residual))
    grad = np.array([(slope * weights[0]).sum(), (slope * weights[1]).sum(),
                     (slope * weights[2]).sum(), -(slope * weights[0] * log_n).sum(),
                     -(slope * weights[1] * log_d).sum()])
    return value, grad


def _grid_values(log_n, log_d, log_loss, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Every grid point as ``(a0, b0, e0, alpha, beta)`` and its objective, vectorised."""
    g = np.array(list(itertools.product(GRID["a0"], GRID["b0"], GRID["e0"], GRID["alpha"],
                                        GRID["beta"])))
    terms = np.stack([g[:, 0:1] - g[:, 3:4] * log_n, g[:, 1:2] - g[:, 4:5] * log_d,
                      np.broadcast_to(g[:, 2:3], (len(g), len(log_n)))])
    residual = np.abs(scipy.special.logsumexp(terms, axis=0) - log_loss)
    values = np.where(residual <= delta, 0.5 * residual ** 2,
                      delta * (residual - 0.5 * delta)).sum(axis=1)
    return g, values


def _minimise(starts, log_n, log_d, log_loss, delta):
    best = None
    for start in starts:
        result = scipy.optimize.minimize(
            _objective, start, args=(log_n, log_d, log_loss, delta), jac=True,
            method="L-BFGS-B", options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12})
        if best is None or result.fun < best.fun:
            best = result
    return best


def fit_parametric(runs: Runs, *, starts: int = 30, delta: float = HUBER_DELTA,
                   initial: np.ndarray | None = None) -> tuple[laws.Law, float]:
    """Approach 3: the law and its summed Huber loss. L-BFGS runs from the ``starts`` grid
    points with the lowest objective (of the grid's 4,500; on the tests' synthetic runs
    the best 20 all ended at the same objective to 12 digits), plus ``initial`` if given
    (the bootstrap starts from the full data's fit and the best 2 grid points)."""
    if len(runs) < 5:
        raise UserError(f"approach 3 fits 5 coefficients; these results have {len(runs)} runs.")
    log_n, log_d, log_loss = np.log(runs.params), np.log(runs.tokens), np.log(runs.loss)
    grid, values = _grid_values(log_n, log_d, log_loss, delta)
    chosen = list(grid[np.argsort(values)[:starts]])
    if initial is not None:
        chosen.insert(0, initial)
    best = _minimise(chosen, log_n, log_d, log_loss, delta)
    a0, b0, e0, alpha, beta = best.x
    if alpha <= 0 or beta <= 0:
        raise UserError(f"approach 3 found alpha={alpha:.3g}, beta={beta:.3g}: the loss does not "
                        "fall with both parameters and tokens in these runs; sweep a wider "
                        "range of sizes and budgets.")
    law = laws.Law(math.exp(e0), math.exp(a0), math.exp(b0), float(alpha), float(beta),
                   source="approach 3 fit")
    return law, float(best.fun)


def law_parameters(law: laws.Law) -> np.ndarray:
    """``(a0, b0, e0, alpha, beta)`` of a law; an ``E`` that underflowed to 0 (the fit
    drove ``e0`` far below zero) starts from ``e0 = -700``."""
    logs = np.log(np.maximum([law.A, law.B, law.E], 1e-304))
    return np.array([*logs, law.alpha, law.beta])


# -- bootstrap -------------------------------------------------------------------------

def interval(values) -> list[float]:
    values = np.asarray([v for v in values if np.isfinite(v)])
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def bootstrap_parametric(runs: Runs, law: laws.Law, at_flops: float, *, samples: int,
                         seed: int = 0, starts: int = 2) -> dict:
    """Intervals of ``E, A, B, alpha, beta, a, b`` and of the optimum at ``at_flops``
    over fits to ``samples`` resamplings of the runs."""
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(samples):
        try:
            fitted, _ = fit_parametric(runs.take(rng.integers(0, len(runs), len(runs))),
                                       starts=starts, initial=law_parameters(law))
        except UserError:
            continue  # a resample without a falling law counts as no fit
        fits.append(fitted)
    if not fits:
        raise UserError("no bootstrap resample gave a law with positive exponents; the runs "
                        "do not pin the law down.")
    out = {name: interval([getattr(f, name) for f in fits])
           for name in ("E", "A", "B", "alpha", "beta", "a", "b")}
    optima = [f.optimum(at_flops) for f in fits]
    out["N_opt"] = interval([n for n, _ in optima])
    out["D_opt"] = interval([d for _, d in optima])
    out["samples"] = len(fits)
    return out


def bootstrap_isoflop(runs: Runs, at_flops: float, *, samples: int, seed: int = 0) -> dict:
    """Intervals of approach 2's ``a``, ``b`` and its optimum at ``at_flops``, resampling
    runs within each budget."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(runs.budget == b) for b in np.unique(runs.budget)]
    fits = []
    for _ in range(samples):
        rows = np.concatenate([rng.choice(g, len(g)) for g in groups])
        try:
            fits.append(fit_isoflop(runs.take(rows)))
        except UserError:
            continue
    if not fits:
        raise UserError("no bootstrap resample of the IsoFLOP profiles had a minimum in two "
                        "budgets; sweep more sizes per budget.")
    optima = [f.optimum(at_flops) for f in fits]
    return {"a": interval([f.a for f in fits]), "b": interval([f.b for f in fits]),
            "N_opt": interval([n for n, _ in optima]), "D_opt": interval([d for _, d in optima]),
            "samples": len(fits)}
