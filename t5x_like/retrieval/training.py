"""The small training loop the retrieval runs share: AdamW with warmup and cosine decay
(one learning rate per top-level parameter group), a jitted step, and a data order
that is a pure function of (seed, epoch), so a rerun gives the same numbers.

Why not ``train.py``: a RAG step reads a fixed document index beside the batch and
updates two networks at their own rates; its runs are minutes long and never resumed.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable, Iterator

import jax
import numpy as np
import optax


def schedule(learning_rate: float, steps: int, warmup: int):
    return optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup, 1),
                                              max(steps, warmup + 1), learning_rate * 0.1)


def optimizer(rates: dict[str, float], steps: int, warmup: int, weight_decay: float = 0.01,
              clip: float = 1.0):
    """AdamW per top-level group of the params (``{"generator": 1e-3, ...}``)."""
    transforms = {group: optax.adamw(schedule(rate, steps, warmup), weight_decay=weight_decay)
                  for group, rate in rates.items()}
    def labels(params):
        return {group: jax.tree.map(lambda _, group=group: group, tree) for group, tree in params.items()}

    return optax.chain(optax.clip_by_global_norm(clip), optax.multi_transform(transforms, labels))


def epoch_batches(num_examples: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
    """Indices of each batch: a fresh permutation per epoch from (seed, epoch); the
    last partial batch of an epoch is dropped."""
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(num_examples)
        for start in range(0, num_examples - batch_size + 1, batch_size):
            yield order[start:start + batch_size]
        epoch += 1


def fit(loss_fn: Callable, params, make_batch: Callable[[np.ndarray], dict], *, rates: dict,
        steps: int, warmup: int, num_examples: int, batch_size: int, seed: int,
        log_every: int = 25, workdir=None, extra_args=()) -> tuple[dict, list[dict]]:
    """Trains ``params`` on ``loss_fn(params, batch, *extra_args) -> (loss, metrics)``;
    returns the params and the logged metrics (also appended to ``metrics.jsonl``)."""
    tx = optimizer(rates, steps, warmup)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch, extra):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, *extra)
        updates, opt_state = tx.update(grads, opt_state, params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return optax.apply_updates(params, updates), opt_state, metrics

    log, started = [], time.time()
    out = pathlib.Path(workdir) / "metrics.jsonl" if workdir else None
    batches = epoch_batches(num_examples, batch_size, seed)
    for number in range(1, steps + 1):
        params, opt_state, metrics = step(params, opt_state, make_batch(next(batches)), extra_args)
        if number % log_every == 0 or number == steps:
            row = {"step": number, **{k: float(v) for k, v in jax.device_get(metrics).items()},
                   "seconds": round(time.time() - started, 1)}
            log.append(row)
            print(json.dumps(row), flush=True)
            if out:
                out.parent.mkdir(parents=True, exist_ok=True)
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return params, log
