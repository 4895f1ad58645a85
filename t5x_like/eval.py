"""Evaluate checkpoints on a task or benchmark mixture (T5X's eval.py over seqio's Evaluator).

    python -m t5x_like.eval --checkpoint=runs/ft_t5 --mixture=embedded_bench --output_dir=runs/ft_t5/eval

``--checkpoint``: a training workdir (every checkpoint step, oldest first; steps already
in ``--output_dir`` are skipped, ``--watch`` waits for new ones), one step folder, or a
pretrained folder from ``convert import``. Writes ``metrics.jsonl`` (one line per step
and task), ``predictions/<task>/step_<N>.jsonl``, TensorBoard scalars, and prints a
table with the mixture's average. Decoders with ``--num_shots=K`` are scored as
lm-evaluation-harness scores multiple choice (``acc``, ``acc_norm``).
"""

from __future__ import annotations

import argparse
import sys
import time

from t5x_like import cli_flags, errors, resolving
from t5x_like.checkpoints import param_sources
from t5x_like.config import split_overrides
from t5x_like.errors import UserError
from t5x_like.evaluation import results as result_files
from t5x_like.evaluation import runner
from t5x_like.system import progress, storage

# Imports inside functions: keep JAX out of the command's start-up: a mistake in the config or
# the flags is reported before JAX loads.


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m t5x_like.eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_flags.add_module_flag(parser)
    parser.add_argument("--checkpoint", required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--mixture")
    what.add_argument("--task")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--split", default="validation")
    parser.add_argument("--max_examples", type=int, default=0, help="Per task; 0 = all.")
    parser.add_argument("--config", help="Config file for the model (default: the one saved "
                                         "with the checkpoint).")
    parser.add_argument("--watch", action="store_true",
                        help="Keep waiting for new checkpoints (until the run's last step).")
    parser.add_argument("--watch_interval_s", type=float, default=30.0)
    parser.add_argument("--watch_timeout_s", type=float, default=0.0,
                        help="Stop watching after this long without a new checkpoint (0: never).")
    parser.add_argument("--batch_size", type=int, default=0, help="0: the config's batch_size.")
    parser.add_argument("--inputs_length", type=int, default=0)
    parser.add_argument("--targets_length", type=int, default=0)
    parser.add_argument("--mode", default="auto", help="auto | predict | rank | score")
    parser.add_argument("--num_shots", type=int, default=None,
                        help="Decoders: k-shot lm-evaluation-harness multiple choice.")
    parser.add_argument("--few_shot_seed", type=int, default=1234)
    cli_flags.add_vocabulary_flag(parser)
    cli_flags.add_decoding_flags(parser.add_argument_group("decoding (predict mode)"))
    cli_flags.add_multi_process_flags(parser)
    parser.add_argument("--quiet", action="store_true")
    rest, overrides = split_overrides(argv)
    return parser.parse_args(rest), overrides


def run(args, overrides) -> int:
    import jax

    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.evaluation import evaluator

    source = param_sources.resolve(args.checkpoint)
    output_dir = storage.path(args.output_dir)
    if source.kind == "run" and output_dir.is_relative_to(source.path):
        raise UserError(f"--output_dir={args.output_dir} is inside the checkpoints folder "
                        f"{source.path}; evaluation never writes there. Use e.g. "
                        f"{source.path.parent / 'eval'}.")
    name = args.mixture or args.task
    tasks = evaluator.leaf_tasks(name)
    evaluator.check_metrics_installed(tasks)
    task_names = [t.name for t in tasks]
    is_chief = jax.process_index() == 0
    writer = result_files.ResultWriter(output_dir, enabled=is_chief)
    setup = None
    last_new = time.monotonic()
    say = (lambda line: print(line, flush=True)) if is_chief and not args.quiet else (
        lambda line: None)
    told: set[int] = set()
    try:
        while True:
            steps = source.steps()
            done = result_files.done_steps(output_dir, task_names, args.split)
            todo = [s for s in steps if s not in done]
            _say_skipped([s for s in steps if s in done and s not in told], output_dir,
                         args.split, say)
            told.update(steps)
            for step in todo:
                if setup is None:
                    setup = _setup(source, step, args, overrides, name)
                config, trainer, ev, weights = setup
                results = ev.evaluate(weights.restore(source, step, trainer))
                writer.write(step, results, args.split)
                if is_chief and not args.quiet:
                    print(result_files.format_table(step, results), flush=True)
                last_new = time.monotonic()
            if not args.watch or source.kind == "pretrained" or source.only_step is not None:
                break
            final = setup[0].num_train_steps if setup else None
            if final is not None and steps and max(steps) >= final:
                break  # the run has saved its last step
            if args.watch_timeout_s and time.monotonic() - last_new > args.watch_timeout_s:
                break
            time.sleep(args.watch_interval_s)
        if not source.steps():
            raise UserError(f"{source.path} holds no complete checkpoint yet; train first or "
                            "pass --watch to wait for one.")
    finally:
        writer.close()
    if setup is not None and jax.process_count() > 1 and not args.quiet:
        print(f"process {jax.process_index()} of {jax.process_count()}: converted "
              f"{setup[2].rows_made} model rows (the rows its devices hold)", flush=True)
    say(f"metrics: {output_dir / 'metrics.jsonl'}\npredictions: {output_dir / 'predictions'}")
    del partitioning, trainer_lib
    return 0


def _say_skipped(steps: list[int], output_dir, split: str, say) -> None:
    """Steps are evaluated once per output folder: say which were skipped and why."""
    if steps:
        say(f"step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}: already "
            f"evaluated on {split!r} in {output_dir / 'metrics.jsonl'}, skipped (another "
            "--output_dir evaluates again)")


def _setup(source, step, args, overrides, name):
    import jax

    from t5x_like import structures
    from t5x_like.checkpoints import int8_weights
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.evaluation import evaluator

    resolved = resolving.resolve_checkpoint(source, step, args.config, overrides, args.vocabulary)
    config, asked = resolved.spec, resolved.asked_vocabulary
    structure = structures.structure_class(config.model.family)
    structure.check_decoding(config, args.num_beams)
    structure.check_sampler(args.sampler, args.num_beams)
    line = structure.evaluation_line(config)
    if line and jax.process_index() == 0 and not args.quiet:
        print(line, flush=True)
    for task in evaluator.leaf_tasks(name, asked):
        resolving.check_vocabulary(config, task, resolved.trained_vocabulary, asked)
    _, trainer = trainer_lib.build_on_devices(config)
    lengths = runner.eval_lengths(config, args)
    runner.check_lengths(config, lengths, evaluator.leaf_tasks(name),
                  few_shot=args.num_shots is not None)
    settings = evaluator.EvalSettings(
        split=args.split, max_examples=args.max_examples,
        batch_size=args.batch_size or config.batch_size,
        max_decode_length=args.max_decode_length, num_beams=args.num_beams,
        alpha=args.alpha, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, sampler=args.sampler, mode=args.mode, num_shots=args.num_shots,
        few_shot_seed=args.few_shot_seed)
    weights = int8_weights.weights_for(config, structures.for_config(config), trainer)
    ev = runner.build_evaluator(config, trainer, name, settings, lengths, asked, weights)
    if jax.process_index() == 0 and not args.quiet:
        ev.meter = progress.Meter  # each task's batches: rows/s and ETA on stderr
    return config, trainer, ev, weights


@errors.command_line("eval")
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    cli_flags.import_modules(args.module)
    cli_flags.start_processes(args)
    return run(args, overrides)


if __name__ == "__main__":
    sys.exit(main())
