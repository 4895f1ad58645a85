"""Fine-tune a small GPT-2-style decoder text-to-text on the offline benchmark mixture.

The decoder reads ``inputs`` then ``targets`` with the loss on the targets only and a
causal prefix (as GPT fine-tuning and lm-evaluation-harness condition on a prompt).
Start from a decoder with the same model keys pretrained on ``embedded_en_lm``
(``--config.init_from=WORKDIR``), or leave init_from empty for the random-init baseline:

    python -m t5x_like.train --config=configs/finetune/gpt2_tiny_embedded_bench.py --workdir=runs/ft_gpt2
    python -m t5x_like.eval --checkpoint=runs/ft_gpt2 --mixture=embedded_bench --output_dir=runs/ft_gpt2/eval
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_bench"
    config.task_feature_lengths = {"inputs": 128, "targets": 32}
    config.prefix_attention = "causal"
    config.num_train_steps = 1000
    config.batch_size = 32
    config.log_every_steps = 50
    config.eval_every_steps = 250
    config.checkpoint_every_steps = 250
    config.eval_batches = 4

    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(vocab_size=8192, d_model=128, num_heads=4, head_dim=32, d_ff=512,
                             num_layers=4, max_length=256))
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 5e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 50
    config.eval.mixture = "embedded_bench"
    config.eval.max_examples = 128
    config.eval.every_steps = 500
    return config
