"""A tiny ELMo (``model.family="bilm"``): char CNN with 8-dim char embeddings and
filters of widths 1..5 (16, 16, 32, 32, 64: 160), one highway layer, projection to
64; 2 biLSTM layers of 256 cells projected to 64. Forward and backward LM over the
embedded corpus through the causal-LM task ``embedded_en_lm`` (its ``targets`` rows
are the token sequence; unpacked).

    python -m t5x_like.train --config=configs/pretrain/elmo_tiny.py --workdir=runs/pt_elmo
"""

from t5x_like import config_lib


def model_config():
    model = config_lib.model_defaults("bilm")
    model.update(dict(vocab_size=8192, char_vocabulary="embedded", max_chars=16,
                      char_embed_dim=8, filter_widths=(1, 2, 3, 4, 5),
                      filter_counts=(16, 16, 32, 32, 64), num_highway=1, projection_dim=64,
                      lstm_dim=256, num_layers=2, dropout_rate=0.1))
    return model


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 64}
    config.model = model_config()
    config.data.pack = False
    config.num_train_steps = 300
    config.batch_size = 32
    config.logging.every_steps = 50
    config.evals.held_out.every_steps = 300
    config.checkpoint.every_steps = 300
    config.evals.held_out.batches = 4
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 3e-3
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 30
    return config
