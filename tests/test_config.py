import pathlib
import subprocess
import sys
import time

import pytest

from t5x_like import config_lib, errors

REPO = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "configs" / "quickstart.py")


def test_quickstart_config_is_valid():
    config = config_lib.load_config_file(QUICKSTART)
    config_lib.validate(config)
    for key in ("num_train_steps", "seed", "batch_size"):
        assert key in config
    assert config.logging.every_steps and config.checkpoint.every_steps
    assert config.evals.held_out.every_steps


def test_override_sets_typed_values():
    config = config_lib.default_config()
    config_lib.apply_overrides(config, ["num_train_steps=7", "optimizer.learning_rate=0.5",
                                        "model.dtype=bfloat16", "model.mlp_activations=relu,linear"])
    assert config.num_train_steps == 7 and isinstance(config.num_train_steps, int)
    assert config.optimizer.learning_rate == 0.5
    assert config.model.numerics.dtype == "bfloat16"  # the old spelling moved to its section
    assert tuple(config.model.mlp_activations) == ("relu", "linear")


def test_misspelt_override_suggests_the_real_key():
    config = config_lib.default_config()
    with pytest.raises(errors.ConfigError) as err:
        config_lib.apply_overrides(config, ["num_train_step=5"])
    assert "'num_train_step'" in str(err.value)
    assert "Did you mean 'num_train_steps'" in str(err.value)


def test_misspelt_nested_override_suggests_within_section():
    config = config_lib.default_config()
    with pytest.raises(errors.ConfigError, match="Did you mean 'model.d_model'"):
        config_lib.apply_overrides(config, ["model.dmodel=64"])


def test_unknown_key_in_config_file_is_rejected():
    config = config_lib.default_config()
    config.batch_sise = 8
    with pytest.raises(errors.ConfigError, match="Did you mean 'batch_size'"):
        config_lib.validate(config)


def test_wrong_type_names_key_and_expected_type():
    config = config_lib.default_config()
    with pytest.raises(errors.ConfigError, match=r"--config.batch_size=lots: expected an integer"):
        config_lib.apply_overrides(config, ["batch_size=lots"])
    with pytest.raises(errors.ConfigError, match="'model' is a section"):
        config_lib.apply_overrides(config, ["model=3"])


