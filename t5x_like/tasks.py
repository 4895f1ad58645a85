"""Look at registered tasks and mixtures from the shell.

    python -m t5x_like.tasks list
    python -m t5x_like.tasks show embedded_en_mlm
    python -m t5x_like.tasks sample embedded_en_span_corruption --n=3 [--lengths=inputs=64,targets=16]

``sample`` prints decoded inputs and targets; ``--module=my.tasks`` imports
your own registrations first.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np

import t5x_like.data as td
from t5x_like import cli_flags, errors
from t5x_like.data import vocabularies
from t5x_like.data.dataset_providers import get_task_or_mixture


def _parse_lengths(text: str, default: int, features) -> dict[str, int]:
    lengths = {name: default for name in features}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        if not value.isdigit():
            raise errors.UserError(f"--lengths: {item!r} is not NAME=INT (e.g. inputs=64,targets=16).")
        lengths[key.strip()] = int(value)
    return lengths


def _describe_step(step) -> str:
    return getattr(step, "fn", step).__qualname__ if hasattr(step, "fn") else repr(step)


def cmd_list(td) -> None:
    for name in td.TaskRegistry.names():
        print(f"task     {name:44s} {td.TaskRegistry.get(name).description[:70]}")
    for name in td.MixtureRegistry.names():
        print(f"mixture  {name:44s} {td.MixtureRegistry.get(name).description[:70]}")


def cmd_show(td, name: str) -> None:
    provider = get_task_or_mixture(name)
    print(f"{name}: {provider.description}")
    if isinstance(provider, td.Mixture):
        for split in ("train",):
            try:
                for task, rate in sorted(provider.leaf_rates(split).items()):
                    print(f"  {rate:8.4f}  {task}")
            except (OSError, ValueError) as e:
                print(f"  rates need the tasks' data: {e}")
        return
    print(f"  source: {provider.source!r}"[:300])
    print(f"  splits: {', '.join(provider.splits)}")
    print("  output features: " + ", ".join(
        f"{k} ({vocabularies.kind(f.vocabulary)}"
        f"{', +EOS' if f.add_eos else ''})" for k, f in provider.output_features.items()))
    print("  preprocessors:")
    for step in provider.preprocessors:
        print(f"    {_describe_step(step)}")
    templates = td.TemplateRegistry.get(name)
    if templates:
        print(f"  instruction templates ({name}{td.dataset_providers.INSTRUCTION_SUFFIX} reads "
              "the task through them):")
        for t in templates:
            answers = f"  [answers: {' / '.join(t.answer_choices)}]" if t.answer_choices else ""
            print(f"    {t.name}: {t.inputs!r} -> {t.targets!r}{answers}")
    try:
        sizes = {split: provider.num_input_examples(split) for split in provider.splits}
        print("  examples: " + ", ".join(f"{s} {n:,}" for s, n in sizes.items()))
    except (OSError, ValueError) as e:
        print(f"  examples: unavailable ({e})")


def cmd_sample(td, name: str, n: int, lengths_text: str, length: int, split: str,
               seed: int) -> None:
    provider = get_task_or_mixture(name)
    features = provider.output_features
    lengths = _parse_lengths(lengths_text, length, features)
    ds = td.get_dataset(name, lengths, split=split, seed=seed)
    for index, example in enumerate(itertools.islice(iter(ds), n)):
        print(f"--- example {index} ({name}, {split}, lengths {lengths})")
        for key, value in example.items():
            value = np.asarray(value)
            if key in features and value.ndim == 1:
                text = features[key].vocabulary.decode(value)
                print(f"{key} ({value.size} tokens): {text}")
            elif value.ndim == 0:
                print(f"{key}: {value.item()}")
            else:
                print(f"{key}: {value.tolist()}")


@errors.command_line("tasks")
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.tasks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("list", "show", "sample"))
    parser.add_argument("name", nargs="?")
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--lengths", default="", help="NAME=INT,...; overrides --length")
    parser.add_argument("--length", type=int, default=128, help="length of every feature")
    parser.add_argument("--split", default="train")
    parser.add_argument("--seed", type=int, default=0)
    cli_flags.add_module_flag(parser)
    args = parser.parse_args(argv)
    cli_flags.import_modules(args.module)
    if args.command != "list" and not args.name:
        parser.error(f"{args.command} needs a task or mixture NAME (see `list`).")
    try:
        if args.command == "list":
            cmd_list(td)
        elif args.command == "show":
            cmd_show(td, args.name)
        else:
            cmd_sample(td, args.name, args.n, args.lengths, args.length, args.split, args.seed)
    except errors.UserError:
        raise
    except (KeyError, ValueError, FileNotFoundError) as e:  # a task's data or name
        raise errors.UserError(str(e.args[0] if e.args else e)) from None


if __name__ == "__main__":
    sys.exit(main())
