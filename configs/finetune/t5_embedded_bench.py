"""Fine-tune the quickstart T5 text-to-text on the offline benchmark mixture.

Pretrain first (configs/quickstart.py), then start from its workdir:

    python -m t5x_like.train --config=configs/finetune/t5_embedded_bench.py --workdir=runs/ft_t5 \
        --config.init_from=runs/quickstart
    python -m t5x_like.eval --checkpoint=runs/ft_t5 --mixture=embedded_bench --output_dir=runs/ft_t5/eval

Leave init_from empty to train the same model from random initialisation (the
baseline that shows what pretraining adds). Evaluation on the mixture runs every
evals.benchmark.every_steps on evals.benchmark.max_examples examples per task.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_quickstart", pathlib.Path(__file__).resolve().parents[1] / "quickstart.py")
_quickstart = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_quickstart)


def get_config():
    config = _quickstart.get_config()   # the same model as the pretraining run
    config.task = "embedded_bench"
    config.task_feature_lengths = {"inputs": 128, "targets": 64}  # POS tags and verses run long
    config.num_train_steps = 600
    config.batch_size = 32
    config.logging.every_steps = 50
    config.evals.held_out.every_steps = 300
    config.checkpoint.every_steps = 300
    config.evals.held_out.batches = 4
    config.optimizer.name = "adafactor"
    config.optimizer.learning_rate = 1e-3   # T5's fine-tuning rate, constant
    config.optimizer.schedule = "constant"
    config.optimizer.warmup_steps = 0
    config.evals.benchmark = dict(kind="benchmark", mixture="embedded_bench", max_examples=128,
                                  every_steps=600)
    return config
