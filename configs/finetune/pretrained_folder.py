"""Fine-tune a pretrained folder (``convert import`` of a Hugging Face checkpoint, or
``peft merge``) text-to-text on the offline benchmark mixture, in its own tokenizer.

The folder is the config's argument; the model keys come from its ``model_config.json``,
``init_from`` is the folder and every task is re-tokenized with the tokenizer it carries
(``vocabulary = "checkpoint"``; the run copies it into WORKDIR/tokenizer):

    python -m t5x_like.convert import --hf_dir=MY_HF_GPT2 --out=runs/gpt2_hf
    python -m t5x_like.train --config=configs/finetune/pretrained_folder.py:runs/gpt2_hf \\
        --workdir=runs/ft_gpt2_hf
    python -m t5x_like.eval --checkpoint=runs/ft_gpt2_hf --mixture=embedded_bench \\
        --vocabulary=checkpoint --output_dir=runs/ft_gpt2_hf/eval

Decoders read ``inputs`` then ``targets`` causally (GPT fine-tuning), the two lengths
sharing the model's positions; encoder-decoders read 256 input and 64 target tokens.
"""

from t5x_like import config_lib, structures


def get_config(folder: str):
    config = config_lib.default_config()
    config.model = config_lib.model_of_folder(folder)
    config.init_from = str(folder)
    config.vocabulary = "checkpoint"
    config.task = "embedded_bench"
    if structures.structure_class(config.model.family).generates_after_prompt:  # decoders
        width = min(config.model.positions.max_length, 512)
        config.task_feature_lengths = {"inputs": width * 3 // 4, "targets": width // 4}
        config.data.prefix_attention = "causal"
    else:
        config.task_feature_lengths = {"inputs": 256, "targets": 64}
    config.num_train_steps = 600
    config.batch_size = 32
    config.logging.every_steps = 50
    config.evals.held_out.every_steps = 300
    config.checkpoint.every_steps = 300
    config.evals.held_out.batches = 4
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 50
    config.evals.benchmark = dict(kind="benchmark", mixture="embedded_bench", max_examples=128,
                                  every_steps=600)
    return config
