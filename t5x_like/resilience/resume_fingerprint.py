"""The run fingerprint checked on resume: saved with every checkpoint (inside its config
item), it names what a resume must not change behind the user's back: the vocabulary,
the task and its lengths, the optimizer and the structure of its state, the model, the
head and what parameter-efficient tuning adds or trains. A resume that changes any of
them is refused naming the key, unless ``allow_resume_changes`` lists it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

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
    ``N circular laps``, ``models/pipeline_parallel.py``), which no other key shows: the shapes
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
