"""Parameter-efficient tuning: frozen parameters stay bit-for-bit and carry no optimizer
state; LoRA and adapters start at the base model exactly and shard like it; PEFT
checkpoints hold only what trains and load only on their own base; ``peft merge`` folds
LoRA into the base with the same logits."""

import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from t5x_like import config_lib, errors, summary
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.training import preflight

REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny_decoder(bitfit: bool = False, optimizer: str = "adamw", num_layers: int = 1, **peft):
    """A decoder of one layer (what is added or frozen is per layer: one shows it, and
    compiles in about 60% of two's time); scanned stacks take two (``family_config``), so
    each layer's slice of the stacked params is told apart."""
    config = config_lib.default_config()
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 16}
    config.batch_size = 8
    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                             num_layers=num_layers, max_length=32))
    config.optimizer.name = optimizer
    config.optimizer.learning_rate = 1e-2
    config.optimizer.warmup_steps = 0
    config.peft.bitfit = bitfit
    config_lib.apply_overrides(config, [f"peft.{k}={v}" for k, v in peft.items()])
    config_lib.validate(config)
    return config


def random_batch(trainer, config, seed=0):
    structure_batch = structures.for_config(config).abstract_batch(config.task_feature_lengths,
                                                                   config.batch_size)
    rng = np.random.default_rng(seed)
    batch = {}
    for name, spec in structure_batch.items():
        if spec.dtype == jnp.float32:
            batch[name] = np.ones(spec.shape, np.float32)
        else:
            batch[name] = rng.integers(4, 8192, size=spec.shape).astype(np.int32)
    return jax.device_put(batch, trainer.batch_sharding)


def is_bias(path) -> bool:
    return str(getattr(path[-1], "key", path[-1])) == "bias"


def train_three_steps(config, devices):
    mesh = partitioning.make_mesh(config_lib.resolve_mesh_shape(dict(config.mesh), len(devices)),
                                  devices)
    trainer = trainer_lib.build_trainer(config, mesh)
    state = trainer.init_state(config.seed)
    before = jax.device_get(state.params)
    for step in range(3):
        state, metrics = trainer.train_step(state, random_batch(trainer, config, step))
    return trainer, before, jax.device_get(state), metrics


@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_bitfit_trains_biases_only_and_keeps_no_state_for_frozen_params(optimizer):
    config = tiny_decoder(bitfit=True, optimizer=optimizer)
    trainer, before, state, metrics = train_three_steps(config, jax.devices()[:1])
    flat_before = jax.tree_util.tree_flatten_with_path(before)[0]
    after = jax.tree.leaves(state.params)
    biases = 0
    for (path, old), new in zip(flat_before, after, strict=False):
        if is_bias(path):
            biases += old.size
            assert not np.array_equal(old, new), path  # trained
        else:
            assert np.array_equal(old, new), path  # frozen, bit for bit
    assert biases > 0 and np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    state_size = sum(int(np.size(x)) for x in jax.tree.leaves(state.opt_state))
    total = sum(int(np.size(x)) for x in jax.tree.leaves(state.params))
    # AdamW: two moments of the biases plus counts; Adafactor: at most one per bias.
    assert state_size <= 2 * biases + 16, (state_size, biases, total)
    full = tiny_decoder(bitfit=False, optimizer=optimizer)
    full_trainer = trainer_lib.build_trainer(full, trainer.mesh)
    full_size = sum(int(np.prod(x.shape)) for x in
                    jax.tree.leaves(full_trainer.abstract_state.opt_state))
    assert state_size * 20 < full_size


def test_bitfit_on_a_model_without_biases_is_refused():
    config = tiny_config(**{"peft.bitfit": True})  # T5 v1.1: no biases
    mesh = partitioning.make_mesh({"dcn": 1, "data": 1, "fsdp": 1, "tensor": 1},
                                  jax.devices()[:1])
    trainer = trainer_lib.build_trainer(config, mesh)
    with pytest.raises(errors.ConfigError, match="has none"):
        preflight.check_peft_fits(config_lib.spec_of(config), trainer.abstract_state.params)


