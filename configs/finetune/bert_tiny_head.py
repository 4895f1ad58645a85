"""Fine-tune the small BERT (configs/pretrain/bert_tiny.py) with a task head, BERT-style:
the pretrained body loads, the head starts fresh. One head per task; pick it with
``head.kind``:

    python -m t5x_like.train --config=configs/finetune/bert_tiny_head.py --workdir=runs/bert_spam \
        --config.init_from=runs/pt_bert --config.task=embedded_spam
    python -m t5x_like.train --config=configs/finetune/bert_tiny_head.py --workdir=runs/bert_pos \
        --config.init_from=runs/pt_bert --config.task=embedded_ud_pos \
        --config.head.kind=token_classification
    python -m t5x_like.eval --checkpoint=runs/bert_spam --task=embedded_spam --output_dir=runs/bert_spam/eval

Label names come from the task (its label_options, or the train split's targets or
tags) and are saved with the run. Leave init_from empty for the random-init baseline.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bert_tiny", pathlib.Path(__file__).resolve().parents[1] / "pretrain" / "bert_tiny.py")
_bert_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bert_tiny)


def get_config():
    config = _bert_tiny.get_config()   # the pretrained body's model keys, AdamW
    config.task = "embedded_spam"
    config.task_feature_lengths = {"inputs": 128}
    config.head.kind = "classification"
    config.head.pooling = "cls"
    config.head.dropout_rate = 0.1
    config.num_train_steps = 400
    config.evals.held_out.every_steps = 200
    config.checkpoint.every_steps = 200
    config.optimizer.learning_rate = 5e-4
    config.optimizer.schedule = "linear"       # BERT: warmup, then linear decay
    config.optimizer.warmup_steps = 40
    config.optimizer.weight_decay = 0.01
    return config
