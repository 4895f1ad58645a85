"""Fine-tune the tiny mBART for Spanish -> English (``multilingual_bible_es_en``; source
``y </s> es_XX``, target ``x </s> en_XX``, decoding starts with ``en_XX``).

    python benchmarks/multilingual.py retarget --run=runs/pt_mbart --language=en \
        --out=runs/pt_mbart_en
    python -m t5x_like.train --config=configs/finetune/mbart_tiny_es_en.py \
        --workdir=runs/mbart_es_en --config.init_from=runs/pt_mbart_en
    python -m t5x_like.eval --checkpoint=runs/mbart_es_en --task=multilingual_bible_es_en \
        --split=test --output_dir=runs/mbart_es_en/eval

Leave init_from empty for the random-initialisation baseline.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_mbart_en_es", pathlib.Path(__file__).resolve().parent / "mbart_tiny_en_es.py")
_mbart_en_es = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mbart_en_es)


def get_config():
    return _mbart_en_es.get_config(source="es", target="en")
