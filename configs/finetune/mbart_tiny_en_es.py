"""Fine-tune the tiny mBART (configs/pretrain/mbart_tiny.py) for English -> Spanish on the
embedded Bible verses (``multilingual_bible_en_es``: the splits of ``embedded_bible_en_es``
in mBART's format, source ``x </s> en_XX``, target ``y </s> es_XX``; the decoder starts
with ``es_XX``, and so does decoding: ``decoder_start_id``).

    python benchmarks/multilingual.py retarget --run=runs/pt_mbart --language=es \
        --out=runs/pt_mbart_es
    python -m t5x_like.train --config=configs/finetune/mbart_tiny_en_es.py \
        --workdir=runs/mbart_en_es --config.init_from=runs/pt_mbart_es
    python -m t5x_like.eval --checkpoint=runs/mbart_en_es --task=multilingual_bible_en_es \
        --split=test --output_dir=runs/mbart_en_es/eval

``retarget`` writes the pretrained parameters as a params-only folder whose
``decoder_start_id`` is ``es_XX``'s id: ``train`` refuses an ``init_from`` whose model
keys differ from the config's, and this decoding-only key is 0 in pretraining.
Leave init_from empty for the random-initialisation baseline (the mBART paper's
comparison). ``es_en`` in configs/finetune/mbart_tiny_es_en.py.
"""

import importlib.util
import pathlib

from t5x_like.builtin_tasks import multilingual as multilingual_tasks

_spec = importlib.util.spec_from_file_location(
    "_mbart_tiny", pathlib.Path(__file__).resolve().parents[1] / "pretrain" / "mbart_tiny.py")
_mbart_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mbart_tiny)

SOURCE, TARGET = "en", "es"


def get_config(source=SOURCE, target=TARGET):
    config = _mbart_tiny.get_config()   # the pretrained model's keys, AdamW
    config.task = f"multilingual_bible_{source}_{target}"
    config.task_feature_lengths = {"inputs": 96, "targets": 96}
    config.model.decoder_start_id = multilingual_tasks.language_id(target)
    config.num_train_steps = 300
    config.batch_size = 32
    config.logging.every_steps = 50
    config.evals.held_out.every_steps = 150
    config.checkpoint.every_steps = 150
    config.evals.held_out.batches = 4
    config.optimizer.learning_rate = 5e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 30
    return config
