"""Where a checkpoint's params are and how they are read: a run's workdir (every complete
step, oldest first), one step folder (``<workdir>/checkpoints/<step>``) or a params-only
pretrained folder (``model_config.json`` + ``params/``, from ``convert import``).
Checkpoints are opened read-only: readers never write into, clean or rotate them.
"""

from __future__ import annotations

import dataclasses
import json

from etils import epath

from t5x_like.checkpoints.param_sources import peft_partial
from t5x_like.config import RunSpec, migrated, model_spec_of, spec_of
from t5x_like.errors import ConfigError, UserError
from t5x_like.system import storage

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it (finding a checkpoint's steps
# and config needs no JAX; loading its params does).


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str                         # "run" | "pretrained"
    path: epath.Path                  # the checkpoints/ folder, or the pretrained folder
    only_step: int | None = None      # a single step folder was given

    def steps(self) -> list[int]:
        if self.kind == "pretrained":
            return [0]
        if self.only_step is not None:
            return [self.only_step]
        return self.open_checkpointer().all_steps()

    def open_checkpointer(self):
        """A read-only checkpointer over the run's steps (close it after use)."""
        from t5x_like.checkpoints import checkpoint_store
        return checkpoint_store.Checkpointer(self.path, keep=1, async_save=False, read_only=True)

    def saved_config(self, step: int) -> dict:
        """The run config saved with ``step`` (pretrained folders: their model, and under
        ``run`` what of a run they carry, ``checkpoints.pretrained.RUN_KEYS``)."""
        if self.kind == "pretrained":
            saved = {"model": json.loads((self.path / "model_config.json").read_text())}
            run = self.path / "run_config.json"
            if run.is_file():
                saved["run"] = json.loads(run.read_text())
            return saved
        checkpointer = self.open_checkpointer()
        try:
            return checkpointer.restore_config(step)
        except Exception as e:  # noqa: BLE001 - an unreadable config item is damage
            from t5x_like.checkpoints.checkpoint_store import one_line
            raise UserError(f"Checkpoint {self.path / str(step)} has no readable config "
                            f"({one_line(e)}); evaluate another step.") from None
        finally:
            checkpointer.close()

    def restore_params(self, step: int, trainer, base_path: str | None = None,
                       where: str | None = None):
        """Params of ``step`` on the trainer's mesh and shardings (a PEFT step joined with
        its base, found at ``base_path`` if it moved; ``where`` names the step in errors)."""
        from t5x_like.checkpoints import checkpoint_store, pretrained
        from t5x_like.engine import trainer as trainer_lib
        if self.kind == "pretrained":
            _, params = pretrained.load_pretrained(self.path)
            try:
                return trainer.place_params(params)
            except ValueError as e:
                raise UserError(f"{self.path}: {e}") from None
        folder = self.path / str(step)
        problem = checkpoint_store.manifest_problem(folder)
        if problem is not None:
            raise UserError(f"Checkpoint {folder} is damaged ({problem}); evaluate another "
                            "step, or resume training, which moves it aside.")
        saved = self.saved_config(step)
        run_spec = config_from_saved(saved)
        # A run whose params hold helpers (PPO's value model) restores whole; its trained
        # part is what the caller's trainer reads.
        restoring = trainer_lib.trainer_to_restore(run_spec, trainer)
        checkpointer = self.open_checkpointer()
        try:
            state, _ = restore_state(checkpointer, step, restoring[0], saved, run_spec,
                                     where=where or str(folder), base_path=base_path)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - a read failure is the checkpoint's, not ours
            raise UserError(f"Checkpoint {folder} does not restore ({checkpoint_store.one_line(e)}); "
                            "evaluate another step, or resume training, which moves a damaged "
                            "step aside.") from None
        finally:
            checkpointer.close()
        return trainer.trained_params_of(restoring, state)


def load_params(source: Source, step: int, config, mesh=None, base_path: str | None = None,
                where: str | None = None) -> dict:
    """Host params of ``source``'s ``step``: the one way every reader of checkpoints
    (``init_from``, a distillation teacher, ``convert export``, ``peft merge``, the
    embedding analyses) loads them. A pretrained folder's arrays as saved; a run's step
    restored onto a trainer for ``config`` (the config the step was saved with) on
    ``mesh`` (default: this process's first device), a PEFT step joined with its base; of
    a run whose params hold helpers (PPO's value model), the model it trained."""
    import jax

    from t5x_like.checkpoints import pretrained
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib

    if source.kind == "pretrained":
        return pretrained.load_pretrained(source.path)[1]
    mesh = mesh if mesh is not None else partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    trainer = trainer_lib.build_trainer(trainer_lib.trained_model_spec(config), mesh)
    return jax.device_get(source.restore_params(step, trainer, base_path, where))


def base_params(init_from: str, config, mesh, step: int | None = None) -> tuple[dict, int | None]:
    """``(host params, step)`` of what fine-tuning starts from: a params-only folder
    (``convert import``; step None), or a run's workdir or step folder (its newest
    step, or ``step``), checked to hold ``config``'s model."""
    from t5x_like.checkpoints import pretrained

    try:
        source = resolve(init_from)
    except UserError:
        raise UserError(
            f"init_from={init_from!r} is not a pretrained folder (no model_config.json), "
            "a training workdir or a checkpoint step folder; point it at the --out folder of "
            "`python -m t5x_like.convert import` or at a run's workdir.") from None
    if source.kind == "pretrained":
        model_config, params = pretrained.load_pretrained(source.path)
        check_same_model({"model": model_config}, config, source=f"init_from={init_from!r}")
        return params, None
    steps = source.steps()
    if not steps:
        raise UserError(f"init_from={init_from!r} holds no complete checkpoint yet.")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"init_from={init_from!r} no longer holds step {step} (it has "
                        f"{steps}); restore that step or use the base it was trained on.")
    saved = source.saved_config(step)
    check_same_model(saved, config, source=f"init_from={init_from!r}")
    return load_params(source, step, config_from_saved(saved), mesh), step