def test_wrong_type_in_config_file_is_a_config_error(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("from t5x_like import config_lib\n"
                    "def get_config():\n"
                    "    c = config_lib.default_config()\n"
                    "    c.num_train_steps = 'ten'\n"
                    "    return c\n")
    with pytest.raises(errors.ConfigError, match="Could not override field 'num_train_steps'.*"
                                                 "Use a value of the key's type"):
        config_lib.load_config_file(str(path))


def test_bad_enum_value_lists_choices():
    config = config_lib.default_config()
    config.optimizer.name = "adamm"
    with pytest.raises(errors.ConfigError, match="Did you mean 'adamw'"):
        config_lib.validate(config)


def test_model_enum_keys_are_checked_where_the_family_has_them():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    config.model.numerics.remat_policy = "dot"
    with pytest.raises(errors.ConfigError,
                       match="model.numerics.remat_policy.*Did you mean 'dots'"):
        config_lib.validate(config)
    config.model.numerics.remat_policy = "full"
    config_lib.validate(config)  # no "norm" check trips on a family without that key


def test_batch_must_divide_data_parallel_mesh():
    config = config_lib.default_config()
    config.batch_size = 12
    config.mesh.data, config.mesh.fsdp = 2, 4
    with pytest.raises(errors.ConfigError) as err:
        config_lib.validate_for_devices(config, num_devices=8)
    message = str(err.value)
    assert "batch_size=12" in message and "8" in message and "--config.batch_size=16" in message


def test_mesh_must_match_device_count():
    config = config_lib.default_config()
    config.mesh.data, config.mesh.fsdp = 2, 2
    with pytest.raises(errors.ConfigError, match="needs 4 devices but 8 are available"):
        config_lib.validate_for_devices(config, num_devices=8)
    config.mesh.data, config.mesh.fsdp = -1, 3
    with pytest.raises(errors.ConfigError, match="does not divide the 8 available"):
        config_lib.validate_for_devices(config, num_devices=8)


def streams_config(batch_size=32, data_streams=0):
    config = config_lib.default_config()
    config.batch_size, config.data_streams = batch_size, data_streams
    return config


def test_data_streams_default_to_a_count_independent_of_the_processes():
    # 8 streams for a batch of 32, whatever the (dividing) process count: same batches.
    assert {config_lib.resolve_data_streams(streams_config(), p) for p in (1, 2, 4, 8)} == {8}
    assert config_lib.resolve_data_streams(streams_config(batch_size=12), 2) == 4
    # Processes that do not divide it get one stream each; a checkpoint's count is kept.
    assert config_lib.resolve_data_streams(streams_config(), process_count=16) == 16
    assert config_lib.resolve_data_streams(streams_config(batch_size=12), 3) == 3
    assert config_lib.resolve_data_streams(streams_config(), 2, {"data_streams": 8}) == 8
    assert config_lib.resolve_data_streams(streams_config(), 1, {"model": {}}) == 1  # pre-streams
    assert config_lib.resolve_data_streams(streams_config(data_streams=8), 2) == 8


@pytest.mark.parametrize("config, process_count, saved, message", [
    (streams_config(data_streams=-1), 1, None, r"'data.streams' must be a finite number >= 0, got -1"),
    (streams_config(batch_size=12, data_streams=8), 1, None,
     r"batch_size=12 does not split into data.streams=8 equal parts"),
    (streams_config(data_streams=4), 8, None,
     r"input streams \(data.streams=4\) do not divide over 8 processes; set "
     r"--config.data.streams to a multiple of 8"),
    (streams_config(batch_size=12), 8, None,
     r"batch_size=12 does not split over the input streams \(data.streams=0 gives 8 streams "
     r"here\)"),
    (streams_config(), 3, {"data_streams": 8},
     r"the checkpoint's 8 streams\) do not divide over 3 processes; run on a process count "
     r"that divides 8"),
    (streams_config(data_streams=4), 1, {"data_streams": 8},
     r"data.streams=4, but the checkpoint being resumed was saved with 8 input streams.*"
     r"Set --config.data.streams=8"),
])
def test_data_streams_that_cannot_work_are_named_with_the_fix(config, process_count, saved,
                                                              message):
    with pytest.raises(errors.ConfigError, match=message):
        config_lib.validate(config)
        config_lib.resolve_data_streams(config, process_count, saved)


def test_mesh_fill_axis():
    assert config_lib.resolve_mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == {
        "dcn": 1, "data": 4, "fsdp": 2, "tensor": 1}


def test_cli_typo_fails_fast_before_jax():
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", f"--config={QUICKSTART}",
         "--workdir=/nonexistent/never_written", "--config.num_train_step=5"],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode == 2
    assert "num_train_step" in result.stderr and "Did you mean 'num_train_steps'" in result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 15, f"config error took {elapsed:.1f}s; it must not wait for JAX"


def test_cli_unknown_task_suggests_registered_names():
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", f"--config={QUICKSTART}",
         "--workdir=/nonexistent/never_written", "--config.task=embedded_en_span_corruptio"],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2
    assert "Did you mean 'embedded_en_span_corruption'" in result.stderr


def test_model_keys_are_checked_against_the_chosen_family():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    config_lib.validate(config)
    with config.model.unlocked():
        config.model.num_encoder_layers = 2  # an encoder-decoder key
    with pytest.raises(errors.ConfigError, match="Unknown config key 'model.num_encoder_layers'"):
        config_lib.validate(config)


def test_unknown_family_lists_the_families():
    families = "\\['bart', 'bilm', 'decoder', 'electra', 'encoder', 'encoder_decoder'\\]"
    with pytest.raises(errors.ConfigError, match="available: " + families):
        config_lib.model_defaults("encoder_only")


@pytest.mark.parametrize("dcn", [-1, -4])
def test_a_bad_dcn_axis_is_named(dcn):
    config = config_lib.default_config()
    config.mesh.dcn = dcn
    with pytest.raises(errors.ConfigError, match="mesh.dcn must be the number of slices, "
                                                     "or 0 for the slices the devices span"):
        config_lib.validate(config)


def test_config_file_argument_is_passed_to_get_config_and_refused_where_none_is_taken(tmp_path):
    with_arg = tmp_path / "with_arg.py"
    with_arg.write_text("from t5x_like import config_lib\n"
                        "def get_config(task):\n"
                        "    c = config_lib.default_config()\n"
                        "    c.task = task\n"
                        "    return c\n")
    assert config_lib.load_config_file(f"{with_arg}:embedded_en_lm").task == "embedded_en_lm"
    with pytest.raises(errors.ConfigError, match=r"takes no argument.*drop ':x'"):
        config_lib.load_config_file("configs/quickstart.py:x")


def test_vocabulary_checkpoint_needs_init_from():
    config = config_lib.load_config_file("configs/quickstart.py")
    config.vocabulary = "checkpoint"
    with pytest.raises(errors.ConfigError, match="init_from is empty"):
        config_lib.validate(config)
