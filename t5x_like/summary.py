"""Parameter table of a config's model, computed from shapes only (nothing allocated).

    python -m t5x_like.summary --config=configs/t5_1_1_base.py

Prints one row per module (parameters summed below it, to ``--depth`` levels),
then ``params: <integer>  trainable: <integer> (<percent>%)`` on the last line (the
trainable count is below the total under ``peft``).
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

from t5x_like import cli_flags, errors, resolving, structures
from t5x_like.engine import optim, trainer
from t5x_like.models import moe
from t5x_like.models import peft_modules as peft
from t5x_like.training import preflight


def module_rows(shapes: dict, depth: int) -> list[tuple[str, int]]:
    """``(module path, parameter count)``, paths truncated to ``depth`` components."""
    totals: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        keys = [str(k.key) for k in path]
        name = "/".join(keys[:depth]) if len(keys) > depth else "/".join(keys[:-1]) or keys[0]
        totals[name] = totals.get(name, 0) + int(np.prod(leaf.shape))
    return list(totals.items())


def format_table(rows: list[tuple[str, int]]) -> str:
    width = max(len(name) for name, _ in rows)
    lines = [f"{'module':<{width}}  {'params':>14}"]
    lines += [f"{name:<{width}}  {count:>14,}" for name, count in rows]
    return "\n".join(lines)


@errors.command_line("summary")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.summary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--depth", type=int, default=2,
                        help="Module path components per row (default 2: e.g. encoder/layers_0).")
    cli_flags.add_module_flag(parser)
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    unknown = [o for o in overrides if not o.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    cli_flags.import_modules(args.module)
    config = resolving.resolve_spec(resolving.load_config(args.config, [
        o[len("--config."):] for o in overrides if o.startswith("--config.")]))
    settings = peft.PeftSettings.from_config(config.peft)
    shapes = trainer.parameter_shapes(config.model, settings)
    if settings.any or config.peft.bitfit:
        preflight.check_peft_fits(config, shapes)
    rows = module_rows(shapes, args.depth)
    print(format_table(rows))
    total = sum(count for _, count in rows)
    mask = optim.trainable_mask(shapes, bitfit=config.peft.bitfit, added=settings.any)
    trainable = sum(int(np.prod(leaf.shape)) for leaf, trains in
                    zip(jax.tree.leaves(shapes), jax.tree.leaves(mask), strict=False) if trains)
    split = structures.structure_class(config.model.family).parameter_split(shapes)
    if split:
        print(split)
    num_experts = config.model.expert_count
    if num_experts:
        k = config.model.experts.num_experts_per_token
        active = total - moe.inactive_parameters(shapes, num_experts, k)
        print(f"active params per token: {active} ({100.0 * active / total:.1f}% of {total}: "
              f"{k} of {num_experts} experts)")
    print(f"params: {total}  trainable: {trainable} ({100.0 * trainable / max(total, 1):.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
