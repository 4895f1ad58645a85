"""Where a run's scalars go besides ``metrics.jsonl``: TensorBoard, Weights & Biases, MLflow.

``config.trackers`` names any combination; each receives the same scalars at the same
steps (train's interval averages and the evaluators' metrics) and the resolved config
as the run's parameters. A run resumed in the same workdir continues the same tracker
runs: their ids are kept in ``WORKDIR/trackers.json`` (W&B's ``resume="allow"`` on the
same id; MLflow logs on into the same run). Only process 0 tracks.

W&B and MLflow are optional extras (``wandb``, ``mlflow``); a run that names one that is
not installed, or W&B online without an API key, is refused before anything runs
(``check_ready``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import string
import time
from collections.abc import Mapping

from t5x_like import errors
from t5x_like.system import storage

# Imports inside functions: each tracker's client (wandb, mlflow) loads only when that tracker
# is asked for.

IDS_FILE = "trackers.json"
# The library each tracker imports, and the extra that installs it.
LIBRARIES = {"tensorboard": ("tensorboardX", ""), "wandb": ("wandb", "wandb"),
             "mlflow": ("mlflow", "mlflow")}
MLFLOW_PARAM_LENGTH = 6000  # MLflow refuses longer parameter values
MLFLOW_BATCH = 100  # params per log_batch call


def check_ready(trackers, tracking) -> None:
    """Refuses, before anything runs, a tracker whose library is missing, and W&B online
    without an API key (it would stop the run after the restore, asking for a login)."""
    for name in trackers:
        module, extra = LIBRARIES[name]
        if importlib.util.find_spec(module) is None:
            raise errors.UserError(f"trackers names {name!r}, which needs {module}; install it "
                                   f"({errors.install_hint(extra)}) or leave {name} out of "
                                   "--config.trackers.")
    if ("wandb" in trackers and wandb_mode(tracking) not in ("offline", "disabled", "dryrun")
            and not _wandb_key()):
        raise errors.UserError("trackers names 'wandb' online and no W&B API key is set; run "
                               "`wandb login` or set WANDB_API_KEY, or log offline with "
                               "--config.tracking.wandb_mode=offline (then `wandb sync`).")


def _wandb_key() -> bool:
    """An API key where W&B looks: WANDB_API_KEY, or its host in ~/.netrc (``wandb login``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def flat_params(tree: Mapping, prefix: str = "") -> dict[str, str]:
    """``{"optimizer.learning_rate": "0.01", ...}``: the config as one level of text."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=list)
    return out


def project(tracking) -> str:
    """The W&B project and the MLflow experiment."""
    return tracking.project or "t5x_like"


def wandb_mode(tracking) -> str:
    """The config's W&B mode, else WANDB_MODE, else online."""
    return tracking.wandb_mode or os.environ.get("WANDB_MODE", "online")


def run_name(workdir, tracking) -> str:
    return tracking.name or str(workdir).rstrip("/").rsplit("/", 1)[-1]


def saved_key(name: str, tracking) -> str:
    """Where a tracker's run id is kept in trackers.json: a run continues only in the same
    W&B project or MLflow store (another one starts a run of its own there)."""
    if name == "wandb":
        return f"wandb {tracking.wandb_entity}/{project(tracking)}"
    if name == "mlflow":
        return f"mlflow {tracking.mlflow_uri or os.environ.get('MLFLOW_TRACKING_URI', '')}"
    return name


class TensorBoardTracker:
    """Event files under ``WORKDIR/tensorboard`` (tensorboardX writes gs:// and s3://)."""

    def __init__(self, workdir, tracking, run_config, saved_id):
        self._writer = storage.summary_writer(storage.path(workdir) / "tensorboard")
        self.run_id = ""

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self, failed: bool = False) -> None:
        self._writer.close()


class WandbTracker:
    """A W&B run: the config as its config, each interval one ``log`` at its step."""

    def __init__(self, workdir, tracking, run_config, saved_id):
        import wandb
        local = storage.path(workdir)
        # W&B's own ids are 8 lowercase letters and digits.
        self.run_id = saved_id or "".join(secrets.choice(string.ascii_lowercase + string.digits)
                                           for _ in range(8))
        self._run = wandb.init(
            project=project(tracking), entity=tracking.wandb_entity or None,
            name=run_name(workdir, tracking), id=self.run_id, resume="allow",
            mode=tracking.wandb_mode or None,
            dir=None if storage.is_remote(workdir) else os.fspath(local))
        self._run.config.update(dict(run_config), allow_val_change=True)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self, failed: bool = False) -> None:
        self._run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run in the experiment ``project``: the flattened config as its params,
    every scalar a metric at its step."""

    def __init__(self, workdir, tracking, run_config, saved_id):
        from mlflow.tracking import MlflowClient
        self._client = MlflowClient(tracking_uri=tracking.mlflow_uri or None)
        if saved_id:
            self.run_id = saved_id
            self._client.update_run(saved_id, status="RUNNING")
        else:
            experiment = self._client.get_experiment_by_name(project(tracking))
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self._client.create_experiment(project(tracking)))
            self.run_id = self._client.create_run(
                experiment_id, run_name=run_name(workdir, tracking),
                tags={"t5x_like.workdir": str(workdir)}).info.run_id
        self._log_params(flat_params(run_config))

    def _log_params(self, params: Mapping[str, str]) -> None:
        """The params this run has not logged yet: MLflow keeps a param's first value (a
        resumed run's changes are in WORKDIR/config.json)."""
        from mlflow.entities import Param
        logged = self._client.get_run(self.run_id).data.params
        new = [Param(key, value[:MLFLOW_PARAM_LENGTH]) for key, value in params.items()
               if key not in logged]
        for start in range(0, len(new), MLFLOW_BATCH):
            self._client.log_batch(self.run_id, params=new[start:start + MLFLOW_BATCH])

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[
            Metric(re.sub(r"[^\w\-./ ]", "_", key), value, now, step)
            for key, value in scalars.items()])

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def mlflow_uri(tracking) -> str:
    """The MLflow store a run logs to: the config's, else MLFLOW_TRACKING_URI, else MLflow's
    default."""
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=tracking.mlflow_uri or None).tracking_uri


def _saved_ids(workdir) -> dict[str, str]:
    """``WORKDIR/trackers.json``: run ids by ``saved_key`` (empty before the first run)."""
    ids_path = storage.path(workdir) / IDS_FILE
    return json.loads(ids_path.read_text()) if ids_path.exists() else {}


def saved_run_id(workdir, name: str, tracking) -> str:
    """The run id ``name`` logs to in this workdir ("" before its first run)."""
    return _saved_ids(workdir).get(saved_key(name, tracking), "")


KINDS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def open_trackers(workdir, trackers, tracking, run_config: Mapping) -> list:
    """The trackers ``trackers`` names, continuing the runs this workdir started before."""
    saved = _saved_ids(workdir)
    keys = [saved_key(name, tracking) for name in trackers]
    opened = [KINDS[name](workdir, tracking, run_config, saved.get(key, ""))
              for name, key in zip(trackers, keys, strict=True)]
    ids = dict(saved) | {key: t.run_id for key, t in zip(keys, opened, strict=True) if t.run_id}
    if ids != saved:
        storage.write_atomic(storage.path(workdir) / IDS_FILE, json.dumps(ids, indent=1))
    return opened
