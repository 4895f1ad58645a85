"""The benchmark recipe's T5: the quickstart model, pretrained longer (1,500 steps of
span corruption on the embedded corpus, about 12 minutes on 2 CPU cores).

    python -m t5x_like.train --config=configs/pretrain/t5_tiny.py --workdir=runs/pt_t5
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_quickstart", pathlib.Path(__file__).resolve().parents[1] / "quickstart.py")
_quickstart = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_quickstart)


def get_config():
    config = _quickstart.get_config()
    config.num_train_steps = 1500
    config.checkpoint.every_steps = 500
    config.evals.held_out.every_steps = 500
    config.optimizer.warmup_steps = 100
    return config
