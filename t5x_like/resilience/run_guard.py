"""What keeps a run from silently going wrong: the run fingerprint checked on resume,
and divergence rules beyond NaN.

The fingerprint is saved with every checkpoint (inside its config item) and names
what a resume must not change behind the user's back: the vocabulary, the task and
its lengths, the optimizer and the structure of its state, the model, the head and
what parameter-efficient tuning adds or trains.
A resume that changes any of them is refused naming the key, unless
``allow_resume_changes`` lists it.
"""

from __future__ import annotations

import collections
import hashlib
import math
import statistics
from collections.abc import Iterable

import numpy as np

from t5x_like.config import MODEL_SPECS, legacy, model_spec_class
from t5x_like.errors import ConfigError

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.


def _as_plain(value):
    """Tuples as lists, dicts sorted: a config value as it reads back from JSON."""
    if isinstance(value, (tuple, list)):
        return [_as_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_plain(v) for k, v in sorted(value.items())}
    return value


def vocabulary_identity(vocabulary) -> dict:
    """Kind, size and model-file hash (from ``vocabularies.identity``): the part of the
    vocabulary a run's fingerprint keeps, under the keys checkpoints were saved with."""
    from t5x_like.data import vocabularies
    found = vocabularies.identity(vocabulary)
    kept = {"vocabulary.kind": found["kind"], "vocabulary.size": found["size"]}
    if "file_sha256" in found:
        kept["vocabulary.file_sha256"] = found["file_sha256"]
    return kept


def vocabulary_differences(fingerprint: dict, vocabulary) -> dict[str, tuple]:
    """``{key: (the run's value, this vocabulary's)}`` for each vocabulary key of a saved
    run's ``fingerprint`` that ``vocabulary`` does not share (sorted by key): whether
    another run's model reads this tokenizer's ids (a teacher, a reference)."""
    ours = vocabulary_identity(vocabulary)
    return {key: (value, ours.get(key)) for key, value in sorted(fingerprint.items())
            if key.startswith("vocabulary.") and value != ours.get(key)}


