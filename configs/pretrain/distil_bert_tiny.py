"""A DistilBERT of the benchmark recipe's BERT: configs/pretrain/bert_tiny.py with 2 of its
4 layers (the teacher's first and last), distilled from runs/pt_bert for 500 steps of
32 x 128 tokens with DistilBERT's loss (5 x soft targets at T = 2, 2 x masked LM,
1 x hidden-state cosine).

    python -m t5x_like.train --config=configs/pretrain/distil_bert_tiny.py --workdir=runs/pt_distil
    # the same student without a teacher (fresh init, masked LM alone):
    python -m t5x_like.train --config=configs/pretrain/distil_bert_tiny.py --workdir=runs/pt_small \
        --config.distill.teacher=
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bert_tiny", pathlib.Path(__file__).resolve().parent / "bert_tiny.py")
_bert_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bert_tiny)


def model_config():
    model = _bert_tiny.model_config()
    model.num_layers = 2
    return model


def get_config():
    config = _bert_tiny.get_config()
    config.model = model_config()
    config.num_train_steps = 500
    config.evals.held_out.every_steps = 250
    config.checkpoint.every_steps = 250
    config.distill.teacher = "runs/pt_bert"
    config.distill.student_init = "teacher_layers"
    return config
