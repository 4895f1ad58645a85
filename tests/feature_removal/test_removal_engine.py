"""Removals of what keeps a run safe and exact: the workdir lock, the hang watchdog,
SIGTERM's save, the checkpoint manifest, rotation, the local tier, exact resume,
gradient accumulation, the NaN stop, elastic resume's microbatches, the trackers, and the
chunked logits that keep a big vocabulary's loss in memory."""

import os
import signal

import jax
import jax.numpy as jnp
from conftest import tiny_config
from removals import Removal, existing, proving_tests
from test_faults import saved_run  # noqa: F401  (the fixture the manifest check reads)
from test_trackers import tracking  # noqa: F401  (the fixture the trackers check reads)
from test_workdir_lock import TINY, plant

from t5x_like import objectives, train
from t5x_like.checkpoints import checkpoint_store, param_sources
from t5x_like.engine import optim
from t5x_like.resilience import divergence, holding, watchdog, workdir_lock
from t5x_like.telemetry import trackers
from t5x_like.training import loop, preflight

LOCAL_TIER = checkpoint_store.local_tier  # where the tier is, whatever a removal does


def a_held_workdir_is_refused(request):
    """``train`` in a workdir whose lock a live run on another host holds: exit 2 with one
    line naming that host and pid, before anything is written there."""
    workdir = request.getfixturevalue("tmp_path") / "run"
    plant(workdir, "pod-host-3", 4242, heartbeat_age_s=1)
    capsys = request.getfixturevalue("capsys")
    code = train.main(["--config=quickstart", f"--workdir={workdir}", "--quiet",
                       "--config.num_train_steps=2", *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2, (code, err)
    assert "pod-host-3" in err and "4242" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in workdir.iterdir()) == [workdir_lock.LOCK_NAME]


def _lock_always_granted(monkeypatch):
    monkeypatch.setattr(workdir_lock.WorkdirLock, "acquire", lambda self: None)
    monkeypatch.setattr(workdir_lock.WorkdirLock, "release", lambda self: None)


def _watchdog_never_fires(monkeypatch):
    monkeypatch.setattr(watchdog.HangWatchdog, "_watch", lambda self: None)


def _no_first_step_allowance(monkeypatch):
    monkeypatch.setattr(watchdog.HangWatchdog, "allowed_s",
                        property(lambda self: self.timeout_s))


def sigterm_saves_and_stops(request):
    """A SIGTERM during step 2 of a 6-step run: the run saves step 2 (checkpoints are due
    at 6 only) and returns there."""
    workdir = request.getfixturevalue("tmp_path") / "run"
    original = loop.Loop.train_step

    def step_then_term(self, batch):
        metrics = original(self, batch)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics
    loop.Loop.train_step = step_then_term
    try:
        result = train.run(tiny_config(num_train_steps=6, checkpoint_every_steps=6,
                                       eval_every_steps=0), str(workdir), quiet=True)
    finally:
        loop.Loop.train_step = original
    assert result["step"] == 2, result
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]


def _sigterm_ignored(monkeypatch):
    """SIGTERM is caught (the process lives on) but nothing asks the loop to save."""
    monkeypatch.setattr(holding.PreemptionFlag, "_handler", lambda self, signum, frame: None)


def local_tier_saves_first_and_resumes_from_it(request):
    """``checkpoint.local_dir``: steps are saved to the local tier and uploaded to the
    workdir; with the uploads lost, the next run resumes from the local copy."""
    tmp = request.getfixturevalue("tmp_path")
    workdir, local = tmp / "run", tmp / "local"
    capsys = request.getfixturevalue("capsys")

    def run(steps):
        config = tiny_config(num_train_steps=steps, eval_every_steps=0, checkpoint_every_steps=2,
                             log_every_steps=2)
        config.checkpoint.local_dir = str(local)
        return train.run(config, str(workdir))["step"]
    original = checkpoint_store._Uploader.upload
    checkpoint_store._Uploader.upload = lambda self, step: None  # the host died before uploads
    try:
        assert run(4) == 4
    finally:
        checkpoint_store._Uploader.upload = original
    tier = LOCAL_TIER(local, workdir / "checkpoints")
    assert tier.is_dir(), f"nothing was saved in the local tier ({tier})"
    assert sorted(int(p.name) for p in tier.iterdir() if p.name.isdigit()) == [2, 4]
    capsys.readouterr()
    assert run(6) == 6
    assert f"Resumed from {tier / '4'} at step 4." in capsys.readouterr().err
    assert (workdir / "checkpoints" / "6" / checkpoint_store.MANIFEST).exists()  # uploaded


