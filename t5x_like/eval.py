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
import json
import os
import sys
import time

from t5x_like import cli_flags, config_lib, errors, storage
from t5x_like.errors import UserError


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
    add_vocabulary_flag(parser)
    add_decoding_flags(parser.add_argument_group("decoding (predict mode)"))
    cli_flags.add_multi_process_flags(parser)
    parser.add_argument("--quiet", action="store_true")
    rest, overrides = config_lib.split_overrides(argv)
    return parser.parse_args(rest), overrides


def add_vocabulary_flag(parser) -> None:
    parser.add_argument(
        "--vocabulary", default="",
        help="Re-tokenize every text task: 'checkpoint' (the tokenizer the checkpoint "
             "carries, e.g. an imported GPT-2's) or a tokenizer folder / tokenizer.json / "
             ".model path. Default: each task's own vocabulary, which must be the "
             "checkpoint's.")


def add_decoding_flags(group) -> None:
    """The decoding flags ``eval`` and ``infer`` share (greedy, beam, sampling)."""
    group.add_argument("--max_decode_length", type=int, default=0,
                       help="0: the targets length.")
    group.add_argument("--num_beams", type=int, default=1)
    group.add_argument("--alpha", type=float, default=0.6, help="Beam length penalty.")
    group.add_argument("--temperature", type=float, default=0.0, help="0: greedy.")
    group.add_argument("--top_k", type=int, default=0)
    group.add_argument("--top_p", type=float, default=1.0)
    group.add_argument("--seed", type=int, default=0)


def eval_lengths(config, args=None) -> dict[str, int]:
    lengths = dict(config.task_feature_lengths)
    if args is not None:
        if args.inputs_length:
            lengths["inputs"] = args.inputs_length
        if args.targets_length:
            lengths["targets"] = args.targets_length
    return lengths


def check_lengths(config, lengths: dict[str, int], tasks, few_shot: bool = False) -> None:
    """Lengths the model cannot take, refused before anything is compiled: a decoder
    trained without inputs asked to read a task's inputs (few-shot scoring reads them
    as text in its own window), or more tokens than its learned positions."""
    from t5x_like import models
    structure = models.structure(config.model.family)
    with_inputs = [t.name for t in tasks if "inputs" in t.output_features]
    if structure == "decoder" and with_inputs and "inputs" not in lengths and not few_shot:
        raise UserError(
            f"Task {with_inputs[0]!r} has inputs, and this decoder's lengths "
            f"{lengths} have none; give both, e.g. --inputs_length=128 --targets_length=32 "
            f"(their sum at most model.max_length={config.model.get('max_length')}).")
    limit = config.model.get("max_length")
    if structure == "decoder" and config.model.get("position_embedding") == "rotary":
        limit = None
    total = (sum(lengths.values()) if structure == "decoder"
             else lengths.get("inputs", 0) if structure == "encoder" else 0)
    if limit and total > limit:
        raise UserError(
            f"Lengths {lengths} need {total} positions, but the model has "
            f"max_length={limit} learned positions; lower --inputs_length/--targets_length "
            f"so they sum to at most {limit}.")


def build_evaluator(config, trainer, name: str, settings, lengths=None, vocabulary=None):
    """The evaluator for a run config on the trainer's mesh (used by ``train`` too);
    ``vocabulary`` re-tokenizes the tasks (a checkpoint's own tokenizer)."""
    from t5x_like.evaluation import evaluator
    from t5x_like.models import structures
    return evaluator.Evaluator(structures.for_config(config), trainer.mesh, trainer.rules,
                               trainer.state_shardings.params, name,
                               lengths or dict(config.task_feature_lengths), settings,
                               vocabulary=vocabulary)


def done_steps(output_dir, task_names, split: str = "validation") -> set[int]:
    """Steps whose every task already has a line for ``split`` in ``metrics.jsonl``."""
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        return set()
    seen: dict[int, set] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by an interruption; its step is evaluated again
        if record.get("split", "validation") != split:
            continue
        seen.setdefault(int(record["step"]), set()).add(record.get("task"))
    return {step for step, tasks in seen.items() if set(task_names) <= tasks}


