"""DPO on the embedded cloze pairs (``embedded_austen_cloze_preference``: an Austen
context, its next word preferred over a distractor), from the small GPT-2's pretraining
run, which is also the frozen reference:

    python -m t5x_like.train --config=configs/pretrain/gpt2_tiny.py --workdir=runs/pt_gpt2
    python -m t5x_like.train --config=configs/preference/gpt2_tiny_dpo_cloze.py \\
        --workdir=runs/dpo_gpt2 --config.init_from=runs/pt_gpt2

Other objectives on the same rows: ``--config.preference.objective=simpo`` (with
``--config.preference.beta=2.0``), ``orpo``, or ``reward_model``. LoRA:
``--config.peft.lora.rank=8`` (the reference stays the full init_from).
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
    config.model = _gpt2_tiny.model_config()
    config.task = "embedded_austen_cloze_preference"
    # the start id and the context's last 63 tokens; a response is one word
    config.task_feature_lengths = {"inputs": 64, "targets": 8}
    config.preference.objective = "dpo"
    config.preference.beta = 0.1
    config.num_train_steps = 200
    config.batch_size = 32  # pairs
    config.logging.every_steps = 20
    config.checkpoint.every_steps = 100
    config.evals.held_out.every_steps = 100
    config.evals.held_out.batches = 8
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-4
    config.optimizer.schedule = "constant"
    config.optimizer.warmup_steps = 10
    return config