@pytest.mark.parametrize("override,expected", [
    ("--config.peft.bitfit=true", 102_144),
    # 12 layers x (query, value) x (768 x 8 + 8 x 768): as Hugging Face PEFT counts GPT-2.
    ("--config.peft.lora.rank=8", 294_912)], ids=["bitfit", "lora"])
def test_summary_prints_the_trainable_fraction(override, expected, capsys):
    # The command's main in this process (its shapes only: nothing is compiled).
    assert summary.main([f"--config={REPO / 'configs' / 'gpt2_small.py'}", override]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert last[0] == "params:" and last[2] == "trainable:"
    total, trainable = int(last[1]), int(last[3])
    assert trainable == expected and last[4] == f"({100 * trainable / total:.2f}%)"


# -- LoRA and adapters ----------------------------------------------------------------------

from flax import traverse_util  # noqa: E402

from t5x_like import peft as peft_runs  # noqa: E402
from t5x_like import structures  # noqa: E402
from t5x_like.checkpoints import param_sources  # noqa: E402
from t5x_like.checkpoints.param_sources import peft_partial  # noqa: E402
from t5x_like.models import peft_modules  # noqa: E402

LORA = {"lora.rank": 4, "lora.alpha": 8.0}
ADAPTERS = {"adapter.size": 8}
PREFIX = {"prefix.length": 3}
PREFIX_MLP = {"prefix.length": 3, "prefix.reparameterize": True, "prefix.hidden": 16}
PROMPT = {"prompt.length": 4}


def flat(tree) -> dict:
    return traverse_util.flatten_dict(peft_modules.plain_dicts(jax.device_get(tree)), sep="/")


def one_device_mesh():
    return partitioning.make_mesh({"dcn": 1, "data": 1, "fsdp": 1, "tensor": 1},
                                  jax.devices()[:1])


def forward(config, params, batch):
    """The model's output (logits) on ``batch``'s inputs, deterministic, as one compiled
    program (as training and eval run it; op by op it compiled a program per operation)."""
    model, family = structures.for_config(config).model, config.model.family

    def apply(params, batch):
        if family == "decoder":
            return model.apply({"params": params}, batch["decoder_input_tokens"])
        if family == "encoder":
            return model.apply({"params": params}, batch["encoder_input_tokens"])["mlm_logits"]
        return model.apply({"params": params}, batch["encoder_input_tokens"],
                           batch["decoder_input_tokens"], batch["decoder_target_tokens"])
    return np.asarray(jax.jit(apply)(params, batch))


def predict(config, params, batch, **options):
    """``config``'s structure's greedy tokens for ``batch``, jitted as eval's runner does
    (op by op, each call compiled its prefill's operations and its loop)."""
    structure = structures.for_config(config)
    return np.asarray(jax.jit(
        lambda params, batch: structure.predict_batch(params, batch, **options))(params, batch))


def family_config(family: str, scan: bool = False, **peft):
    if family == "decoder":
        config = tiny_decoder(num_layers=2 if scan else 1, **peft)
    else:
        config = tiny_config()
        if family == "encoder":
            config.task, config.task_feature_lengths = "embedded_en_mlm", {"inputs": 16}
            config.model = config_lib.model_defaults("encoder")
            config.model.update(dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16,
                                     d_ff=64, num_layers=1, max_length=32,
                                     next_sentence_head=False))
        config_lib.apply_overrides(config, [f"peft.{k}={v}" for k, v in peft.items()])
    config.model.scan_layers = scan
    config_lib.validate(config)
    return config


@pytest.mark.parametrize("family,scan", [("decoder", False), ("decoder", True),
                                         ("encoder_decoder", False), ("encoder", False)])
