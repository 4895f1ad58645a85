"""Instruction-tune the small GPT-2 (configs/pretrain/gpt2_tiny.py) on the training
clusters of the embedded benchmark (``embedded_instruct_train``: spam, translation,
language identification, POS tagging, each through its templates) and evaluate zero-shot
on the held-out clusters (``embedded_instruct_held_out``: paraphrase and cloze), as T0
did (docs/instruction_tuning.md):

    python -m t5x_like.train --config=configs/finetune/gpt2_tiny_instruct.py --workdir=runs/it_gpt2 \
        --config.init_from=runs/pt_gpt2
    python -m t5x_like.eval --checkpoint=runs/it_gpt2 --mixture=embedded_instruct_held_out \
        --output_dir=runs/it_gpt2/eval

The decoder reads ``inputs`` then ``targets`` with the loss on the targets only and a
causal prefix, as the benchmark fine-tuning recipe does.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bench", pathlib.Path(__file__).resolve().parent / "gpt2_tiny_embedded_bench.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)


def get_config():
    config = _bench.get_config()  # the same model, lengths, optimizer and batch
    config.task = "embedded_instruct_train"
    config.evals.benchmark.mixture = "embedded_instruct_held_out"
    return config
