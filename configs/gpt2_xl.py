"""GPT-2 xl (about 1.56B parameters): learned positions, pre-LayerNorm, GELU MLP, tied output.

    python -m t5x_like.summary --config=configs/gpt2_xl.py
    python -m t5x_like.plan --config=configs/gpt2_xl.py --topology=v5e:4x4
    python -m t5x_like.train --config=configs/gpt2_xl.py --workdir=runs/gpt2_xl
    python -m t5x_like.convert import --hf_dir=path/to/gpt2-xl --out=converted/gpt2_xl
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    model = config.model
    model.vocab_size = 50257
    model.d_model = 1600
    model.num_heads = 25
    model.head_dim = 64
    model.d_ff = 6400
    model.num_layers = 48
    model.max_length = 1024
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 1024}
    config.batch_size = 512
    # 1.5B parameters at GPT-2's batch (512 x 1024 tokens): shard parameters and optimizer
    # state over all chips, compute in bfloat16, one scanned layer recomputed in the
    # backward pass, and 8 microbatches so the [batch, 1024, 50257] logits fit
    # (`plan` on v5e:4x4: 4.7 GiB of 16 per chip).
    config.mesh.data = 1
    config.mesh.fsdp = -1
    model.dtype = "bfloat16"
    model.scan_layers = True
    model.remat_policy = "full"
    config.optimizer.microbatches = 8
    return config
