# plugin_family_config.py: a run of the plug-in family (load it with --module=plugin_family).
"""Causal LM on the embedded corpus with the ``conv_lm`` family of plugin_family.py."""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 64}
    config.model = config_lib.model_defaults("conv_lm")
    config.model.update(dict(d_model=32, num_layers=2, kernel_size=4))
    config.batch_size = 16
    config.num_train_steps = 5
    config.logging.every_steps = 5
    config.checkpoint.every_steps = 5
    config.evals.held_out.update(every_steps=5, batches=2)
    config.optimizer.update(name="adamw", learning_rate=3e-3, schedule="constant",
                            warmup_steps=0)
    return config
