"""Language identification of UDHR paragraphs (``multilingual_udhr_langid``: the splits of
``embedded_udhr_langid``, 435 languages, on the multilingual vocabulary) with a
classification head on the tiny XLM-R (configs/pretrain/xlmr_tiny.py), pooled at [CLS].

    python -m t5x_like.train --config=configs/finetune/xlmr_tiny_langid.py \
        --workdir=runs/xlmr_langid --config.init_from=runs/pt_xlmr
    python -m t5x_like.eval --checkpoint=runs/xlmr_langid --task=multilingual_udhr_langid \
        --split=test --output_dir=runs/xlmr_langid/eval

Leave init_from empty for the random-initialisation baseline (docs/multilingual.md).
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_xlmr_tiny", pathlib.Path(__file__).resolve().parents[1] / "pretrain" / "xlmr_tiny.py")
_xlmr_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_xlmr_tiny)


def get_config():
    config = _xlmr_tiny.get_config()   # the pretrained body's model keys, AdamW
    config.task = "multilingual_udhr_langid"
    config.task_feature_lengths = {"inputs": 128}
    config.head.kind = "classification"
    config.head.pooling = "cls"
    config.head.dropout_rate = 0.1
    config.num_train_steps = 300
    config.batch_size = 32
    config.evals.held_out.every_steps = 150
    config.checkpoint.every_steps = 150
    config.optimizer.learning_rate = 1e-3
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 30
    config.optimizer.weight_decay = 0.01
    return config
