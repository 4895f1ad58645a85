"""Parameter-efficient runs on disk: checkpoints that hold only what trains, the base they
need, and the command that folds LoRA into the base.

A run with ``config.peft`` (LoRA, adapters, BitFit) and ``init_from`` saves, at every
checkpoint, only its trainable parameters (and their optimizer state) plus the base's
identity under ``peft_base`` in the saved config: the ``init_from`` path, the step
read from it (a run's workdir moves on) and a SHA-256 digest of the base's params.
Resume, ``eval`` and ``infer`` read the base back from that path and refuse one whose
digest differs. Without ``init_from`` the base is a random init found nowhere else, so
the whole model is saved as usual.

    python -m t5x_like.peft merge --peft=WORKDIR_OR_STEP --out=FOLDER [--base=PATH]

writes a params-only pretrained folder (``model_config.json`` + ``params/``) whose
kernels are ``W + (alpha / rank) A B``: the model without LoRA, equal in its logits,
which ``convert export`` takes to Hugging Face like any model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

from t5x_like import errors, storage
from t5x_like.errors import ConfigError, UserError
from t5x_like.models.peft import plain_dicts

IDENTITY_KEY = "peft_base"


def saves_partial(config) -> bool:
    """Whether checkpoints of ``config``'s run hold only what trains."""
    from t5x_like import trainer as trainer_lib
    return trainer_lib.trainable_for(config) is not None and bool(config.init_from)


def params_digest(params) -> str:
    """SHA-256 over every parameter's path, dtype, shape and bytes (host arrays)."""
    from t5x_like import trainer as trainer_lib
    digest = hashlib.sha256()
    for path, leaf in sorted(trainer_lib.flat_with_paths(params), key=lambda item: item[0]):
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{path}:{array.dtype}:{array.shape};".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def base_identity(init_from: str, step: int | None, params) -> dict:
    return {"path": str(storage.path(init_from)), "step": step,
            "digest": params_digest(params)}


def trainable_only(params, trainable):
    """``params`` pruned to the leaves where ``trainable`` is true (nested dicts)."""
    if isinstance(params, dict) or hasattr(params, "items"):
        pruned = {}
        for key, value in params.items():
            sub = trainable_only(value, trainable[key])
            if sub is not None:
                pruned[key] = sub
        return pruned or None
    return params if trainable else None


def saved_view(state, trainer):
    """What a checkpoint of a partial-saving run holds: the state with frozen params dropped."""
    return state.replace(params=trainable_only(state.params, trainer.trainable) or {})


def abstract_saved_state(trainer):
    return saved_view(trainer.abstract_state, trainer)


def load_base(identity: dict, config, mesh, where: str, path: str | None = None):
    """The base params a PEFT checkpoint names, as host arrays, checked against its digest.
    ``path``: where the base is now, if it moved (default: the path recorded)."""
    from t5x_like.evaluation import loading
    path = path or identity["path"]
    if not storage.path(path).exists():
        raise UserError(f"{where} holds only the parameters a PEFT run trained; its base "
                        f"{path} is gone. Put the base back at that path, or merge it where it "
                        "is with `python -m t5x_like.peft merge --base=NEW_PATH ...`.")
    params, _ = loading.base_params(path, config, mesh, step=identity.get("step"))
    check_base(identity, params, where, path)
    return params


def check_base(identity: dict, params, where: str, path: str) -> None:
    found = params_digest(params)
    if found != identity["digest"]:
        step = f" step {identity['step']}" if identity.get("step") is not None else ""
        raise UserError(f"{where} was trained on the base {identity['path']}{step} (params "
                        f"digest {identity['digest'][:12]}), but {path} holds other params "
                        f"(digest {found[:12]}). Load it with the base it was trained on.")


def join(saved_params, base_params, trainer):
    """Full host params: the base's, under ``backbone`` when the model has a head, with the
    saved trainable leaves over them; placed on the trainer's mesh."""
    import jax
    from flax import traverse_util
    if "backbone" in trainer.abstract_state.params and "backbone" not in base_params:
        base_params = {"backbone": base_params}
    flat = traverse_util.flatten_dict(plain_dicts(base_params))
    flat.update(traverse_util.flatten_dict(plain_dicts(jax.device_get(saved_params))))
    return trainer.place_params(traverse_util.unflatten_dict(flat))


