"""mBART-large-cc25 (about 611M parameters): a 12 + 12-layer, 1024-wide pre-LayerNorm
BART with a LayerNorm after each stack, embeddings scaled by sqrt(d_model) and a
250,027-row vocabulary (250,000 SentencePiece pieces, 25 language ids, ...);
denoising over 25 languages sampled with α = 0.7, language ids after ``</s>``
(Liu et al. 2020).

    python -m t5x_like.summary --config=configs/mbart_large_cc25.py
    python -m t5x_like.train --config=configs/mbart_large_cc25.py --workdir=runs/mbart_large
    python -m t5x_like.convert import --hf_dir=path/to/mbart-large-cc25 --out=converted/mbart_cc25

Pretraining here runs the embedded multilingual mixture (``multilingual_mbart``) on its 8k
vocabulary (``--config.model.vocab_size=8192``); the 250,027 rows are the published model's.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
bases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bases)
bart = bases.family("bart")


def get_config():
    # BART's ids of the embedded vocabulary (pad 0, eos 1); imported checkpoints carry mBART's (1, 2).
    config = bart.base(variant="mbart", vocab_size=250027, d_model=1024, num_heads=16, d_ff=4096,
                       num_encoder_layers=12, num_decoder_layers=12, pre_norm=True,
                       final_layer_norm=True, scale_embedding=True, decoder_start_from_targets=True)
    config.task = "multilingual_mbart"
    config.batch_size = 1024  # the paper: 128k tokens per batch
    config.optimizer.update(learning_rate=3e-4, b2=0.98)
    return config
