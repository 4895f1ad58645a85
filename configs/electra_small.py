"""ELECTRA-Small (Clark et al. 2020): a 12-layer, 256-wide discriminator on 128-wide
shared embeddings, trained against a generator a quarter of its width.

The discriminator is 13,549,057 parameters (Hugging Face's count for
google/electra-small-discriminator; the paper rounds it to 14M); the generator adds
647,162 of its own (14.2M in all). Recipe of the paper's Table 6: sequences of 128, batch 128,
AdamW at 5e-4 with 10k warmup steps and linear decay, 15% masked, λ = 50.

    python -m t5x_like.summary --config=configs/electra_small.py
    python -m t5x_like.train --config=configs/electra_small.py --workdir=runs/electra_small
    python -m t5x_like.convert import --hf_dir=path/to/electra-small-discriminator \\
        --generator_dir=path/to/electra-small-generator --out=converted/electra_small
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("electra")
    config.model.update(dict(
        vocab_size=30522, d_model=256, num_heads=4, head_dim=64, d_ff=1024, num_layers=12,
        embedding_dim=128, generator_d_model=64, generator_num_heads=1, generator_head_dim=64,
        generator_d_ff=256, generator_num_layers=12, discriminator_loss_weight=50.0,
        max_predictions_per_seq=19,
        max_length=512))
    config.task = "embedded_en_electra"
    config.task_feature_lengths = {"inputs": 128}
    config.batch_size = 128
    config.num_train_steps = 1_000_000
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 5e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 10_000
    config.optimizer.weight_decay = 0.01
    return config
