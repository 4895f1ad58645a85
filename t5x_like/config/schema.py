"""The config surface: ``default_config()`` (every key of a run at its default, in the
sectioned layout, as the ``ConfigDict`` config files start from), ``model_defaults``
(one family's model section) and the spec a config resolves to (``spec_of``).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping

import ml_collections

from t5x_like.config import legacy
from t5x_like.config.model_parts import ModelSpec
from t5x_like.config.model_specs import model_spec_class
from t5x_like.config.run import RunSpec


def default_config() -> ml_collections.ConfigDict:
    """Every known key with its default (a small T5 v1.1 on the embedded corpus)."""
    c = ml_collections.ConfigDict(RunSpec.defaults())
    c.model.vocab_size = 8192  # the embedded SentencePiece's 8,000 pieces and sentinels
    return c


def model_defaults(family: str) -> ml_collections.ConfigDict:
    """The ``model`` section of ``family`` with every key at its default. Decoder configs
    start with ``config.model = config_lib.model_defaults("decoder")``."""
    return ml_collections.ConfigDict(model_spec_class(family).defaults())


def t5_pretraining_config() -> ml_collections.ConfigDict:
    """T5's pretraining recipe: C4-style span corruption at 512/114, batch 128, Adafactor
    at 1e-2 with 10k warmup steps then 1/sqrt(step), 2^19 steps. Size configs in
    ``configs/`` start here and set the model dimensions."""
    c = default_config()
    c.task_feature_lengths = {"inputs": 512, "targets": 114}
    c.batch_size = 128
    c.num_train_steps = 2**19
    c.logging.every_steps = 100
    c.evals.held_out.every_steps = 5000
    c.checkpoint.every_steps = 5000
    c.model.vocab_size = 32128  # T5's SentencePiece (32000) + 100 sentinels, padded to 128
    c.optimizer.name = "adafactor"
    c.optimizer.learning_rate = 1e-2
    c.optimizer.schedule = "rsqrt"
    c.optimizer.warmup_steps = 10_000
    return c


def _family_defaults(family: str) -> dict | None:
    try:
        return model_spec_class(family).defaults()
    except ValueError:  # an unknown family: the spec names the known ones
        return None


def migrated(config) -> tuple[dict, list]:
    """``(config as a dict in the sectioned layout, [(old, new) spellings moved])``."""
    return legacy.migrate(config, _family_defaults)


#: what a checkpoint's config item holds beside the spec: the run fingerprint, a partial
#: PEFT save's base, the rows each device held at a time and the optimizer microbatches
#: the config asked for (the spec's may have grown to keep those rows)
ROWS_PER_DEVICE = "rows_per_device"
MICROBATCHES_ASKED = "microbatches_asked"
SAVED_BESIDE = ("fingerprint", "peft_base", ROWS_PER_DEVICE, MICROBATCHES_ASKED)


def spec_of(config) -> RunSpec:
    """The checked, frozen spec of a config (a ``ConfigDict`` or mapping in the old or new
    layout; a ``RunSpec`` is returned as it is). Raises ``ConfigError`` naming the key."""
    if isinstance(config, RunSpec):
        return config
    tree, _ = migrated(config)
    for key in SAVED_BESIDE:
        tree.pop(key, None)
    return RunSpec.from_mapping(tree)


def as_config_dict(config) -> ml_collections.ConfigDict:
    """A ``ConfigDict`` of a spec or mapping (for code that edits a copy)."""
    if isinstance(config, ml_collections.ConfigDict):
        return config
    tree = config.to_dict() if callable(getattr(config, "to_dict", None)) else dict(config)
    return ml_collections.ConfigDict(_tuples_as_tuples(tree))


def _tuples_as_tuples(tree: Mapping) -> dict:
    return {k: _tuples_as_tuples(v) if isinstance(v, Mapping) else
            (tuple(v) if isinstance(v, list) else v) for k, v in tree.items()}


def model_spec_of(model):
    """The checked model spec of a ``model`` section (a ``ModelSpec``, or a mapping in the
    old flat or the sectioned layout, as ``model_config.json`` files hold)."""
    if isinstance(model, ModelSpec):
        return model
    tree = model.to_dict() if callable(getattr(model, "to_dict", None)) else dict(model)
    family = tree.get("family", "encoder_decoder")
    spec_class = model_spec_class(family)
    tree, _ = legacy.migrate_model(tree, spec_class.defaults())
    return spec_class.from_mapping(tree)


def model_of_folder(folder) -> ml_collections.ConfigDict:
    """The ``model`` section a pretrained folder's ``model_config.json`` describes (either
    layout), for a config file that fine-tunes it."""
    text = (pathlib.Path(folder) / "model_config.json").read_text()
    return as_config_dict(model_spec_of(json.loads(text)).to_dict())