class ResultWriter:
    """``metrics.jsonl``, predictions and TensorBoard under ``output_dir`` (process 0 only)."""

    def __init__(self, output_dir, enabled: bool):
        self.output_dir = output_dir
        self.enabled = enabled
        self._tb = None
        if enabled:
            output_dir.mkdir(parents=True, exist_ok=True)
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(logdir=os.fspath(output_dir / "tensorboard"))

    def write(self, step: int, results, split: str = "validation") -> None:
        if not self.enabled:
            return
        from t5x_like.evaluation import evaluator
        for result in results:
            folder = self.output_dir / "predictions" / result.task
            folder.mkdir(parents=True, exist_ok=True)
            storage.write_atomic(folder / f"step_{step}.jsonl", "".join(
                json.dumps(record, ensure_ascii=False) + "\n" for record in result.records))
            for key, value in result.metrics.items():
                self._tb.add_scalar(f"{result.task}/{key}", float(value), global_step=step)
        mean = evaluator.average(results)
        if mean is not None and len(results) > 1:
            self._tb.add_scalar("average", mean, global_step=step)
        self._tb.flush()
        # The step's lines go in one append, after its predictions: an interrupted step
        # leaves no line and is evaluated again, never twice.
        lines = "".join(json.dumps(dict(r, split=split)) + "\n"
                        for r in evaluator.as_records(results, step))
        log = storage.AppendLog(self.output_dir / "metrics.jsonl")
        try:
            log.append(lines)
        finally:
            log.close()

    def close(self):
        if self._tb is not None:
            self._tb.close()


def format_table(step: int, results) -> str:
    from t5x_like.evaluation import evaluator
    lines = [f"step {step}"]
    width = max(len(r.task) for r in results)
    for r in results:
        values = ", ".join(f"{k} {v:.2f}" if abs(v) >= 1 else f"{k} {v:.4f}"
                           for k, v in r.metrics.items())
        lines.append(f"  {r.task:<{width}}  [{r.mode}]  {values}")
    mean = evaluator.average(results)
    if mean is not None and len(results) > 1:
        lines.append(f"  {'average':<{width}}  {mean:.2f}")
    return "\n".join(lines)


def run(args, overrides) -> int:
    import jax

    from t5x_like import partitioning
    from t5x_like import trainer as trainer_lib
    from t5x_like.data import get_task_or_mixture  # noqa: F401  (registers the built-in tasks)
    from t5x_like.evaluation import evaluator, loading

    source = loading.resolve(args.checkpoint)
    output_dir = storage.path(args.output_dir)
    if source.kind == "run" and output_dir.is_relative_to(source.path):
        raise UserError(f"--output_dir={args.output_dir} is inside the checkpoints folder "
                        f"{source.path}; evaluation never writes there. Use e.g. "
                        f"{source.path.parent / 'eval'}.")
    name = args.mixture or args.task
    task_names = [t.name for t in evaluator.leaf_tasks(name)]
    is_chief = jax.process_index() == 0
    writer = ResultWriter(output_dir, enabled=is_chief)
    setup = None
    last_new = time.monotonic()
    try:
        while True:
            steps = source.steps()
            todo = [s for s in steps if s not in done_steps(output_dir, task_names, args.split)]
            for step in todo:
                if setup is None:
                    setup = _setup(source, step, args, overrides, name)
                config, trainer, ev = setup
                params = source.restore_params(step, trainer)
                results = ev.evaluate(params)
                writer.write(step, results, args.split)
                if is_chief and not args.quiet:
                    print(format_table(step, results), flush=True)
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
    if is_chief and not args.quiet:
        print(f"metrics: {output_dir / 'metrics.jsonl'}\npredictions: "
              f"{output_dir / 'predictions'}", flush=True)
    del partitioning, trainer_lib
    return 0


def _setup(source, step, args, overrides, name):
    import jax

    from t5x_like import partitioning
    from t5x_like import trainer as trainer_lib
    from t5x_like.evaluation import evaluator, loading

    config = loading.run_config(source, step, args.config, overrides)
    saved = source.saved_config(step)
    trained = loading.trained_vocabulary(source, saved)
    asked = loading.resolve_vocabulary(args.vocabulary, source, trained)
    for task in evaluator.leaf_tasks(name, asked):
        loading.check_vocabulary(config, task, trained, asked)
    devices = jax.devices()
    mesh_shape = config_lib.validate_for_devices(config, len(devices), jax.process_count(),
                                                 partitioning.num_slices(devices))
    mesh = partitioning.make_mesh(mesh_shape, devices)
    trainer = trainer_lib.build_trainer(config, mesh)
    lengths = eval_lengths(config, args)
    check_lengths(config, lengths, evaluator.leaf_tasks(name),
                  few_shot=args.num_shots is not None)
    settings = evaluator.EvalSettings(
        split=args.split, max_examples=args.max_examples,
        batch_size=args.batch_size or config.batch_size,
        max_decode_length=args.max_decode_length, num_beams=args.num_beams,
        alpha=args.alpha, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, mode=args.mode, num_shots=args.num_shots,
        few_shot_seed=args.few_shot_seed)
    return config, trainer, build_evaluator(config, trainer, name, settings, lengths, asked)


@errors.command_line("eval")
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    cli_flags.import_modules(args.module)
    cli_flags.start_processes(args)
    return run(args, overrides)


if __name__ == "__main__":
    sys.exit(main())
