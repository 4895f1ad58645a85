"""``configs/open_decoders.py``: every published size is the checkpoint's shape. Its
parameter count (``summary``'s) is within 1% of what transformers counts for the same
architecture, built from the config ``convert export`` writes (on the meta device:
nothing is allocated)."""

import pytest
import torch
import transformers

from t5x_like import config_lib
from t5x_like.convert import __main__ as convert_cli
from t5x_like.engine import trainer as trainer_lib

NAMES = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b", "qwen2.5-0.5b",
         "qwen2.5-1.5b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b",
         "gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b",
         "gemma-3-27b"]


def hf_count(model_config) -> int:
    cfg = dict(convert_cli.flat_model(model_config), scan_layers=False)
    hf = convert_cli.exporter_for(cfg).hf_config_from_model_config(cfg)
    config = transformers.AutoConfig.for_model(**hf)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_a_preset_counts_what_transformers_counts(name):
    config = config_lib.load_config_file(f"configs/open_decoders.py:{name}")
    config_lib.validate(config)
    ours = trainer_lib.param_count(trainer_lib.parameter_shapes(config.model))
    theirs = hf_count(config.model)
    assert abs(ours - theirs) <= 0.01 * theirs, (ours, theirs)


def test_every_preset_is_tested():
    import importlib.util
    spec = importlib.util.spec_from_file_location("open_decoders", "configs/open_decoders.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert sorted(module.PRESETS) == sorted(NAMES)


def test_an_unknown_preset_is_refused_naming_the_presets():
    with pytest.raises(config_lib.ConfigError, match="qwen3-8b"):
        config_lib.load_config_file("configs/open_decoders.py:qwen9")
