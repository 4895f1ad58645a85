"""Quickstart: a small T5 v1.1-style model, span corruption on the embedded corpus.

Sized to learn visibly in a few minutes on 2 CPU cores (3.3M parameters,
8k vocabulary), and runs unchanged on any number of devices:

    python -m t5x_like.train --config=configs/quickstart.py --workdir=/tmp/t5x_like_quickstart
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_en_span_corruption"
    config.task_feature_lengths = {"inputs": 128, "targets": 32}
    config.num_train_steps = 500
    config.batch_size = 32
    config.logging.every_steps = 20
    config.evals.held_out.every_steps = 100
    config.checkpoint.every_steps = 100
    config.evals.held_out.batches = 8

    model = config.model
    model.vocab_size = 8192
    model.d_model = 128
    model.num_heads = 4
    model.head_dim = 32
    model.d_ff = 512
    model.num_encoder_layers = 2
    model.num_decoder_layers = 2

    config.optimizer.name = "adafactor"
    config.optimizer.learning_rate = 1e-2
    config.optimizer.schedule = "rsqrt"
    config.optimizer.warmup_steps = 50
    return config
