"""Instruction-tune the benchmark recipe's T5 (configs/pretrain/t5_tiny.py) on the
training clusters of the embedded benchmark (``embedded_instruct_train``) and evaluate
zero-shot on the held-out clusters (``embedded_instruct_held_out``: paraphrase and
cloze), as T0 did with T5 (docs/instruction_tuning.md):

    python -m t5x_like.train --config=configs/finetune/t5_instruct.py --workdir=runs/it_t5 \\
        --config.init_from=runs/pt_t5
    python -m t5x_like.eval --checkpoint=runs/it_t5 --mixture=embedded_instruct_held_out \\
        --output_dir=runs/it_t5/eval

The model, lengths, batch and optimizer are the benchmark fine-tuning recipe's.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bench", pathlib.Path(__file__).resolve().parent / "t5_embedded_bench.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)


def get_config():
    config = _bench.get_config()
    config.task = "embedded_instruct_train"
    config.evals.benchmark.mixture = "embedded_instruct_held_out"
    return config
