"""Fine-tune the small GPT-2 (configs/pretrain/gpt2_tiny.py) text-to-text on the offline
benchmark mixture.

The decoder reads ``inputs`` then ``targets`` with the loss on the targets only and a
causal prefix (as GPT fine-tuning and lm-evaluation-harness condition on a prompt).
Start from its pretraining run (``--config.init_from=runs/pt_gpt2``), or leave
init_from empty for the random-init baseline:

    python -m t5x_like.train --config=configs/finetune/gpt2_tiny_embedded_bench.py --workdir=runs/ft_gpt2 \
        --config.init_from=runs/pt_gpt2
    python -m t5x_like.eval --checkpoint=runs/ft_gpt2 --mixture=embedded_bench --output_dir=runs/ft_gpt2/eval
"""

import importlib.util
import pathlib

from t5x_like import config_lib

_spec = importlib.util.spec_from_file_location(
    "_gpt2_tiny", pathlib.Path(__file__).resolve().parents[1] / "pretrain" / "gpt2_tiny.py")
_gpt2_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gpt2_tiny)


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_bench"
    config.task_feature_lengths = {"inputs": 128, "targets": 64}  # POS tags and verses run long
    config.data.prefix_attention = "causal"
    config.num_train_steps = 600
    config.batch_size = 32
    config.logging.every_steps = 50
    config.evals.held_out.every_steps = 300
    config.checkpoint.every_steps = 300
    config.evals.held_out.batches = 4

    config.model = _gpt2_tiny.model_config()
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 5e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 50
    config.evals.benchmark = dict(kind="benchmark", mixture="embedded_bench", max_examples=128,
                                  every_steps=600)
    return config
