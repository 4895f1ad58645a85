"""The benchmark recipe's GPT-2: a 4-layer, 128-wide decoder, causal LM on the
embedded corpus (1,000 steps of 32 x 160 tokens).

    python -m t5x_like.train --config=configs/pretrain/gpt2_tiny.py --workdir=runs/pt_gpt2

``model_config()`` is shared with the fine-tuning recipe, so the checkpoint loads there.
"""

from t5x_like import config_lib


def model_config():
    model = config_lib.model_defaults("decoder")
    model.update(dict(vocab_size=8192, d_model=128, num_heads=4, head_dim=32, d_ff=512,
                      num_layers=4, positions=dict(max_length=256)))
    return model


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 160}
    config.model = model_config()
    config.num_train_steps = 1000
    config.batch_size = 32
    config.logging.every_steps = 50
    config.evals.held_out.every_steps = 500
    config.checkpoint.every_steps = 500
    config.evals.held_out.batches = 8
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-3
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 100
    return config