def optimizer_state_digest(abstract_opt_state) -> str:
    """The optimizer state's tree structure and leaf shapes, hashed: what a checkpoint's
    optimizer state must match to restore (Adafactor's factored moments are not Adam's)."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(abstract_opt_state)
    text = str(treedef) + "|" + ";".join(f"{tuple(x.shape)}:{x.dtype}" for x in leaves)
    return f"{len(leaves)} arrays, {hashlib.sha256(text.encode()).hexdigest()[:12]}"


# Model keys that change how the step runs, not what it computes or stores: a resume
# may change them freely (e.g. rematerialise to fit a smaller accelerator). The variant
# is a name (``llama``, ``gemma2``): the switches it stands for are fingerprinted. The
# experts' receive buffer is sized for a mesh (its expert axis), as remat is for a chip.
EXECUTION_ONLY_MODEL_KEYS = ("remat_policy", "variant", "ragged_buffer_factor")


def fingerprint(spec, vocabulary, abstract_opt_state, stack_layout: str = "layers") -> dict:
    """The run fingerprint saved with every checkpoint (flat ``key -> JSON value``):
    ``spec_fingerprint``, the optimizer state's structure, and how a scanned stack's
    parameters are laid out (``stack_layout``: ``layers``, or a circular pipeline's
    ``N circular laps``, ``models/pipeline.py``), which no other key shows: the shapes
    differ, the model does not."""
    return {**spec_fingerprint(spec, vocabulary),
            "optimizer.state": optimizer_state_digest(abstract_opt_state),
            "stack.layout": stack_layout}


def spec_fingerprint(spec, vocabulary) -> dict:
    """What of the spec and vocabulary the fingerprint keeps. Model keys go by the flat
    names checkpoints saved them under before the sectioned spec
    (``config.legacy.flat_model``), so every older checkpoint's fingerprint still compares
    key for key."""
    flat = legacy.flat_model(spec.model, model_spec_class(spec.model.family).defaults())
    fp = {f"model.{k}": _as_plain(v) for k, v in flat.items()
          if k not in EXECUTION_ONLY_MODEL_KEYS}
    fp["head.kind"] = spec.head.kind
    fp["head.labels"] = _as_plain(tuple(spec.head.labels))
    fp["task"] = spec.task
    fp["task_feature_lengths"] = _as_plain(dict(spec.task_feature_lengths))
    fp.update(vocabulary_identity(vocabulary))
    fp["optimizer.name"] = spec.optimizer.name
    # only when set: older runs' fingerprints stay as they were saved
    if spec.preference.objective:
        fp["preference.objective"] = spec.preference.objective
    if spec.rl.algorithm:
        fp["rl.algorithm"] = spec.rl.algorithm
    if spec.modes:  # the training modes of one's own a run is in (config.modes)
        fp["modes"] = sorted(spec.modes)
    peft = spec.peft  # what trains and what was added (dropout is free to change)
    fp.update({"peft.bitfit": bool(peft.bitfit), "peft.lora.rank": peft.lora.rank,
               "peft.lora.alpha": peft.lora.alpha, "peft.lora.targets": peft.lora.targets,
               "peft.adapter.size": peft.adapter.size,
               "peft.adapter.activation": peft.adapter.activation,
               "peft.adapter.placement": peft.adapter.placement})
    for part in ("prefix", "prompt"):
        fp.update({f"peft.{part}.{k}": v for k, v in peft[part].to_dict().items()})
    return fp


def legacy_fingerprint(saved_config: dict) -> dict:
    """What a checkpoint saved before fingerprints existed still tells from its config."""
    model = saved_config.get("model") or {}
    flat = legacy.flat_model(model, model_spec_class(model["family"]).defaults()) if (
        model.get("family") in MODEL_SPECS) else model
    fp = {f"model.{k}": _as_plain(v) for k, v in flat.items()
          if k not in EXECUTION_ONLY_MODEL_KEYS}
    head = saved_config.get("head") or {}
    fp["head.kind"] = head.get("kind", "")
    fp["head.labels"] = _as_plain(head.get("labels", []))
    for key in ("task", "task_feature_lengths"):
        if key in saved_config:
            fp[key] = _as_plain(saved_config[key])
    if "optimizer" in saved_config:
        fp["optimizer.name"] = saved_config["optimizer"].get("name")
    return fp


def _allowed(key: str, allowed: Iterable[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allowed)


def resume_changes(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    """``(key, checkpoint value, config value)`` for every key both sides know that differs."""
    return [(key, saved[key], current[key]) for key in sorted(set(saved) & set(current))
            if saved[key] != current[key]]


def check_resume(saved_config: dict, current: dict, allowed: Iterable[str]) -> list[str]:
    """Refuses a resume that changes the fingerprint outside ``allowed``; returns the
    allowed keys that did change (the caller adapts: e.g. a fresh optimizer state)."""
    saved = saved_config.get("fingerprint") or legacy_fingerprint(saved_config)
    allowed = tuple(legacy.legacy_key(name) for name in allowed)
    changes = resume_changes(saved, current)
    refused = [c for c in changes if not _allowed(c[0], allowed)]
    if refused:
        details = "; ".join(f"{key}: checkpoint {old!r}, config {new!r}"
                            for key, old, new in refused)
        keys = ",".join(sorted({key if key.startswith(("model.", "head.", "peft.")) else
                                key.split(".")[0] for key, _, _ in refused}))
        raise ConfigError(
            f"The workdir's checkpoints were trained with different settings ({details}). "
            "Resume with the settings they were saved with, use a new --workdir, or, if the "
            f"change is intended, add --config.checkpoint.allow_resume_changes={keys}.")
    return [key for key, _, _ in changes]


# -- divergence ----------------------------------------------------------------

class Diverged(FloatingPointError):
    """The run stopped because a divergence rule fired; no checkpoint of the bad steps
    was written."""


class DivergenceMonitor:
    """Rules over per-step ``loss`` and ``grad_norm`` that catch a dead or exploding
    run which never produces a NaN:

    * ``zero_grad_steps`` N: the gradient norm is exactly 0 for N steps in a row (a
      model whose updates blew it to a constant, e.g. loss stuck at the uniform value
      ln(vocab_size) after a learning rate of 1e6);
    * ``loss_spike_factor`` k: a step's loss is above k times the median of the last
      ``median_window`` losses (after ``median_window // 2`` steps of history).
    """

    def __init__(self, zero_grad_steps: int, loss_spike_factor: float, median_window: int,
                 vocab_size: int):
        self.zero_grad_steps = zero_grad_steps
        self.loss_spike_factor = loss_spike_factor
        self.median_window = median_window
        self.uniform_loss = math.log(vocab_size) if vocab_size > 1 else 0.0
        self._zero_run = 0
        self._losses = collections.deque(maxlen=max(median_window, 1))

    def check(self, step: int, loss: float, grad_norm: float,
              no_signal: bool = False) -> tuple[str, int] | None:
        """``(why, first bad step)`` if the run has diverged by ``step``, else None. Call
        once per step, in order. ``no_signal``: a step with nothing to learn from by
        construction (online RL whose every group of completions got equal rewards: zero
        advantages, zero gradient), which the rules pass over."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return None  # the NaN/Inf rule (on_nonfinite_loss) owns these
        if no_signal:
            return None
        if self.zero_grad_steps:
            self._zero_run = self._zero_run + 1 if grad_norm == 0.0 else 0
            if self._zero_run >= self.zero_grad_steps:
                at_uniform = (f", the loss {loss:.4f} is the uniform-distribution value "
                              f"ln(vocab_size)={self.uniform_loss:.4f}"
                              if abs(loss - self.uniform_loss) < 1e-2 else f", loss {loss:.4f}")
                first = step - self._zero_run + 1
                return (f"the gradient norm has been exactly 0 for {self._zero_run} steps "
                        f"(steps {first}-{step}{at_uniform}): the model stopped learning "
                        "(divergence.zero_grad_steps)", first)
        if self.loss_spike_factor > 0 and len(self._losses) >= max(self.median_window // 2, 1):
            median = statistics.median(self._losses)
            if median > 0 and loss > self.loss_spike_factor * median:
                return (f"the loss {loss:.4f} at step {step} is above "
                        f"{self.loss_spike_factor:g} x the median {median:.4f} of the last "
                        f"{len(self._losses)} steps (divergence.loss_spike_factor)", step)
        self._losses.append(loss)
        return None


class StabilityChecks:
    """What the loop runs on every logged interval: a NaN/Inf loss or gradient stops the
    run (unless ``divergence.on_nonfinite_loss`` skips such updates), and so do the
    divergence rules; either way before anything of those steps is saved, with the
    checkpoints saved after the first bad step moved aside."""

    def __init__(self, spec, checkpointer):
        rules = spec.divergence
        self.skip_nonfinite = rules.on_nonfinite_loss == "skip_update"
        self.monitor = DivergenceMonitor(rules.zero_grad_steps, rules.loss_spike_factor,
                                         rules.median_window, spec.model.vocab_size)
        self.checkpointer = checkpointer

    def check(self, step: int, fetched: list[dict]) -> None:
        bad = first_nonfinite_step(fetched, step)
        if bad is not None and not self.skip_nonfinite:
            raise FloatingPointError(
                f"Train loss or gradient is NaN/Inf at step {bad}; stopping without saving. "
                f"{where_the_next_run_starts(self.checkpointer)} Lower "
                "optimizer.learning_rate or enable optimizer.grad_clip_norm, or set "
                "--config.divergence.on_nonfinite_loss=skip_update to skip such steps.")
        first = step - len(fetched) + 1
        for offset, m in enumerate(fetched):
            found = self.monitor.check(first + offset, float(m["loss"]), float(m["grad_norm"]),
                                       no_signal=float(m.get("groups_without_signal", 0.0)) >= 1.0)
            if found is not None:
                raise Diverged(self._stop(step, *found))

    def _stop(self, step: int, reason: str, first_bad_step: int) -> str:
        """Moves aside checkpoints saved at or after the first bad step (kept, not
        deleted), so the next run resumes from the last good one; returns the message."""
        moved = self.checkpointer.move_aside_from(first_bad_step,
                                                  f"saved after divergence: {reason}")
        aside = (f" Checkpoints saved after step {first_bad_step} were moved to "
                 f"{', '.join(str(p) for p in moved)}." if moved else "")
        return (f"Stopped at step {step}: {reason}. Nothing was saved.{aside} "
                f"{where_the_next_run_starts(self.checkpointer)} Lower optimizer.learning_rate "
                "(or set optimizer.grad_clip_norm), or tune the divergence.* rules if this was "
                "a false alarm.")


def where_the_next_run_starts(checkpointer) -> str:
    latest_good = checkpointer.latest_step()
    if latest_good is None:
        return "No checkpoint was saved before it; the next run starts from step 0."
    return (f"The last good checkpoint (step {latest_good}) in {checkpointer.directory} is "
            "intact and the next run resumes from it.")


def interval_record(fetched: list[dict]) -> dict:
    """Means over the steps since the last log; skipped (non-finite) steps are left out
    of the means and counted in ``skipped_updates``. A key some steps lack (a rollout's
    reward, logged by the step that sampled it and not by the later updates of its
    batch) is the mean over the steps that have it."""
    kept = [m for m in fetched if not m.get("skipped_updates", 0.0)] or fetched
    keys = dict.fromkeys(key for m in fetched for key in m)
    record = {}
    for key in keys:
        values = [m[key] for m in kept if key in m] or [m[key] for m in fetched if key in m]
        record[key] = float(np.mean(values))
    if "skipped_updates" in fetched[0]:
        record["skipped_updates"] = float(sum(m["skipped_updates"] for m in fetched))
    record["learning_rate"] = float(fetched[-1]["learning_rate"])
    if "batch_checksum" in fetched[0]:  # every step's batch counts, skipped or not
        record["batch_checksum"] = sum(int(m["batch_checksum"]) for m in fetched) % (2**24)
    return record


def first_nonfinite_step(fetched: list[dict], last_step: int) -> int | None:
    """The step number of the first fetched step with a NaN/Inf loss or gradient norm."""
    first = last_step - len(fetched) + 1
    for offset, m in enumerate(fetched):
        if not (math.isfinite(float(m["loss"])) and math.isfinite(float(m["grad_norm"]))):
            return first + offset
    return None
