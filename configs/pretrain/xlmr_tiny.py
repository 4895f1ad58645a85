"""A tiny XLM-R: RoBERTa's encoder (4 layers, 128 wide, no next-sentence head, one token
type) on the multilingual 8k vocabulary, masked LM (15%, 80/10/10) over English, Spanish,
Japanese and UDHR sampled q_i ∝ p_i^0.3 (400 steps of 32 x 128).

    python -m t5x_like.train --config=configs/pretrain/xlmr_tiny.py --workdir=runs/pt_xlmr

``model_config()`` is shared with the language-id recipe (configs/finetune/xlmr_tiny_langid.py).
"""

from t5x_like import config_lib


def model_config():
    model = config_lib.model_defaults("encoder")
    model.update(dict(vocab_size=8192, d_model=128, num_heads=4, head_dim=32, d_ff=512,
                      num_layers=4, positions=dict(max_length=256), type_vocab_size=1,
                      next_sentence_head=False, layer_norm_epsilon=1e-5))
    return model


def get_config():
    config = config_lib.default_config()
    config.task = "multilingual_mlm"
    config.task_feature_lengths = {"inputs": 128}
    config.model = model_config()
    config.num_train_steps = 400
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
