"""The benchmark recipe's ELECTRA: a discriminator the size of configs/pretrain/bert_tiny.py
(4 layers, 128 wide) and a generator a quarter of its width, on ELECTRA's masking of
the embedded corpus (15% selected, 85% of those [MASK]), batches of 32 x 128 tokens.

It runs for as many model FLOPs as bert_tiny's 1,000 steps (``flops.py`` counts both
towers: 1.046x a BERT step, so 956 steps), the comparison of ELECTRA's paper:

    python -m t5x_like.train --config=configs/pretrain/electra_tiny.py --workdir=runs/pt_electra

``model_config()`` is shared with the fine-tuning recipe, so the checkpoint loads there.
"""

from t5x_like import config_lib


def model_config():
    model = config_lib.model_defaults("electra")
    model.update(dict(vocab_size=8192, d_model=128, num_heads=4, head_dim=32, d_ff=512,
                      num_layers=4, embedding_dim=0, max_predictions_per_seq=19,
                      generator=dict(d_model=32, num_heads=1, head_dim=32, d_ff=128, num_layers=4),
                      positions=dict(max_length=256)))
    return model


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_en_electra"
    config.task_feature_lengths = {"inputs": 128}
    config.model = model_config()
    config.num_train_steps = 956
    config.batch_size = 32
    config.logging.every_steps = 40
    config.evals.held_out.every_steps = 478
    config.checkpoint.every_steps = 478
    config.evals.held_out.batches = 8
    config.optimizer.name = "adamw"
    # ELECTRA-Small's 5e-4. At bert_tiny's 1e-3 the discriminator collapses: its hidden
    # states become the same at every position and it predicts the prior (86.6%
    # "original") for the whole run; at 5e-4 and 3e-4 a pilot of 200 steps escaped it.
    config.optimizer.learning_rate = 5e-4
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 100
    return config