def _no_local_tier(monkeypatch):
    monkeypatch.setattr(checkpoint_store, "local_tier",
                        lambda local_dir, directory, process=None: directory)


def _first_microbatch_only(monkeypatch):
    """Gradient accumulation runs the first microbatch, counted k times."""
    original = optim.accumulate_gradients

    def first_only(loss_and_grad, params, batch, num_microbatches, batch_axes):
        if num_microbatches == 1:
            return original(loss_and_grad, params, batch, 1, batch_axes)
        micro = optim.split_microbatches(batch, num_microbatches, batch_axes)
        (objective, metrics), grads = loss_and_grad(params, jax.tree.map(lambda x: x[0], micro), 0)
        k = float(num_microbatches)
        return (objective * k, metrics), jax.tree.map(lambda g: g * k, grads)
    monkeypatch.setattr(optim, "accumulate_gradients", first_only)


def _optimizer_state_lost_on_resume(monkeypatch):
    original = param_sources.restore_state

    def restore_state(*args, **kwargs):
        state, data_state = original(*args, **kwargs)
        return state.replace(opt_state=jax.tree.map(jnp.zeros_like, state.opt_state)), data_state
    monkeypatch.setattr(param_sources, "restore_state", restore_state)


def _no_manifest_check(monkeypatch):
    monkeypatch.setattr(checkpoint_store, "manifest_problem", lambda folder: None)


def _logits_projected_whole(monkeypatch):
    """The chunked loss projects every position at once: the same numbers, no slices."""
    def whole(project, hidden, targets, weights, *, chunks, normalizer, **options):
        return objectives.token_objective(project(hidden), targets, weights,
                                          normalizer=normalizer, **options)
    monkeypatch.setattr(objectives, "chunked_token_objective", whole)


def _nothing_rotated(monkeypatch):
    monkeypatch.setattr(checkpoint_store.Checkpointer, "steps_to_delete", lambda self, steps: [])


def _nonfinite_not_checked(monkeypatch):
    monkeypatch.setattr(divergence, "first_nonfinite_step", lambda fetched, step: None)


def _saved_rows_not_kept(monkeypatch):
    monkeypatch.setattr(preflight, "_holding_the_saved_rows",
                        lambda spec, newest, mesh_shape: (spec, ()))


def _every_replicated_write_split(monkeypatch):
    """Orbax's default: every replicated array's write is sliced between its replicas."""
    monkeypatch.setattr(checkpoint_store, "MIN_REPLICA_SLICE_BYTES", 0)


def _tracker_writes_nothing(tracker_class):
    def remove(monkeypatch):
        monkeypatch.setattr(tracker_class, "write", lambda self, step, scalars: None)
    return remove


WATCHDOG = existing("test_watchdog.py::test_watchdog_writes_every_threads_stack_and_exits_75")
FIRST_STEP = existing("test_watchdog.py::test_the_first_step_has_its_own_allowance_and_later_"
                      "steps_the_hang_timeout")
RESUME = existing("test_training.py::test_resume_gives_the_same_losses_as_an_uninterrupted_run")
MICROBATCHES = existing("test_optim_and_loss.py::test_k_microbatches_equal_one_batch_of_k_times_the_size")
MANIFEST = existing(
    "test_faults.py::test_every_kind_of_file_damaged_falls_back_to_the_previous_step")
ROTATION = existing("test_faults.py::test_saves_are_sealed_and_rotated")
NAN = existing(
    "test_engine_runs.py::test_nan_loss_stops_with_a_message_and_the_last_good_checkpoint_loads")
ELASTIC = existing("test_elastic_resume.py::test_a_resume_keeps_the_rows_each_device_held",
                   devices=4, mesh={"data": 4}, chosen=None, expected=2)
WHOLE_WRITES = existing(
    "test_faults.py::test_replicated_arrays_are_split_between_replicas_only_when_large")
LOGIT_CHUNKS = existing(
    "test_optim_and_loss.py::test_logit_chunks_hold_one_slice_of_logits_not_the_batchs")
