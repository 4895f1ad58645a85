"""The base of a decoder IsoFLOP sweep on the embedded corpus, byte-level (a 384-id
vocabulary, so the small models a CPU can sweep are not mostly embedding): the task,
lengths, batch and optimizer every point shares; ``scaling sweep`` sets each point's
model shape, steps and schedule (docs/scaling.md).

    python -m t5x_like.scaling sweep --config=configs/scaling/decoder_sweep.py \\
        --output_dir=runs/sweep --budgets=1e12,3e12,1e13,3e13 --sizes=5
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_bytes_en_lm"
    config.task_feature_lengths = {"targets": 128}
    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(vocab_size=384, positions=dict(max_length=128)))
    config.batch_size = 16
    config.evals.held_out.batches = 8
    config.logging.every_steps = 50
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 50
    config.optimizer.weight_decay = 0.01
    return config
