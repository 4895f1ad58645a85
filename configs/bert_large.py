"""BERT large (about 340M parameters with its MLM and NSP heads): post-LayerNorm encoder.

    python -m t5x_like.summary --config=configs/bert_large.py
    python -m t5x_like.train --config=configs/bert_large.py --workdir=runs/bert_large
    python -m t5x_like.convert import --hf_dir=path/to/bert-large-uncased --out=converted/bert_large
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("encoder")
    model = config.model
    model.vocab_size = 30522
    model.d_model = 1024
    model.num_heads = 16
    model.head_dim = 64
    model.d_ff = 4096
    model.num_layers = 24
    model.max_length = 512
    config.task = "embedded_en_mlm"
    config.task_feature_lengths = {"inputs": 128}
    config.batch_size = 256
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 10_000
    config.optimizer.weight_decay = 0.01
    return config
