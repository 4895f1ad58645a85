"""The model families' shared recipes, for the size configs in configs/.

As MaxText's ``configs/models/*.yml`` list only what differs from ``base.yml``, a size config
(configs/gpt2_medium.py, configs/t5_1_1_xl.py, ...) calls its family's ``base`` here with its
dimensions and then says only what else differs. Config files are run by path
(``t5x_like.config_lib.load_config_file``), so configs/ is no package on ``sys.path``: a size
config loads this package from its own folder, whatever the current directory (on one line
in the size configs)::

    _spec = importlib.util.spec_from_file_location(
        "_bases", pathlib.Path(__file__).resolve().parent / "_bases/__init__.py")
    bases = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(bases)

and then ``bases.family("gpt2")`` is configs/_bases/gpt2.py, ``bases.config_file("roberta_base")``
is configs/roberta_base.py, each run afresh from this file's folder.
"""

import importlib.util
import pathlib
import types

import ml_collections

BASES = pathlib.Path(__file__).resolve().parent
CONFIGS = BASES.parent


def _run(name: str, path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def family(name: str) -> types.ModuleType:
    """configs/_bases/NAME.py: family NAME's recipe, its ``base(**model)``."""
    return _run(f"_t5x_like_config_base_{name}", BASES / f"{name}.py")


def config_file(name: str) -> types.ModuleType:
    """configs/NAME.py (``roberta_base``): for a config that is another one with changes."""
    return _run(f"_t5x_like_config_{name}", CONFIGS / f"{name}.py")


def shard_fully(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Too large to replicate: parameters and optimizer state sharded over all chips (FSDP),
    activations in bfloat16 (parameters stay float32): half the HBM traffic of float32
    activations, and the MXU's native input type."""
    config.model.numerics.dtype = "bfloat16"
    config.mesh.data = 1
    config.mesh.fsdp = -1
    return config
