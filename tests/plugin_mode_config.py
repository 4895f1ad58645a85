# plugin_mode_config.py: a tiny GPT-2-style decoder on the embedded corpus, trained from scratch
# as the base, then fine-tuned near it with the anchor mode of plugin_mode.py.
"""Causal LM on the embedded corpus; the mode's run adds ``--module=plugin_mode`` and its
settings on the command line."""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 32}
    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                             num_layers=2, positions=dict(max_length=32)))
    config.batch_size = 8
    config.num_train_steps = 4
    config.logging.every_steps = 1
    config.checkpoint.every_steps = 2
    config.evals.held_out.update(every_steps=4, batches=2)
    config.optimizer.update(name="adamw", learning_rate=3e-3, schedule="constant",
                            warmup_steps=0)
    return config
