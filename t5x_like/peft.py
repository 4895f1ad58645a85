"""``peft merge``: fold a parameter-efficient run's LoRA into its base.

A PEFT run's checkpoints hold only what trains and name their base
(``param_sources/peft_partial.py`` says how); merging joins them again:

    python -m t5x_like.peft merge --peft=WORKDIR_OR_STEP --out=FOLDER [--base=PATH]

writes a params-only pretrained folder (``model_config.json`` + ``params/``) whose
kernels are ``W + (alpha / rank) A B``: the model without LoRA, equal in its logits,
which ``convert export`` takes to Hugging Face like any model.
"""

from __future__ import annotations

import argparse
import sys

from flax import traverse_util

from t5x_like import errors, resolving
from t5x_like.checkpoints import param_sources, pretrained
from t5x_like.errors import UserError
from t5x_like.models import peft_modules
from t5x_like.models.peft_modules import plain_dicts
from t5x_like.system import storage

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


    source = param_sources.resolve(peft_path, "--peft")
    if source.kind != "run":
        raise UserError(f"--peft={peft_path} is a pretrained folder, not a PEFT run; pass the "
                        "workdir (or checkpoints/<step>) of a run trained with config.peft.")
    steps = source.steps()
    if not steps:
        raise UserError(f"--peft={peft_path} holds no complete checkpoint yet.")
    step = steps[-1]
    saved = source.saved_config(step)
    config = param_sources.config_from_saved(saved)
    settings = peft_modules.PeftSettings.from_config(config.peft)
    check_foldable(settings, peft_path)
    # A run without init_from saved its whole model; else its base is joined back.
    params = param_sources.load_params(source, step, config, base_path=base_path,
                                     where=f"--peft={peft_path}")
    merged = peft_modules.merge_lora(params, settings)
    count = sum(1 for key in traverse_util.flatten_dict(plain_dicts(params))
                if key[-1] == "lora_a")
    pretrained.save_pretrained(out, config.model.to_dict(), merged,
                               vocabulary=resolving.checkpoint_vocabulary(source, saved),
                               metadata={"merged_from": str(source.path), "step": step},
                               run=config.to_dict())
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
        raise UserError(f"--out={args.out} exists and is not empty; choose a new folder so "
                          "nothing is overwritten.")
    result = merge(args.peft, args.out, args.base)
    print(f"Merged {result['merged_kernels']} LoRA kernels of step {result['step']} into "
          f"{result['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