def test_untrained_lora_and_adapters_give_the_base_model_exactly(family, scan):
    """The base model's output on its weights equals the LoRA-and-adapters model's on the
    same weights plus its added params as initialised (A and the adapters' down kernels
    random, B and up zero): the base's weights are the PEFT model's own, so one init."""
    base_config = family_config(family, scan)
    config = family_config(family, scan, **LORA, **ADAPTERS)
    mesh = one_device_mesh()
    base_trainer = trainer_lib.build_trainer(base_config, mesh)
    peft_trainer = trainer_lib.build_trainer(config, mesh)
    params = flat(peft_trainer.init_state(1).params)
    added = {k for k in params if peft_modules.is_peft_param(tuple(k.split("/")))}
    assert any(k.endswith("query/lora_b") for k in added)
    assert any("/mlp/adapter/" in k for k in added) and any("attention/adapter/" in k
                                                             for k in added)
    assert any(np.abs(params[k]).max() > 0 for k in added if k.endswith("lora_a"))
    assert set(params) - added == set(flat(base_trainer.abstract_state.params))
    base = traverse_util.unflatten_dict({k: v for k, v in params.items() if k not in added},
                                        sep="/")
    batch = jax.device_get(random_batch(base_trainer, base_config))
    want = forward(base_config, base, batch)
    got = forward(config, traverse_util.unflatten_dict(params, sep="/"), batch)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("family", ["encoder", "encoder_decoder"])
def test_prompt_tuning_is_an_encoder_input_in_front_of_the_sequence(family):
    """The prompt works as if its embeddings were tokens of the input: a model whose
    token table holds the prompt at spare ids gives the same output on the input with
    those ids inserted (after [CLS] for BERT-style encoders, in front for T5)."""
    config = family_config(family, **PROMPT)
    plain_config = family_config(family)
    mesh = one_device_mesh()
    trainer = trainer_lib.build_trainer(config, mesh)
    params = flat(trainer.init_state(0).params)
    prompt_key = [k for k in params if k.endswith("/prompt") or k == "prompt"]
    assert len(prompt_key) == 1 and params[prompt_key[0]].shape == (4, 32)
    table_key = [k for k in params if k.endswith("token_embedder/embedding")][0]
    table = params[table_key]
    # Initialised from the token table's rows, as Lester et al.
    np.testing.assert_array_equal(params[prompt_key[0]],
                                  table[peft_modules.prompt_init_ids(4, table.shape[0])])
    spare = np.arange(table.shape[0] - 4, table.shape[0])
    params[prompt_key[0]] = params[prompt_key[0]] + 0.5  # trained away from its init
    with_prompt = traverse_util.unflatten_dict(params, sep="/")
    plain = {k: v for k, v in params.items() if k != prompt_key[0]}
    plain[table_key] = table.copy()
    plain[table_key][spare] = params[prompt_key[0]]
    plain = traverse_util.unflatten_dict(plain, sep="/")

    batch = jax.device_get(random_batch(trainer, config))
    got = forward(config, with_prompt, batch)
    inputs = np.asarray(batch["encoder_input_tokens"])
    prompt = np.broadcast_to(spare, (len(inputs), 4))
    if family == "encoder":
        inserted = np.concatenate([inputs[:, :1], prompt, inputs[:, 1:]], axis=1)
        want = forward(plain_config, plain, dict(batch, encoder_input_tokens=inserted))
        want = np.concatenate([want[:, :1], want[:, 5:]], axis=1)
    else:
        inserted = np.concatenate([prompt, inputs], axis=1)
        want = forward(plain_config, plain, dict(batch, encoder_input_tokens=inserted))
    assert got.shape == want.shape
    # Logits over the spare ids differ where the output layer is the (edited) token table.
    np.testing.assert_allclose(got[..., :spare[0]], want[..., :spare[0]], atol=2e-5, rtol=1e-5)


def test_prompt_tuning_is_refused_where_it_does_not_apply():
    with pytest.raises(errors.ConfigError, match="prefix tuning"):
        tiny_decoder(**PROMPT)
    config = family_config("encoder", **{"prompt.length": 20})
    trainer = trainer_lib.build_trainer(config, one_device_mesh())
    with pytest.raises(errors.ConfigError, match="max_length=32"):
        preflight.check_peft_fits(config_lib.spec_of(config), trainer.abstract_state.params)