def restore_state(checkpointer, step: int, trainer, saved: dict, config, where: str,
                  base_path: str | None = None):
    """``(state, data_state)`` of a checkpoint step on ``trainer``: restored whole, or, for a
    PEFT checkpoint, its trainable part joined with the base it names (found at
    ``base_path`` if given)."""
    identity = saved.get(IDENTITY_KEY)
    if not identity:
        state, data_state, _ = checkpointer.restore(step, trainer.abstract_state)
        return state, data_state
    view, data_state, _ = checkpointer.restore(step, abstract_saved_state(trainer))
    base = load_base(identity, config, trainer.mesh, where, base_path)
    return view.replace(params=join(view.params, base, trainer)), data_state


# -- the merge command -------------------------------------------------------------------------

def check_foldable(settings, peft_path: str) -> None:
    """Only LoRA folds into the base's weights: the other methods add computation."""
    added = [name for name, on in (("adapters", settings.adapters),
                                   ("prefixes", settings.prefix),
                                   ("a prompt", settings.prompt)) if on]
    if added:
        raise UserError(f"--peft={peft_path} trained {' and '.join(added)}, which add "
                        "computation and cannot fold into the base's weights; evaluate the "
                        "run's checkpoint as it is.")
    if not settings.lora:
        raise UserError(f"--peft={peft_path} has no LoRA to merge (config.peft.lora.rank=0); its "
                        "checkpoint already loads on its own.")


def merge(peft_path: str, out: str, base_path: str | None = None) -> dict:
    """Folds a PEFT run's LoRA into its base and writes a pretrained folder; returns a
    summary (step, how many kernels merged)."""
    import jax
    from flax import traverse_util

    from t5x_like import partitioning
    from t5x_like.convert import pretrained
    from t5x_like.evaluation import loading
    from t5x_like.models import peft as peft_modules

    source = loading.resolve(peft_path, "--peft")
    if source.kind != "run":
        raise UserError(f"--peft={peft_path} is a pretrained folder, not a PEFT run; pass the "
                        "workdir (or checkpoints/<step>) of a run trained with config.peft.")
    steps = source.steps()
    if not steps:
        raise UserError(f"--peft={peft_path} holds no complete checkpoint yet.")
    step = steps[-1]
    saved = source.saved_config(step)
    config = loading.config_from_saved(saved)
    settings = peft_modules.PeftSettings.from_config(config.peft)
    check_foldable(settings, peft_path)
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    from t5x_like import trainer as trainer_lib
    trainer = trainer_lib.build_trainer(config, mesh)
    checkpointer = source.open_checkpointer()
    try:  # a run without init_from saved its whole model; else its base is joined back
        state, _ = restore_state(checkpointer, step, trainer, saved, config,
                                 f"--peft={peft_path}", base_path)
    finally:
        checkpointer.close()
    params = jax.device_get(state.params)
    merged = peft_modules.merge_lora(params, settings)
    count = sum(1 for key in traverse_util.flatten_dict(plain_dicts(params))
                if key[-1] == "lora_a")
    model_config = dict(config.model.to_dict())
    pretrained.save_pretrained(out, model_config, merged,
                               vocabulary=loading.trained_vocabulary(source, saved),
                               metadata={"merged_from": str(source.path), "step": step})
    if config.head.kind:
        (storage.path(out) / "head_config.json").write_text(
            json.dumps(config.head.to_dict(), indent=2, default=list))
    return {"step": step, "merged_kernels": count, "out": str(storage.path(out))}


@errors.command_line("peft")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.peft", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    merge_args = commands.add_parser("merge", help="Fold a run's LoRA into its base weights.")
    merge_args.add_argument("--peft", required=True,
                            help="The PEFT run's workdir or one checkpoints/<step> folder.")
    merge_args.add_argument("--out", required=True, help="A new folder for the merged model.")
    merge_args.add_argument("--base", default=None,
                            help="The base, if it moved (default: the path the run recorded); "
                                 "its params must be the ones the run was trained on.")
    args = parser.parse_args(argv)
    out = storage.path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out={args.out} exists and is not empty; choose a new folder so "
                          "nothing is overwritten.")
    result = merge(args.peft, args.out, args.base)
    print(f"Merged {result['merged_kernels']} LoRA kernels of step {result['step']} into "
          f"{result['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