TRACKERS = existing(
    "test_trackers.py::test_each_tracker_gets_the_same_scalars_and_the_config_and_a_resume_continues")

REMOVALS = [
    Removal("workdir lock", "`WorkdirLock.acquire` grants every caller",
            "`train` in a workdir a live run holds exits 2 naming its host and pid, writing "
            "nothing", _lock_always_granted, a_held_workdir_is_refused),
    Removal("hang watchdog", "the watchdog's thread never looks", "a stuck thread: stacks "
            "written, the summary names the phase, exit 75", _watchdog_never_fires, WATCHDOG[1],
            holds_in=WATCHDOG[0]),
    Removal("the first step's hang allowance", "every phase gets `hang_timeout_s`",
            "a first step five hang timeouts long is no hang; the next step's is",
            _no_first_step_allowance, FIRST_STEP[1], holds_in=FIRST_STEP[0]),
    Removal("SIGTERM saves and stops", "the SIGTERM handler records nothing",
            "SIGTERM during step 2 of 6: a checkpoint at step 2, the run returns there",
            _sigterm_ignored, sigterm_saves_and_stops),
    Removal("checkpoint manifests", "`manifest_problem` finds nothing wrong",
            "every kind of file damaged in the newest step: the previous step restores",
            _no_manifest_check, MANIFEST[1], holds_in=MANIFEST[0]),
    Removal("checkpoint rotation", "`steps_to_delete` deletes nothing",
            "keep=2 over 4 saves leaves the newest 2, sealed", _nothing_rotated, ROTATION[1],
            holds_in=ROTATION[0]),
    Removal("local checkpoint tier", "`local_tier` is the workdir itself",
            "saves land in the local tier; with uploads lost, the run resumes from the local "
            "copy", _no_local_tier, local_tier_saves_first_and_resumes_from_it),
    Removal("exact resume of the train state", "a restored state's optimizer state is zeroed",
            "8 steps straight and 4 + 4 resumed log the same losses, bit for bit (MoE on an "
            "expert mesh)", _optimizer_state_lost_on_resume, RESUME[1], holds_in=RESUME[0]),
    Removal("gradient accumulation", "only the first microbatch is run, counted k times",
            "2 microbatches give one batch's loss, grad norm and params", _first_microbatch_only,
            MICROBATCHES[1], holds_in=MICROBATCHES[0]),
    Removal("NaN stop", "`first_nonfinite_step` finds none", "a diverging run stops at step 2 "
            "naming it, the last good checkpoint (step 1) loads", _nonfinite_not_checked, NAN[1],
            holds_in=NAN[0]),
    Removal("elastic resume's microbatches", "the saved rows per device are not kept",
            "a run of 8 devices resumed on 4 trains in 2 microbatches, saying so",
            _saved_rows_not_kept, ELASTIC[1], holds_in=ELASTIC[0]),
    Removal("small replicated arrays saved whole", "every replicated write is split "
            "between replicas (`MIN_REPLICA_SLICE_BYTES` 0)", "saving a bias and a norm scale "
            "replicated over 8 devices compiles no slice program; a 16 MiB array still "
            "splits", _every_replicated_write_split, WHOLE_WRITES[1], holds_in=WHOLE_WRITES[0]),
    Removal("TensorBoard tracker", "its `write` drops the scalars", "the same scalars at the "
            "same steps in the event files as in W&B and MLflow, across a resume",
            _tracker_writes_nothing(trackers.TensorBoardTracker), TRACKERS[1],
            holds_in=TRACKERS[0]),
    Removal("Weights & Biases tracker", "its `write` drops the scalars",
            "the offline run's history holds every step's scalars",
            _tracker_writes_nothing(trackers.WandbTracker), TRACKERS[1], holds_in=TRACKERS[0]),
    Removal("MLflow tracker", "its `write` drops the scalars",
            "the store's metric history holds every step's scalars",
            _tracker_writes_nothing(trackers.MlflowTracker), TRACKERS[1], holds_in=TRACKERS[0]),
    Removal("chunked logits", "`chunked_token_objective` projects every position at once",
            "with 8 slices the compiled loss and gradient hold under a third of the whole "
            "logits' temporaries", _logits_projected_whole, LOGIT_CHUNKS[1],
            holds_in=LOGIT_CHUNKS[0]),
]

globals().update(proving_tests(REMOVALS))
