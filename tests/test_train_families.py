"""Every model family pretrains through the same loop on a built-in task, packed rows on
a (2, 4) mesh, and its loss falls."""

import json

import pytest
from conftest import tiny_config

from t5x_like import config_lib, errors, train

SMALL = {"vocab_size": 8192, "d_model": 32, "num_heads": 2, "head_dim": 16, "d_ff": 64}
FAMILIES = {
    # name: (family, task, lengths, model settings)
    "bert_span_mlm": ("encoder", "embedded_en_span_mlm", {"inputs": 32},
                      dict(num_layers=1, max_length=64, span_boundary_head=True,
                           next_sentence_head=False)),
    "gpt_prefix_lm": ("decoder", "embedded_en_prefix_lm", {"inputs": 16, "targets": 16},
                      dict(num_layers=1, max_length=64, position_embedding="rotary",
                           norm="rmsnorm", num_kv_heads=1, scan_layers=True,
                           remat_policy="full")),
    "electra_rtd": ("electra", "embedded_en_electra", {"inputs": 32},
                    dict(num_layers=1, max_length=64, embedding_dim=16, generator_d_model=16,
                         generator_num_heads=1, generator_head_dim=16, generator_d_ff=32,
                         generator_num_layers=1, max_predictions_per_seq=6)),
    "bart_denoising": ("bart", "embedded_en_bart", {"inputs": 32, "targets": 32},
                       dict(num_encoder_layers=1, num_decoder_layers=1, max_length=64,
                            pad_id=0, eos_id=1, decoder_start_id=0)),
}


def family_config(name, **overrides):
    family, task, lengths, settings = FAMILIES[name]
    config = tiny_config(**overrides)
    config.model = config_lib.model_defaults(family)
    config.model.update(dict(SMALL, **settings))
    config.task, config.task_feature_lengths, config.pack = task, lengths, True
    config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 20, 20, 20
    config.mesh.data, config.mesh.fsdp = 2, 4
    # BERT/GPT/BART initialise at std 0.02, where Adafactor's parameter-scaled steps are tiny.
    config.optimizer.name, config.optimizer.learning_rate = "adamw", 1e-2
    config_lib.validate(config)
    return config


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_trains_packed_on_a_sharded_mesh(tmp_path, name):
    result = train.run(family_config(name), str(tmp_path), quiet=True)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_losses = [r["loss"] for r in records if "loss" in r]
    assert train_losses[-1] < train_losses[0] - 1.0, train_losses
    assert result["eval"]["eval_loss"] < train_losses[0]


def test_a_model_that_masks_another_pad_id_is_refused(tmp_path):
    config = family_config("bart_denoising")
    config.model.pad_id = 1  # BART's own vocabulary pads with 1; the embedded one with 0
    with pytest.raises(errors.ConfigError, match="set --config.model.pad_id=0"):
        train.run(config, str(tmp_path), quiet=True)
