"""The benchmark recipe's BERT (4 layers, 128 wide) as a Longformer: a local window of 65
keys each side and the first token of each example global, masked LM on the embedded
corpus at 512 tokens (400 steps of 8 x 512 tokens). With ``--config.model.attention.window=0
--config.model.attention.global_tokens=False`` the same run with full attention, the comparison
in docs/attention.md.

    python -m t5x_like.train --config=configs/pretrain/longformer_tiny.py --workdir=runs/pt_longformer
    python -m t5x_like.train --config=configs/pretrain/longformer_tiny.py --workdir=runs/pt_full512 \\
        --config.model.attention.window=0 --config.model.attention.global_tokens=False
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_bert_tiny", pathlib.Path(__file__).with_name("bert_tiny.py"))
_bert_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bert_tiny)


def model_config():
    model = _bert_tiny.model_config()
    model.update(dict(positions=dict(max_length=512),
                      attention=dict(window=66, global_tokens=True, max_global_tokens=8)))
    return model


def get_config():
    config = _bert_tiny.get_config()
    config.model = model_config()
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 8
    config.num_train_steps = 400
    config.evals.held_out.every_steps = 200
    config.checkpoint.every_steps = 200
    config.optimizer.warmup_steps = 40
    return config