def resolve(path: str, flag: str = "--checkpoint") -> Source:
    """Where ``path`` (given as ``flag``, which error messages name) keeps its params."""
    storage.check_checkpoint_location(path, flag)
    folder = storage.path(path)
    if not folder.exists():
        raise UserError(f"{flag}={path}: no such folder. Pass a training workdir, one of "
                        "its checkpoints/<step> folders, or a `convert import` output folder.")
    if (folder / "model_config.json").is_file():
        return Source("pretrained", folder)
    if (folder / "checkpoints").is_dir():
        return Source("run", folder / "checkpoints")
    if folder.name.isdigit() and (folder / "state").is_dir():
        return Source("run", folder.parent, only_step=int(folder.name))
    if folder.name == "checkpoints" and any(p.name.isdigit() for p in folder.iterdir()):
        return Source("run", folder)
    raise UserError(f"{flag}={path} is not a training workdir (no checkpoints/), a "
                    "checkpoint step folder (no state/) or a pretrained folder (no "
                    "model_config.json).")


def newest_saved(path: str, key: str) -> tuple[Source, int, dict]:
    """``(source, step, saved config)`` of the newest checkpoint at ``path``, a run,
    step or pretrained folder a config ``key`` names (a teacher, a reference, a reward
    model), read without its arrays; refused naming ``key``."""
    try:
        source = resolve(path, key)
    except UserError as e:
        raise UserError(f"{key}: {e}") from None
    steps = source.steps()
    if not steps:
        raise UserError(f"{key}={path!r} holds no complete checkpoint yet.")
    return source, steps[-1], source.saved_config(steps[-1])


def config_from_saved(saved: dict) -> RunSpec:
    """The spec a run's checkpoint was saved with (its config in either layout; keys added
    since take their defaults; the fingerprint and a PEFT run's base identity saved
    beside it are not config keys). The task lengths are the run's own: no default
    length joins them (a default "inputs" would turn a decoder LM into a prefix LM)."""
    return spec_of(saved)


def saved_layout(saved: dict) -> dict:
    """A saved config in the sectioned layout (old spellings moved), as a dict."""
    return migrated(saved)[0]


def load_base(identity: dict, config, mesh, where: str, path: str | None = None):
    """The base params a PEFT checkpoint names, as host arrays, checked against its digest.
    ``path``: where the base is now, if it moved (default: the path recorded)."""
    path = path or identity["path"]
    if not storage.path(path).exists():
        raise UserError(f"{where} holds only the parameters a PEFT run trained; its base "
                        f"{path} is gone. Put the base back at that path, or merge it where it "
                        "is with `python -m t5x_like.peft merge --base=NEW_PATH ...`.")
    params, _ = base_params(path, config, mesh, step=identity.get("step"))
    check_base(identity, params, where, path)
    return params


def check_base(identity: dict, params, where: str, path: str) -> None:
    found = peft_partial.params_digest(params)
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

    from t5x_like.models.peft_modules import plain_dicts  # imports Flax: only when joining
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
    identity = saved.get(peft_partial.IDENTITY_KEY)
    if not identity:
        state, data_state, _ = checkpointer.restore(step, trainer.abstract_state)
        return state, data_state
    view, data_state, _ = checkpointer.restore(step, peft_partial.abstract_saved_state(trainer))
    base = load_base(identity, config, trainer.mesh, where, base_path)
    return view.replace(params=join(view.params, base, trainer)), data_state


def check_same_model(saved_config: dict, config, source: str) -> None:
    """Refuses a pretrained ``source`` (init_from, eval --config) of another model. Keys a
    folder leaves out (an import, an older run) are at their defaults; the ``variant``
    (a name) is not compared."""
    current = spec_of(config).model
    try:
        saved = model_spec_of(saved_config.get("model", {}))
    except ConfigError as e:
        raise UserError(f"{source} holds a model this code cannot read ({e}).") from None
    if getattr(current, "bos_id", 0) < 0:  # undecided: a run takes its checkpoint's start id
        current = current.replace(bos_id=getattr(saved, "bos_id", 0))
    saved_model, current = (_flat(model.replace(variant="")) for model in (saved, current))
    details = [f"model.{k}: checkpoint {saved_model.get(k)!r} vs config {current.get(k)!r}"
               for k in sorted(set(saved_model) | set(current))
               if _normalise(saved_model.get(k)) != _normalise(current.get(k))]
    if details:
        raise UserError(
            f"{source} holds a different model ({', '.join(details)}). Set the model keys to "
            "the pretrained model's, e.g. use the config it was trained or converted with.")


def _flat(model) -> dict:
    return dict(_leaves(model.to_dict()))


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _normalise(value):
    return list(value) if isinstance(value, tuple) else value
