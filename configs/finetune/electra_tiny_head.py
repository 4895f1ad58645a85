"""Fine-tune the small ELECTRA's discriminator (configs/pretrain/electra_tiny.py) with a
task head: the same recipe as configs/finetune/bert_tiny_head.py (400 steps of 32,
AdamW 5e-4, a fresh head on [CLS]), so the two pretraining objectives compare.

    python -m t5x_like.train --config=configs/finetune/electra_tiny_head.py \
        --workdir=runs/electra_spam --config.init_from=runs/pt_electra --config.task=embedded_spam

The generator is left behind: only the shared embeddings and the discriminator load.
"""

import importlib.util
import pathlib

_here = pathlib.Path(__file__).resolve().parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config():
    config = _load("_bert_tiny_head", _here / "bert_tiny_head.py").get_config()
    config.model = _load("_electra_tiny", _here.parent / "pretrain" / "electra_tiny.py"
                         ).model_config()
    config.task = "embedded_spam"
    return config
