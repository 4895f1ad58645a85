"""ELECTRA-Base (Clark et al. 2020): BERT-base's discriminator (768 wide, 12 layers,
no embedding projection) trained against a generator a third of its width.

The discriminator is 109,483,009 parameters with its replaced-token head (the
paper's 110M); the generator adds 9,903,418 in its own 256-wide tower. Recipe of the paper's
Table 6: sequences of 512, batch 256, AdamW at 2e-4 with 10k warmup steps, 766k
steps, 15% masked, λ = 50.

    python -m t5x_like.summary --config=configs/electra_base.py
    python -m t5x_like.train --config=configs/electra_base.py --workdir=runs/electra_base
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("electra")
    config.model.update(dict(
        vocab_size=30522, d_model=768, num_heads=12, head_dim=64, d_ff=3072, num_layers=12,
        embedding_dim=768, generator_d_model=256, generator_num_heads=4, generator_head_dim=64,
        generator_d_ff=1024, generator_num_layers=12, discriminator_loss_weight=50.0,
        max_predictions_per_seq=79,
        max_length=512))
    config.task = "embedded_en_electra"
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 256
    config.num_train_steps = 766_000
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 2e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 10_000
    config.optimizer.weight_decay = 0.01
    return config
