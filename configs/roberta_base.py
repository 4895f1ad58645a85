"""RoBERTa base (about 125M parameters with its MLM head): BERT's network, byte-level BPE
vocabulary, positions counted after the padding index, no next-sentence head.

    python -m t5x_like.summary --config=configs/roberta_base.py
    python -m t5x_like.train --config=configs/roberta_base.py --workdir=runs/roberta_base
    python -m t5x_like.convert import --hf_dir=path/to/roberta-base --out=converted/roberta_base
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("encoder")
    model = config.model
    model.vocab_size = 50265
    model.d_model = 768
    model.num_heads = 12
    model.head_dim = 64
    model.d_ff = 3072
    model.num_layers = 12
    model.max_length = 514
    model.type_vocab_size = 1
    model.pad_id = 1
    model.position_offset = 2
    model.next_sentence_head = False
    model.layer_norm_epsilon = 1e-5
    config.task = "embedded_en_mlm"
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 8192
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 6e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 24_000
    config.optimizer.weight_decay = 0.01
    config.optimizer.b2 = 0.98
    return config
