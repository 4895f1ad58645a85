"""A tiny mBART: 3 + 3 pre-LayerNorm layers, 128 wide, on the multilingual 8k vocabulary,
denoising (30% infilling, sentence permutation) with language ids (inputs
``noised </s> <lang>``, targets ``text </s> <lang>``, decoder starting with ``<lang>``)
over English, Spanish, Japanese and UDHR, sampled q_i ∝ p_i^0.7 (a cosine schedule over
800 steps of 32 x 128).

    python -m t5x_like.train --config=configs/pretrain/mbart_tiny.py --workdir=runs/pt_mbart

The run measured in docs/multilingual.md was stopped with SIGTERM after step 400 (it
saves a checkpoint and exits), for time on 2 shared CPU cores.

``model_config()`` is shared with the translation recipes (configs/finetune/mbart_tiny_*.py).
"""

from t5x_like import config_lib


def model_config():
    model = config_lib.model_defaults("bart")
    model.update(dict(vocab_size=8192, d_model=128, num_heads=4, head_dim=32, d_ff=512,
                      num_encoder_layers=3, num_decoder_layers=3, positions=dict(max_length=256),
                      pre_norm=True, final_layer_norm=True, scale_embedding=True,
                      decoder_start_from_targets=True, pad_id=0, eos_id=1, decoder_start_id=0))
    return model


def get_config():
    config = config_lib.default_config()
    config.task = "multilingual_mbart"
    config.task_feature_lengths = {"inputs": 128, "targets": 128}
    config.model = model_config()
    config.num_train_steps = 800
    config.batch_size = 32
    config.logging.every_steps = 50
    config.evals.held_out.every_steps = 400
    config.checkpoint.every_steps = 400
    config.evals.held_out.batches = 4
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-3
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 80
    config.optimizer.weight_decay = 0.01
    return config