def test_lora_params_have_logical_axes_of_the_kernel_they_adapt():
    config = family_config("decoder", scan=True, **LORA)
    model = structures.for_config(config).model
    boxed = trainer_lib.abstract_boxed_params(model, {"decoder_input_tokens": 8})
    import flax.linen as nn
    specs = traverse_util.flatten_dict(nn.get_partition_spec(boxed), sep="/")
    assert tuple(specs["layers/attention/query/kernel"]) == ("layers", "embed", "heads", "kv")
    assert tuple(specs["layers/attention/query/lora_a"]) == ("layers", "embed", None)
    assert tuple(specs["layers/attention/query/lora_b"]) == ("layers", None, "heads", "kv")
    assert "layers/attention/key/lora_a" not in specs  # default targets: query and value


# LoRA, adapters and a prefix in one model (each was a case of its own: what trains is
# told apart by each param's path, the same rule for all three), and the reparameterised
# prefix in a scanned stack.
@pytest.mark.parametrize("peft,scan", [({**LORA, **ADAPTERS, **PREFIX}, False),
                                       (PREFIX_MLP, True)],
                         ids=["lora_adapters_prefix", "prefix_mlp-scanned"])
def test_only_added_params_train_and_only_they_have_optimizer_state(peft, scan):
    config = family_config("decoder", scan, **peft)
    trainer, before, state, metrics = train_three_steps(config, jax.devices()[:1])
    old, new = flat(before), flat(state.params)
    trained = 0
    for key, value in old.items():
        if peft_modules.is_peft_param(tuple(key.split("/"))):
            trained += value.size
            if key.endswith(("lora_a", "down_kernel")):
                continue  # zero gradient at first, with B (up) at zero; later steps move it
            assert not np.array_equal(value, new[key]), key
        else:
            assert np.array_equal(value, new[key]), key  # frozen, bit for bit
    # AdamW: two moments per trainable parameter, plus step counts.
    state_size = sum(int(np.size(x)) for x in jax.tree.leaves(state.opt_state))
    assert trained > 0 and state_size <= 2 * trained + 16, (state_size, trained)


