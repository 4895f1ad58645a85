"""The spellings before the sectioned spec, and where each went.

Config files, ``--config.KEY=VALUE`` overrides and every ``config.json`` and
``model_config.json`` saved before the spec keep working: ``migrate`` moves their old
keys to the new places (``eval_every_steps`` -> ``evals.held_out.every_steps``,
``model.rope_factor`` -> ``model.positions.rope.factor``, ...). ``flat_model`` is the
other way: a model spec under its old flat names, which run fingerprints keep (so a
checkpoint saved before resumes) and the Hugging Face converters read.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from t5x_like.config.sections import FrozenMap, Section

# Run keys: old path -> new path.
RUN_RENAMES = {
    "pack": "data.pack",
    "data_streams": "data.streams",
    "prefix_attention": "data.prefix_attention",
    "log_every_steps": "logging.every_steps",
    "peak_flops_per_device": "logging.peak_flops_per_device",
    "checkpoint_every_steps": "checkpoint.every_steps",
    "keep_checkpoints": "checkpoint.keep",
    "keep_checkpoints_every_steps": "checkpoint.keep_every_steps",
    "allow_resume_changes": "checkpoint.allow_resume_changes",
    "on_nonfinite_loss": "divergence.on_nonfinite_loss",
    "lock_stale_after_s": "resilience.lock_stale_after_s",
    "hang_timeout_s": "resilience.hang_timeout_s",
    "startup_timeout_s": "resilience.startup_timeout_s",
    "eval_every_steps": "evals.held_out.every_steps",
    "eval_batches": "evals.held_out.batches",
}
# The old ``eval`` section: benchmark keys and the harness's, by their new names.
EVAL_BENCHMARK_KEYS = {"mixture": "mixture", "max_examples": "max_examples", "split": "split",
                       "batch_size": "batch_size", "max_decode_length": "max_decode_length"}
EVAL_HARNESS_KEYS = {"harness_tasks": "tasks", "harness_include_path": "include_path",
                     "harness_num_fewshot": "num_fewshot", "harness_limit": "limit",
                     "harness_max_gen_toks": "max_gen_toks", "batch_size": "batch_size"}

_EXPERTS = {"num_experts": "num_experts", "num_experts_per_token": "num_experts_per_token",
            "moe_every": "every", "expert_d_ff": "d_ff", "shared_expert_d_ff": "shared_d_ff",
            "shared_expert_gate": "shared_gate", "router_softmax": "router_softmax",
            "router_jitter": "router_jitter", "router_aux_loss_weight": "aux_loss_weight",
            "router_z_loss_weight": "z_loss_weight", "moe_dispatch": "dispatch",
            "capacity_factor": "capacity_factor", "moe_group_size": "group_size",
            "moe_impl": "impl", "ragged_buffer_factor": "ragged_buffer_factor"}
_ROPE = {"rotary_max_wavelength": "max_wavelength",
         "local_rotary_max_wavelength": "local_max_wavelength", "rope_type": "scaling",
         "rope_factor": "factor", "rope_low_freq_factor": "low_freq_factor",
         "rope_high_freq_factor": "high_freq_factor",
         "rope_original_max_length": "original_max_length", "rope_beta_fast": "beta_fast",
         "rope_beta_slow": "beta_slow", "rope_attention_factor": "attention_factor",
         "rope_truncate": "truncate"}
# Model keys of every family: old flat name -> new path under ``model``. A key moves only
# where the family's spec has its new path (T5 has no ``positions.max_length``).
MODEL_RENAMES = {
    "dtype": "numerics.dtype", "scan_layers": "numerics.scan_layers",
    "remat_policy": "numerics.remat_policy", "attention_impl": "attention.impl",
    "max_length": "positions.max_length",
    **{old: f"experts.{new}" for old, new in _EXPERTS.items()},
    "relative_attention_num_buckets": "positions.num_buckets",
    "relative_attention_max_distance": "positions.max_distance",
    "num_kv_heads": "attention.num_kv_heads", "sliding_window": "attention.sliding_window",
    "layer_types": "attention.layer_types", "qkv_bias": "attention.qkv_bias",
    "qk_norm": "attention.qk_norm", "query_pre_attention_scalar": "attention.query_pre_scalar",
    "attention_logit_softcap": "attention.logit_softcap", "position_embedding": "positions.kind",
    **{old: f"positions.rope.{new}" for old, new in _ROPE.items()},
    "attention_window": "attention.window", "global_attention": "attention.global_tokens",
    "max_global_tokens": "attention.max_global_tokens", "position_offset": "positions.offset",
    **{f"generator_{k}": f"generator.{k}" for k in ("d_model", "num_heads", "head_dim", "d_ff",
                                                     "num_layers")},
}
# Keys a family did not have before the spec: left out of its flat view at their default,
# so an old run's fingerprint is unchanged.
ADDED_MODEL_KEYS = {"variant": None, "attention.impl": ("electra",),
                    "numerics.scan_layers": ("bilm",), "numerics.remat_policy": ("bilm",)}


def get_path(tree: Mapping, path: str, default=None):
    node = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_path(tree: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = dict(node.get(part) or {})
        node = node[part]
    node[leaf] = value


def _pop_path(tree: dict, path: str):
    *parents, leaf = path.split(".")
    node = tree
    for part in parents:
        node = node[part]
    return node.pop(leaf)


def migrate_model(model: Mapping, family_defaults: Mapping | None = None) -> tuple[dict, list]:
    """``(model dict in the sectioned layout, [(old, new), ...] moved)``. With
    ``family_defaults`` (the family's ``defaults()``) a key moves only where the family
    has its new path; otherwise wherever the table says."""
    model = _plain_dict(model)
    moved = []
    for old, new in MODEL_RENAMES.items():
        if old not in model or isinstance(model.get(old), dict):
            continue
        if family_defaults is not None and get_path(family_defaults, new, _MISSING) is _MISSING:
            continue  # another family's key: the spec refuses it, naming the family
        set_path(model, new, model.pop(old))
        moved.append((f"model.{old}", f"model.{new}"))
    return model, moved


def migrate(config: Mapping, family_defaults=None) -> tuple[dict, list]:
    """``(config dict in the sectioned layout, [(old, new), ...] moved)`` for a config,
    an old ``config.json`` or one already in the new layout (returned as it is).
    ``family_defaults(family) -> dict``: the model defaults, to move model keys only to
    where the family has them."""
    out = _plain_dict(config)
    moved = []
    if isinstance(out.get("model"), dict):
        family = out["model"].get("family", "encoder_decoder")
        defaults = family_defaults(family) if family_defaults is not None else None
        out["model"], moved = migrate_model(out["model"], defaults)
    for old, new in RUN_RENAMES.items():
        if old in out and not isinstance(out[old], dict):
            set_path(out, new, out.pop(old))
            moved.append((old, new))
            if new.startswith("evals.held_out."):
                out["evals"]["held_out"].setdefault("kind", "held_out_loss")
    if isinstance(out.get("eval"), dict):
        moved += _migrate_eval_section(out)
    return out, moved


def _migrate_eval_section(out: dict) -> list:
    """The old ``eval`` section -> ``evals.benchmark`` and ``evals.harness`` (only those
    it turned on). Its ``every_steps=0`` meant the held-out cadence, or the end only."""
    old = out.pop("eval")
    held_out = get_path(out, "evals.held_out.every_steps", 200)
    every = old.get("every_steps") or (held_out if held_out > 0 else -1)
    moved = []
    if old.get("mixture"):
        set_path(out, "evals.benchmark", {"kind": "benchmark", "every_steps": every, **{
            new: old[key] for key, new in EVAL_BENCHMARK_KEYS.items() if key in old}})
        moved.append(("eval.mixture", "evals.benchmark.mixture"))
    if old.get("harness_tasks"):
        set_path(out, "evals.harness", {"kind": "harness", "every_steps": every, **{
            new: old[key] for key, new in EVAL_HARNESS_KEYS.items() if key in old}})
        moved.append(("eval.harness_tasks", "evals.harness.tasks"))
    return moved


def new_spelling(path: str) -> str | None:
    """Where an old key path went (``eval.mixture`` -> ``evals.benchmark.mixture``), or
    None if ``path`` is not an old spelling."""
    if path in RUN_RENAMES:
        return RUN_RENAMES[path]
    head, _, rest = path.partition(".")
    if head == "model" and rest in MODEL_RENAMES:
        return f"model.{MODEL_RENAMES[rest]}"
    if head == "eval":
        if rest in EVAL_HARNESS_KEYS and rest != "batch_size":
            return f"evals.harness.{EVAL_HARNESS_KEYS[rest]}"
        if rest in EVAL_BENCHMARK_KEYS or rest == "every_steps":
            return f"evals.benchmark.{EVAL_BENCHMARK_KEYS.get(rest, rest)}"
        return "evals.<name> (kind benchmark or harness)"
    return None


def flat_model(model, family_defaults: Mapping | None = None) -> dict:
    """A model spec (or its dict) under its old flat names: sections flattened, each
    key by the name it had before the spec; keys a family did not have then are left out
    while at their default (``family_defaults``: the family's ``defaults()``)."""
    tree = model.to_dict() if isinstance(model, (Section, FrozenMap)) else _plain_dict(model)
    family = tree.get("family")
    back = {new: old for old, new in MODEL_RENAMES.items()}
    flat = {}
    for path, value in _leaves(tree):
        added = ADDED_MODEL_KEYS.get(path, ())
        if path in ADDED_MODEL_KEYS and (added is None or family in added):
            default = get_path(family_defaults or {}, path, _MISSING)
            if family_defaults is None or value == default:
                continue
        flat[back.get(path, path)] = value
    return flat


def legacy_key(path: str) -> str:
    """A fingerprint key by the name checkpoints saved it under (``model.positions.rope.
    factor`` -> ``model.rope_factor``); other keys as given."""
    head, _, rest = path.partition(".")
    if head == "model":
        back = {new: old for old, new in MODEL_RENAMES.items()}
        if rest in back:
            return f"model.{back[rest]}"
    return path


def _leaves(tree: Mapping, prefix: str = ""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _leaves(value, path + ".")
        else:
            yield path, value


def _plain_dict(tree) -> dict:
    """A mutable copy of a ConfigDict, section or mapping, as nested plain dicts."""
    to_dict = getattr(tree, "to_dict", None)
    tree = to_dict() if callable(to_dict) else tree
    return {key: (_plain_dict(value) if isinstance(value, Mapping)
                  or callable(getattr(value, "to_dict", None)) else copy.deepcopy(value))
            for key, value in tree.items()}


_MISSING = object()
