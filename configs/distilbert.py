"""DistilBERT (Sanh et al. 2019): BERT base with 6 of its 12 layers, no token types,
no pooler or next-sentence head, distilled from a BERT base teacher.

66,986,298 parameters (Hugging Face's distilbert-base-uncased: 66,985,530, without
our one token-type row, which export folds into the position embeddings). The
student starts from the teacher's layers 0, 2, 4, 7, 9, 11; the loss is 5 x soft
targets at T = 2, 2 x masked LM, 1 x hidden-state cosine (their recipe).

    python -m t5x_like.summary --config=configs/distilbert.py
    python -m t5x_like.train --config=configs/distilbert.py --workdir=runs/distilbert \
        --config.distill.teacher=runs/bert_base
    python -m t5x_like.convert import --hf_dir=path/to/distilbert-base-uncased --out=converted/distilbert
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
_bert_base = bases.config_file("bert_base")


def get_config():
    config = _bert_base.get_config()
    config.model.variant = "distilbert"
    config.model.num_layers = 6
    config.model.type_vocab_size = 1
    config.model.next_sentence_head = False
    config.distill.temperature = 2.0
    config.distill.soft_weight = 5.0
    config.distill.hard_weight = 2.0
    config.distill.cosine_weight = 1.0
    config.distill.student_init = "teacher_layers"
    config.batch_size = 4096 // 8   # their 4k-sequence batches, in 8 accumulation steps
    config.optimizer.microbatches = 8
    config.optimizer.learning_rate = 5e-4
    config.optimizer.warmup_steps = 500  # 5% of their steps
    return config