def test_bitfit_and_lora_train_the_same_on_a_2x4_mesh_as_on_one_device():
    """BitFit's biases and LoRA's factors (one model; they were a test each) train on a
    2x4 data x FSDP mesh as on one device, the factors sharded like their kernels."""
    one = tiny_decoder(bitfit=True, **LORA)
    sharded = tiny_decoder(bitfit=True, **LORA)
    sharded.mesh.data, sharded.mesh.fsdp = 2, 4
    _, before, state_one, _ = train_three_steps(one, jax.devices()[:1])
    trainer, _, state_mesh, _ = train_three_steps(sharded, jax.devices()[:8])
    spec = trainer.state_shardings.params["layers_0"]["attention"]["query"]["lora_a"].spec
    assert "fsdp" in str(spec)  # sharded like the query kernel's embed dimension
    after = flat(state_one.params)
    moved = {k for k, v in flat(before).items() if not np.array_equal(v, after[k])}
    assert any(k.endswith("/bias") for k in moved) and any(k.endswith("lora_b") for k in moved)
    # Adam's normalised steps (about lr = 1e-2 each) amplify float reassociation in tiny
    # gradients: agreement to 5e-5 is 0.2% of the 3 steps' movement.
    for a, b in zip(jax.tree.leaves(state_one.params), jax.tree.leaves(state_mesh.params), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scanned"])
def test_merged_lora_gives_the_unmerged_logits(scan):
    config = family_config("decoder", scan, **LORA)
    trainer = trainer_lib.build_trainer(config, one_device_mesh())
    params = flat(trainer.init_state(0).params)
    rng = np.random.default_rng(0)
    for key in params:
        if key.endswith("lora_b"):  # a trained-looking, nonzero B
            params[key] = rng.normal(0, 0.05, params[key].shape).astype(np.float32)
    params = traverse_util.unflatten_dict(params, sep="/")
    merged = peft_modules.merge_lora(params, peft_modules.PeftSettings.from_config(config.peft))
    assert not any("lora" in k for k in flat(merged))
    batch = jax.device_get(random_batch(trainer, config))
    unmerged_logits = forward(config, params, batch)
    merged_logits = forward(family_config("decoder", scan), merged, batch)
    np.testing.assert_allclose(merged_logits, unmerged_logits, atol=1e-4, rtol=1e-4)
    base_logits = forward(family_config("decoder", scan), traverse_util.unflatten_dict(
        {k: v for k, v in flat(params).items() if "lora" not in k}, sep="/"), batch)
    assert float(np.abs(base_logits - unmerged_logits).max()) > 1e-3  # LoRA did something


@pytest.mark.parametrize("family", ["decoder",
                                    pytest.param("encoder_decoder", marks=pytest.mark.slow)])
def test_decoding_with_lora_equals_decoding_the_merged_model(family):
    config = family_config(family, **LORA, **{"lora.targets": "kernel$"})  # every kernel
    trainer = trainer_lib.build_trainer(config, one_device_mesh())
    params = flat(trainer.init_state(0).params)
    rng = np.random.default_rng(1)
    for key in params:
        if key.endswith("lora_b"):
            params[key] = rng.normal(0, 0.2, params[key].shape).astype(np.float32)
    params = traverse_util.unflatten_dict(params, sep="/")
    merged = peft_modules.merge_lora(params, peft_modules.PeftSettings.from_config(config.peft))
    batch = jax.device_get(random_batch(trainer, config))
    with_lora = predict(config, params, batch, max_decode_length=6)
    plain = predict(family_config(family), merged, batch, max_decode_length=6)
    np.testing.assert_array_equal(with_lora, plain)
    base = traverse_util.unflatten_dict({k: v for k, v in flat(params).items() if "lora" not in k},
                                        sep="/")
    unadapted = predict(family_config(family), base, batch, max_decode_length=6)
    assert not np.array_equal(unadapted, with_lora)


@pytest.mark.parametrize("family,peft", [
    ("decoder", PREFIX_MLP), ("encoder_decoder", PROMPT),
    pytest.param("encoder_decoder", PREFIX_MLP, marks=pytest.mark.slow)],
    ids=["decoder-prefix", "t5-prompt", "t5-prefix"])
def test_tuned_decoding_follows_the_full_forward_pass(family, peft):
    """Cached decoding sees the prefix (prompt) as the full forward pass does: each greedy
    token is the argmax of a teacher-forced pass over the tokens before it."""
    config = family_config(family, **peft)
    trainer = trainer_lib.build_trainer(config, one_device_mesh())
    params = flat(trainer.init_state(0).params)
    # A prefix that matters: its keys and values far from the small initial ones.
    params = traverse_util.unflatten_dict(
        {k: v * 30 if "/prefix/" in k or k.endswith("prompt") else v
         for k, v in params.items()}, sep="/")
    batch = jax.device_get(random_batch(trainer, config))
    steps = 5
    generated = predict(config, params, batch, max_decode_length=steps)
    # The teacher-forced pass over the generated tokens (forward: the model's logits).
    if family == "decoder":
        tokens = np.array(batch["decoder_input_tokens"])
        tokens[:, 1:steps + 1] = generated  # the prompt is each row's first token
        logits = forward(config, params, dict(batch, decoder_input_tokens=tokens))
        np.testing.assert_array_equal(generated, logits.argmax(-1)[:, :steps])
    else:
        inputs = np.asarray(generated[:, :steps])
        decoder_inputs = np.concatenate([np.zeros_like(inputs[:, :1]), inputs[:, :-1]], axis=1)
        logits = forward(config, params, dict(batch, decoder_input_tokens=decoder_inputs,
                                              decoder_target_tokens=inputs))
        np.testing.assert_array_equal(inputs, logits.argmax(-1))
    without = traverse_util.unflatten_dict(
        {k: v for k, v in flat(params).items()
         if not peft_modules.is_peft_param(tuple(k.split("/")))}, sep="/")
    plain = predict(family_config(family), without, batch, max_decode_length=steps)
    assert not np.array_equal(plain, generated)  # the prefix changed the output


def test_a_lora_pattern_that_matches_no_kernel_is_refused():
    config = tiny_decoder(**{**LORA, "lora.targets": "attention/qkv/kernel$"})
    trainer = trainer_lib.build_trainer(config, one_device_mesh())
    with pytest.raises(errors.ConfigError, match="matches none of the model's 6 kernels"):
        preflight.check_peft_fits(config_lib.spec_of(config), trainer.abstract_state.params)
    with pytest.raises(errors.ConfigError, match="not a regular expression"):
        tiny_decoder(**{**LORA, "lora.targets": "(query"})


# -- PEFT runs on disk ------------------------------------------------------------------------

import json  # noqa: E402

from t5x_like import eval as eval_cli  # noqa: E402
from t5x_like import train  # noqa: E402


def short_run(config, steps: int, held_out: bool = True):
    """``steps`` steps, a checkpoint every 3, and the held-out loss every 3 (``held_out``;
    off for the plain base runs, whose held-out loss no test reads)."""
    config.num_train_steps = steps
    config.checkpoint_every_steps = 3
    config.eval_every_steps = 3 if held_out else 0
    config.eval_batches = 1
    return config


def test_a_peft_checkpoint_holds_what_trains_and_joins_only_its_own_base(tmp_path):
    from t5x_like.checkpoints import checkpoint_store
    config = tiny_decoder(**LORA, **ADAPTERS)
    trainer = trainer_lib.build_trainer(config, one_device_mesh())
    state = trainer.init_state(0)
    full = flat(state.params)
    base = {k: v for k, v in full.items() if not peft_modules.is_peft_param(tuple(k.split("/")))}
    base = traverse_util.unflatten_dict(base, sep="/")
    view = peft_partial.saved_view(state, trainer)
    assert set(flat(view.params)) == {k for k in full
                                      if peft_modules.is_peft_param(tuple(k.split("/")))}
    identity = peft_partial.base_identity(str(tmp_path / "base"), None, base)
    checkpointer = checkpoint_store.Checkpointer(tmp_path / "checkpoints", keep=1, async_save=False)
    checkpointer.save(1, view, {}, {"peft_base": identity})
    checkpointer.close()
    reader = checkpoint_store.Checkpointer(tmp_path / "checkpoints", keep=1, async_save=False,
                                        read_only=True)
    restored, _, saved = reader.restore(1, peft_partial.abstract_saved_state(trainer))
    reader.close()
    joined = flat(param_sources.join(restored.params, base, trainer))
    assert joined.keys() == full.keys()
    for key, value in full.items():
        np.testing.assert_array_equal(joined[key], value)
    param_sources.check_base(saved["peft_base"], base, "the checkpoint", "the base")
    other = jax.tree.map(lambda x: x + 1e-7, base)  # one ulp-sized change is another base
    with pytest.raises(errors.UserError, match="holds other params"):
        param_sources.check_base(saved["peft_base"], other, "the checkpoint", "the base")


EVAL_CLOZE = ["--task=embedded_austen_cloze", "--max_examples=8", "--batch_size=8",
              "--inputs_length=16", "--targets_length=8", "--quiet"]


def option_scores(checkpoint, out, flags=EVAL_CLOZE) -> np.ndarray:
    """Every choice's log-likelihood under ``checkpoint``'s newest step (eval's rank mode)."""
    assert eval_cli.main([f"--checkpoint={checkpoint}", f"--output_dir={out}", *flags]) == 0
    newest = sorted((out / "predictions" / "embedded_austen_cloze").glob("step_*.jsonl"),
                    key=lambda p: int(p.stem.split("_")[1]))[-1]
    return np.array([json.loads(line)["option_scores"]
                     for line in newest.read_text().splitlines()])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """``(folder, config)``: a base run of 3 steps in ``folder / "base"`` and a LoRA run
    of 3 steps on it in ``folder / "lora"`` (``config``). The PEFT-run tests copy the LoRA
    run before they change it; the base stays where the LoRA run recorded it."""
    folder = tmp_path_factory.mktemp("peft_runs")
    train.run(short_run(tiny_decoder(), 3, held_out=False), str(folder / "base"), quiet=True)
    config = short_run(tiny_decoder(**LORA), 3)
    config.init_from = str(folder / "base")
    train.run(config, str(folder / "lora"), quiet=True)
    return folder, config


@pytest.mark.slow
def test_a_lora_run_saves_what_trains_resumes_evaluates_and_merges(lora_run, tmp_path):
    folder, config = lora_run
    base = folder / "base"
    saved = json.loads((folder / "lora" / "config.json").read_text())
    assert saved["peft_base"]["path"] == str(base) and saved["peft_base"]["step"] == 3
    sizes = {name: sum(f.stat().st_size for f in (folder / name / "checkpoints" / "3").rglob("*")
                       if f.is_file()) for name in ("base", "lora")}
    assert sizes["lora"] * 5 < sizes["base"], sizes  # no frozen weights, no state for them

    shutil.copytree(folder / "lora", tmp_path / "lora")
    config = config.copy_and_resolve_references()
    config.num_train_steps = 6  # resume: the base is read back and joined
    assert train.run(config, str(tmp_path / "lora"), quiet=True)["step"] == 6

    assert peft_runs.main(["merge", f"--peft={tmp_path / 'lora'}",
                           f"--out={tmp_path / 'merged'}"]) == 0
    _exported_logits_equal_the_lora_model(tmp_path, config)
    # The merged folder carries the run's lengths: without length flags both are read as
    # the run is, and score alike (a folder without them would be read at lengths fitted
    # to its positions, 24 + 8).
    carried = json.loads((tmp_path / "merged" / "run_config.json").read_text())
    assert carried["task_feature_lengths"] == {"targets": 16}
    assert carried["task"] == "embedded_en_lm" and carried["batch_size"] == 8
    own_lengths = [flag for flag in EVAL_CLOZE if "_length=" not in flag] + ["--num_shots=0"]
    peft_scores = option_scores(tmp_path / "lora", tmp_path / "eval_lora", own_lengths)
    merged_scores = option_scores(tmp_path / "merged", tmp_path / "eval_merged", own_lengths)
    base_scores = option_scores(base, tmp_path / "eval_base", own_lengths)
    assert peft_scores.shape == (8, 4)
    np.testing.assert_allclose(merged_scores, peft_scores, rtol=1e-5, atol=1e-4)
    assert np.abs(base_scores - peft_scores).max() > 1e-3  # the adapted model is not the base
    shutil.copytree(tmp_path / "merged", tmp_path / "bare")  # the control: lengths not kept
    (tmp_path / "bare" / "run_config.json").unlink()
    bare = option_scores(tmp_path / "bare", tmp_path / "eval_bare", own_lengths)
    assert np.abs(bare - peft_scores).max() > 1e-3


def _exported_logits_equal_the_lora_model(tmp_path, config):
    """The merged folder exports to Hugging Face GPT-2 with the LoRA model's logits."""
    import torch
    import transformers

    from t5x_like.checkpoints import param_sources
    from t5x_like.convert.__main__ import export_hf
    export_hf(str(tmp_path / "merged"), str(tmp_path / "hf"))
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    trainer = trainer_lib.build_trainer(config, one_device_mesh())
    source = param_sources.resolve(str(tmp_path / "lora"))
    params = jax.device_get(source.restore_params(source.steps()[-1], trainer))
    tokens = np.random.default_rng(0).integers(4, 8192, size=(2, 16))
    ours = forward(config, params, {"decoder_input_tokens": tokens})
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_a_peft_checkpoint_on_another_base_is_refused(lora_run, tmp_path, capsys):
    folder, config = lora_run
    lora = tmp_path / "lora"
    shutil.copytree(folder / "lora", lora)  # its recorded base: folder / "base"
    other = short_run(tiny_decoder(), 3, held_out=False)
    other.seed = 7  # the same model and steps, other weights
    train.run(other, str(tmp_path / "other"), quiet=True)

    code = peft_runs.main(["merge", f"--peft={lora}", f"--base={tmp_path / 'other'}",
                           f"--out={tmp_path / 'merged'}"])
    err = capsys.readouterr().err
    assert code == 2 and "was trained on the base" in err and "holds other params" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "merged" / "params").exists()

    # The other weights put where the base was (the shared base put back after).
    (folder / "base").rename(tmp_path / "base_aside")
    (tmp_path / "other").rename(folder / "base")
    try:
        code = eval_cli.main([f"--checkpoint={lora}", f"--output_dir={tmp_path / 'eval'}",
                              *EVAL_CLOZE])
        err = capsys.readouterr().err
        assert code == 2 and "holds other params" in err, err  # eval refuses it too
        # ... and so does a resume, without moving the checkpoint aside as damaged.
        config = config.copy_and_resolve_references()
        config.num_train_steps = 6
        with pytest.raises(errors.UserError, match="holds other params"):
            train.run(config, str(lora), quiet=True)
        assert (lora / "checkpoints" / "3").is_dir()
        assert not (lora / "damaged_checkpoints").exists()
    finally:
        (folder / "base").rename(tmp_path / "other")
        (tmp_path / "base_aside").rename(folder / "base")


