"""Checkpoint conversion between Hugging Face ``transformers`` folders and t5x_like.

    python -m t5x_like.convert import --hf_dir=HF_FOLDER --out=CONVERTED
    python -m t5x_like.convert export --checkpoint=CONVERTED --out=HF_FOLDER

Weights are read only from safetensors files, which hold data and never code.
"""

from t5x_like.checkpoints.pretrained import load_pretrained, save_pretrained

__all__ = ["load_pretrained", "save_pretrained"]
