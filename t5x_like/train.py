"""Pretraining entry point.

    python -m t5x_like.train --config=configs/quickstart.py --workdir=/tmp/run \
        [--config.num_train_steps=500 --config.batch_size=32 ...]

Writes ``metrics.jsonl``, TensorBoard events, orbax checkpoints and the resolved
config under ``--workdir``, and resumes from the newest checkpoint found there.

Read top to bottom: ``main`` reads the config; ``run`` resolves the run (every check,
``preflight.resolve_training``: before the workdir lock, any restore or any compile), holds
the workdir (lock, watchdog, goodput, SIGTERM: ``resilience.holding``), starts the state
(``starting_state``), then loops: a batch, a step, then whatever is due
(``loop.Loop``: logging with the divergence checks, the evaluators of
``config.evals``, checkpoints, preemption).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys

from t5x_like import cli_flags, config, errors, resolving
from t5x_like.telemetry import goodput_events, trackers

# Imports inside functions: keep JAX out of the command's start-up: a mistake in the config or
# the flags is reported before JAX loads.

USAGE = ("python -m t5x_like.train --config=FILE_OR_NAME --workdir=DIR [--config.KEY=VALUE ...]\n"
         "  e.g. python -m t5x_like.train --config=quickstart --workdir=/tmp/t5x_like_run "
         "--config.num_train_steps=100")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Splits ``--config.key=value`` overrides from the other flags."""
    parser = argparse.ArgumentParser(prog="python -m t5x_like.train", usage=USAGE,
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="Python config file with get_config().")
    parser.add_argument("--workdir", required=True,
                        help="Output directory; an existing run there is resumed.")
    parser.add_argument("--quiet", action="store_true", help="No progress output.")
    cli_flags.add_module_flag(parser)
    cli_flags.add_multi_process_flags(parser)
    rest, overrides = config.split_overrides(argv)
    return parser.parse_args(rest), overrides


def run(run_config, workdir: str, config_path: str = "CONFIG", quiet: bool = False,
        devices=None, overrides: list[str] = (), modules: list[str] = (),
        command: str = "") -> dict:
    """Trains to ``num_train_steps``; returns the last train and eval metrics and the step.
    ``devices`` defaults to all devices; tests pass a subset to compare meshes.
    ``command``: the command line that launched this (``main``), which the loop keeps in
    the workdir (``checkpoints.run_commands``)."""
    from t5x_like.training import loop, preflight  # JAX starts here: after the config is read

    resolved = preflight.resolve_training(run_config, workdir, devices)
    with loop.holding(resolved, quiet) as held:
        run_loop = loop.Loop(resolved, held, command)
        try:
            while run_loop.step < resolved.spec.num_train_steps:
                # A bad row met mid-run says at which step; the loop ends before the
                # step's checkpoint, so the workdir keeps only the steps before it.
                with errors.at_step(run_loop.step + 1):
                    batch = run_loop.next_batch()
                metrics = run_loop.train_step(batch)
                with errors.at_step(run_loop.step):
                    run_loop.after_step(metrics)
                if run_loop.preempted:
                    break
            held.status = "preempted" if run_loop.preempted else "done"
        finally:
            run_loop.close()  # waits for the last checkpoint save, however the loop ended
    if run_loop.is_chief:
        account = run_loop.account()
        if not quiet:
            print(_summary(resolved.workdir, run_loop.checkpointer.latest_step(),
                           run_loop.last_train, run_loop.last_eval, config_path, resolved.spec,
                           overrides, modules), flush=True)
            print(goodput_events.one_line(account), flush=True)
    return {"train": run_loop.last_train, "eval": run_loop.last_eval, "step": run_loop.step}


def _summary(workdir, latest, last_train, last_eval, config_path, spec, overrides=(),
             modules=()) -> str:
    lines = ["", "Done."]
    if last_train:
        lines.append(f"  final train loss  {last_train['loss']:.4f}")
    if "eval_loss" in (last_eval or {}):
        lines.append(f"  held-out loss     {last_eval['eval_loss']:.4f}")
    lines += [
        f"  checkpoint        {workdir / 'checkpoints' / str(latest)}",
        f"  metrics           {workdir / 'metrics.jsonl'}",
        *(["  TensorBoard       " + tensorboard_command(workdir / "tensorboard")]
          if "tensorboard" in spec.trackers else []),
        *_tracker_lines(workdir, spec),
        f"  resolved config   {workdir / 'config.json'}",
        "  continue training (resumes from the checkpoint):",
        "    " + shlex.join(
            [cli_flags.this_python(), "-m", "t5x_like.train", f"--config={config_path}",
             f"--workdir={workdir}"] + [f"--module={m}" for m in modules]
            + [f"--config.{o}" for o in overrides if not o.startswith("num_train_steps=")]
            + [f"--config.num_train_steps={spec.num_train_steps * 2}"]),
    ]
    return "\n".join(lines)


def _tracker_lines(workdir, spec) -> list[str]:
    """Where the W&B and MLflow runs are (their ids, kept for a resume)."""
    lines = []
    if "wandb" in spec.trackers:
        run_id = trackers.saved_run_id(workdir, "wandb", spec.tracking)
        where = (f"offline, upload with: wandb sync {workdir / 'wandb'}/offline-run-*-{run_id}"
                 if trackers.wandb_mode(spec.tracking) == "offline"
                 else f"project {trackers.project(spec.tracking)}")
        lines.append(f"  W&B run           {run_id} ({where})")
    if "mlflow" in spec.trackers:
        run_id = trackers.saved_run_id(workdir, "mlflow", spec.tracking)
        lines.append(f"  MLflow run        {run_id} (experiment "
                     f"{trackers.project(spec.tracking)}, {trackers.mlflow_uri(spec.tracking)})")
    return lines


def tensorboard_command(logdir) -> str:
    """A line that serves ``logdir`` from this Python, with the install in front when the
    ``tensorboard`` extra is missing (train writes the events with tensorboardX alone)."""
    python = cli_flags.this_python()
    serve = shlex.join([python, "-m", "tensorboard.main", "--logdir", str(logdir)])
    if importlib.util.find_spec("tensorboard") is not None:
        return serve
    return f"{python} -m {errors.install_hint('tensorboard')} && {serve}"


@errors.command_line("train")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    cli_flags.import_modules(args.module)
    run_config = resolving.load_config(args.config, overrides)
    timeout = config.spec_of(run_config).resilience.startup_timeout_s
    cli_flags.start_processes(args, timeout, args.workdir)
    try:
        run(run_config, args.workdir, config_path=args.config, quiet=args.quiet,
            overrides=overrides, modules=args.module,
            command=shlex.join([cli_flags.this_python(), "-m", "t5x_like.train", *argv]))
    except FloatingPointError as e:  # not the user's mistake: the run's outcome, exit 1
        print(f"Training diverged: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