def test_a_fresh_prompt_copies_rows_of_the_pretrained_token_table():
    table = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    base = {("backbone", "token_embedder", "embedding"): table,
            ("backbone", "layers_0", "attention", "query", "kernel"): np.zeros((4, 1, 4))}
    fresh = {("backbone", "prompt"): np.zeros((5, 4), np.float32),
             ("head", "kernel"): np.ones((4, 2), np.float32)}
    out = peft_modules.prompts_from_table(fresh, base)
    ids = peft_modules.prompt_init_ids(5, 300)
    assert ids[0] >= 10 and ids[-1] == 299 and len(set(ids.tolist())) == 5
    np.testing.assert_array_equal(out[("backbone", "prompt")], table[ids])
    np.testing.assert_array_equal(out[("head", "kernel")], fresh[("head", "kernel")])


def test_merge_folds_only_lora():
    lora = peft_modules.PeftSettings(lora_rank=4)
    peft_runs.check_foldable(lora, "run")
    for extra, named in ((dict(adapter_size=8), "adapters"), (dict(prefix_length=3), "prefixes"),
                         (dict(prompt_length=4), "a prompt")):
        with pytest.raises(errors.UserError, match=f"trained {named}, which add computation"):
            peft_runs.check_foldable(peft_modules.PeftSettings(lora_rank=4, **extra), "run")
    with pytest.raises(errors.UserError, match="has no LoRA to merge"):
        peft_runs.check_foldable(peft_modules.PeftSettings(), "run")


def test_lora_trains_the_same_with_the_logits_in_slices():
    """``loss.logit_chunks`` projects slices through the PEFT-wrapped model: two LoRA steps
    on a 2x4 mesh give the losses and adapters of the logits computed at once."""
    runs = []
    for chunks in (1, 3):
        config = tiny_decoder(**{"lora.rank": 4})
        config_lib.apply_overrides(config, [f"loss.logit_chunks={chunks}"])
        trainer = trainer_lib.build_trainer(config, partitioning.make_mesh({"data": 2, "fsdp": 4}))
        state, batch, losses = trainer.init_state(0), random_batch(trainer, config), []
        for _ in range(2):
            state, metrics = trainer.train_step(state, batch)
            losses.append(float(metrics["loss"]))
        runs.append((losses, jax.device_get(state.params)))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(runs[1][1]), jax.tree.leaves(runs[0][1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
