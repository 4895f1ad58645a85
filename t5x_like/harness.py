"""Run lm-evaluation-harness tasks on a checkpoint of ours (no export to Hugging Face).

    python -m t5x_like.harness --checkpoint=runs/gpt/checkpoints/500 --tasks=lambada_openai,hellaswag
    python -m t5x_like.harness --checkpoint=runs/gpt --tasks=my_task --include_path=my_tasks/

``--tasks`` takes the harness's task, group and tag names, from its catalogue and from
the YAML files under ``--include_path``; the checkpoint (a run's workdir, whose newest
step is read, a step folder, or a ``convert import`` folder) is scored by the
``t5x_like`` lm-eval model (``t5x_like/evaluation/harness_model.py``) with its own
tokenizer, on the mesh its config names. Prints lm-eval's table; ``--output_path``
writes the results (and with ``--log_samples`` every request's answer) as JSON.
Tasks load their datasets before the model is read: a dataset that is not reachable
offline is named before any compilation.
"""

from __future__ import annotations

import argparse
import json
import sys

from t5x_like import cli_flags, errors
from t5x_like.errors import UserError
from t5x_like.evaluation import harness_tasks
from t5x_like.system import storage

# Imports inside functions: keep JAX out of the command's start-up: a mistake in the config or
# the flags is reported before JAX loads.


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m t5x_like.harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_flags.add_module_flag(parser)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tasks", required=True,
                        help="Comma-separated lm-eval task, group or tag names.")
    parser.add_argument("--include_path", default="",
                        help="A folder of task YAML files added to the harness's catalogue.")
    parser.add_argument("--num_fewshot", type=int, default=None,
                        help="Demonstrations per prompt (default: each task's own).")
    parser.add_argument("--limit", type=float, default=0,
                        help="Examples per task (a fraction if < 1); 0 = all.")
    parser.add_argument("--step", type=int, default=None,
                        help="The step of a run's workdir to read (default: the newest).")
    parser.add_argument("--batch_size", type=int, default=0, help="0: the config's batch_size.")
    parser.add_argument("--max_length", type=int, default=0,
                        help="The window requests are cut to (default: model.max_length).")
    parser.add_argument("--max_gen_toks", type=int, default=256,
                        help="New tokens for generation tasks that do not set their own.")
    parser.add_argument("--vocabulary", default="checkpoint",
                        help="The tokenizer: the checkpoint's own, or a path to one.")
    parser.add_argument("--fewshot_seed", type=int, default=1234)
    parser.add_argument("--seed", type=int, default=0, help="Sampling (do_sample tasks).")
    parser.add_argument("--bootstrap_iters", type=int, default=100000,
                        help="Bootstrap resamples for standard errors (0: none).")
    parser.add_argument("--output_path", default="", help="A .json file for the results.")
    parser.add_argument("--log_samples", action="store_true",
                        help="With --output_path: also write every request and answer.")
    cli_flags.add_multi_process_flags(parser)
    return parser.parse_args(argv)


def run(args) -> int:
    harness_tasks.check_installed()
    if args.log_samples and not args.output_path:
        raise UserError("--log_samples writes next to the results: add --output_path=FILE.json.")
    names = harness_tasks.task_names(args.tasks)
    import jax

    from t5x_like.evaluation import harness_model

    tasks = harness_tasks.load(names, args.include_path)
    lm = harness_model.T5xLikeLM(checkpoint=args.checkpoint, step=args.step,
                                 vocabulary=args.vocabulary, max_length=args.max_length,
                                 max_gen_toks=args.max_gen_toks, batch_size=args.batch_size,
                                 seed=args.seed)
    out = harness_tasks.evaluate(lm, tasks, include_path=args.include_path,
                                 num_fewshot=args.num_fewshot, limit=args.limit,
                                 log_samples=args.log_samples,
                                 bootstrap_iters=args.bootstrap_iters,
                                 fewshot_seed=args.fewshot_seed)
    if jax.process_index() != 0:
        return 0
    print(f"{harness_model.NAME}: {lm.loaded.description}", flush=True)
    print(harness_tasks.format_table(out), flush=True)
    if args.output_path:
        write_results(storage.path(args.output_path), out, args.log_samples)
    return 0


def write_results(path, out: dict, with_samples: bool) -> None:
    """``results``, ``configs`` and ``versions`` as JSON; samples as JSONL per task."""
    keep = {k: out[k] for k in ("results", "groups", "configs", "versions", "n-shot",
                                "higher_is_better", "n-samples") if k in out}
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(path, json.dumps(keep, indent=2, default=str, ensure_ascii=False))
    print(f"results: {path}", flush=True)
    if with_samples:
        for task, samples in out.get("samples", {}).items():
            target = path.with_name(f"{path.stem}_samples_{task}.jsonl")
            storage.write_atomic(target, "".join(
                json.dumps(s, default=str, ensure_ascii=False) + "\n" for s in samples))
            print(f"samples: {target}", flush=True)


@errors.command_line("harness")
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cli_flags.import_modules(args.module)
    cli_flags.start_processes(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
