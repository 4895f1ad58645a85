"""ELECTRA: shared embeddings, replaced-token labels, sampling without gradient, the
objective through the train loop, fine-tuning the discriminator, and Hugging Face
parity (random tiny models, no download)."""

import json
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers
from conftest import drawn_params, tiny_config
from flax import traverse_util

from t5x_like import config_lib, errors, objectives, structures, train
from t5x_like.models import electra
from t5x_like.structures.head import with_head_labels

TINY = dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64, num_layers=2,
            embedding_dim=16, generator_d_model=16, generator_num_heads=1,
            generator_head_dim=16, generator_d_ff=32, generator_num_layers=2, max_length=64)


def tiny_model(**overrides):
    return structures.build_model({"family": "electra", **TINY, "vocab_size": 128, **overrides})


@pytest.fixture(scope="module")
def towers():
    """A tiny ELECTRA, parameters drawn for it (traced, not compiled) and the gradient of
    one output's sum, jitted with the tokens and masked positions as arguments: the two
    gradient tests share its compiled programs (one per output). One layer a tower: what
    they check (one embedding set, the stopped sample) is the same at any depth."""
    model = tiny_model(num_layers=1, generator_num_layers=1)
    params = drawn_params(model, jnp.ones((2, 12), jnp.int32))

    def output(p, tokens, masked, key):
        return model.apply({"params": p}, tokens, masked_positions=masked,
                           rngs={"sample": jax.random.key(1)})[key].sum()
    return params, jax.jit(jax.grad(output), static_argnums=3)


def test_one_set_of_embeddings_serves_both_towers_and_both_losses_train_it(towers):
    params, grad = towers
    assert set(params) == {"embeddings", "generator", "discriminator"}
    assert not any("token_embedder" in "/".join(k) for k in
                   traverse_util.flatten_dict(dict(params["generator"])))
    tokens = jnp.asarray(np.random.default_rng(0).integers(5, 100, size=(2, 12)))
    for key in ("mlm_logits", "rtd_logits"):
        grads = grad(params, tokens, tokens % 3 == 0, key)
        table = grads["embeddings"]["token_embedder"]["embedding"]
        assert float(jnp.abs(table).sum()) > 0, key


def test_no_gradient_flows_from_the_discriminator_into_the_generator(towers):
    params, grad = towers
    tokens = jnp.asarray(np.random.default_rng(0).integers(5, 100, size=(2, 12)))
    grads = grad(params, tokens, jnp.ones((2, 12), bool), "rtd_logits")
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads["generator"]))
    assert any(float(jnp.abs(g).max()) > 0.0 for g in jax.tree.leaves(grads["discriminator"]))


def test_gumbel_samples_follow_the_generator_distribution():
    logits = jnp.log(jnp.asarray([0.5, 0.3, 0.15, 0.05]))
    draws = electra.gumbel_sample(jax.random.key(0), jnp.broadcast_to(logits, (20000, 4)))
    frequencies = np.bincount(np.asarray(draws), minlength=4) / draws.size
    np.testing.assert_allclose(frequencies, [0.5, 0.3, 0.15, 0.05], atol=0.015)


def test_a_sample_cap_samples_the_first_masked_positions_and_argmaxes_the_rest():
    logits = jnp.zeros((1, 6, 50)).at[..., 7].set(2.0)  # argmax 7, but sampling is spread out
    masked = jnp.asarray([[False, True, True, False, True, True]])
    capped = np.asarray(electra.sample_masked(jax.random.key(3), logits, masked, 2))
    assert capped[0, 4] == capped[0, 5] == 7  # beyond the cap: the argmax
    draws = np.stack([np.asarray(electra.sample_masked(jax.random.key(i), logits, masked, 2))
                      for i in range(40)])
    assert (draws[:, 0, 1] != 7).any() and (draws[:, 0, 2] != 7).any()  # sampled
    full = electra.sample_masked(jax.random.key(3), logits, masked, 0)
    assert full.shape == (1, 6)


class _Fixed:
    """A stand-in model whose generator 'samples' the given corrupted tokens."""

    def __init__(self, corrupted, rtd_logits, vocab=10, weight=50.0):
        self.config = types.SimpleNamespace(pad_id=0, discriminator_loss_weight=weight)
        self.out = {"corrupted_tokens": jnp.asarray(corrupted),
                    "rtd_logits": jnp.asarray(rtd_logits, jnp.float32),
                    "mlm_logits": jnp.zeros(np.shape(corrupted) + (vocab,))}

    def apply(self, variables, *args, **kwargs):
        return self.out


def test_a_token_is_labelled_replaced_exactly_where_the_sample_differs_from_the_original():
    original = np.array([[2, 5, 6, 7, 3, 0]])        # the last position is padding
    weights = np.array([[0, 1, 1, 1, 0, 0]], np.float32)  # three masked positions
    corrupted = np.array([[2, 9, 6, 8, 3, 0]])       # the sample at 2 equals the original
    logits = np.array([[-1.0, 2.0, 0.5, -3.0, 0.0, 7.0]])
    batch = {"encoder_input_tokens": jnp.asarray([[2, 4, 4, 4, 3, 0]]),
             "encoder_target_tokens": jnp.asarray(original),
             "encoder_loss_weights": jnp.asarray(weights)}
    fixed = _Fixed(corrupted, logits)
    _, metrics = objectives.electra_objective(
        fixed.out, batch, pad_id=fixed.config.pad_id,
        discriminator_loss_weight=fixed.config.discriminator_loss_weight)
    labels = np.array([0, 1, 0, 1, 0], np.float32)   # real tokens only
    x = logits[0, :5]
    expected_bce = np.mean(np.log1p(np.exp(x)) - labels * x)
    np.testing.assert_allclose(float(metrics["discriminator_loss"]), expected_bce, rtol=1e-6)
    assert float(metrics["replaced_fraction"]) == pytest.approx(2 / 5)
    assert float(metrics["discriminator_accuracy"]) == pytest.approx(np.mean((x > 0) == labels))
    np.testing.assert_allclose(float(metrics["loss"]),
                               float(metrics["mlm_loss"]) + 50.0 * expected_bce, rtol=1e-6)


def test_the_flop_count_is_both_towers():
    config = ml_collections.ConfigDict({"family": "electra", **TINY,
                                        "mlp_activations": ("gelu_exact",)})
    spec = config_lib.model_spec_of(config)
    electra_flops = structures.ElectraStructure(None).forward_flops_per_sequence(
        spec, {"inputs": 32})
    discriminator_alone = structures.ElectraStructure(None).forward_flops_per_sequence(
        spec.replace(generator=spec.generator.replace(d_model=0)), {"inputs": 32})

    # Written out (2 FLOPs per multiply-add, PaLM-style) at TINY's sizes over 32 tokens.
    def tower(d, heads, head_dim, d_ff, layers, head_flops):
        s, inner = 32, heads * head_dim
        matmuls = 4 * d * inner + 2 * d * d_ff      # attention projections; GELU MLP in, out
        projection = 2 * s * 16 * d if d != 16 else 0  # the shared 16-wide embeddings to d
        return (2 * s * layers * matmuls + 4 * layers * s * s * inner  # scores, weighted sum
                + projection + head_flops)
    discriminator = tower(32, 2, 16, 64, 2, 2 * 32 * 32 * 32 + 2 * 32 * 32)  # dense, 1 logit
    generator = tower(16, 1, 16, 32, 2, 2 * 32 * 16 * 16 + 2 * 32 * 16 * 8192)  # MLM, tied
    assert discriminator_alone == discriminator
    assert electra_flops == discriminator + generator


def electra_config(**overrides):
    config = tiny_config(**overrides)
    config.model = config_lib.model_defaults("electra")
    # One layer a tower: the run checks the objective's plumbing, not depth, and each
    # layer is compiled into the init, train and eval programs (pretraining 32 s -> 23 s).
    config.model.update(TINY, num_layers=1, generator_num_layers=1)
    config.task, config.task_feature_lengths = "embedded_en_electra", {"inputs": 32}
    config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 4, 4, 4
    config.optimizer.name, config.optimizer.learning_rate = "adamw", 1e-3
    config_lib.validate(config)
    return config


@pytest.mark.slow
def test_electra_pretrains_through_train_and_its_discriminator_fine_tunes(tmp_path):
    result = train.run(electra_config(), str(tmp_path / "pt"), quiet=True)
    records = [json.loads(line) for line in (tmp_path / "pt" / "metrics.jsonl").read_text()
               .splitlines()]
    last = [r for r in records if "discriminator_accuracy" in r][-1]
    for key in ("mlm_loss", "accuracy", "discriminator_loss", "replaced_fraction"):
        assert np.isfinite(last[key]), key
    assert 0.05 < last["replaced_fraction"] < 0.2  # 15% masked, nearly all samples differ
    assert "eval_loss" in result["eval"]

    finetune = electra_config()
    finetune.task, finetune.task_feature_lengths = "embedded_spam", {"inputs": 32}
    finetune.head.kind, finetune.init_from = "classification", str(tmp_path / "pt")
    finetune.num_train_steps, finetune.checkpoint_every_steps = 2, 2
    finetune.eval_every_steps = 0  # no held-out eval: the fine-tune's train loss is checked
    spec = with_head_labels(config_lib.spec_of(finetune))
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.training import starting_state
    # The mesh the fine-tune run below builds (all 8 devices), so its compiled init is
    # this one's, from the compilation cache.
    mesh = partitioning.make_mesh(config_lib.check_devices(spec, 8), jax.devices())
    state, _ = starting_state.pretrained_state(spec, trainer_lib.build_trainer(spec, mesh))
    assert set(state.params["backbone"]) == {"embeddings", "discriminator"}
    result = train.run(finetune, str(tmp_path / "ft"), quiet=True)
    assert np.isfinite(result["train"]["loss"])


def test_a_discriminator_without_generator_cannot_pretrain():
    config = electra_config()
    config.model.generator_d_model = 0
    with pytest.raises(errors.ConfigError, match="cannot pretrain"):
        config_lib.validate(config)


# -- Hugging Face ------------------------------------------------------------------------



def tiny_hf_pair():
    """A discriminator and a generator a third its width sharing one embedding set."""
    common = dict(vocab_size=120, embedding_size=16, max_position_embeddings=40,
                  type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        hidden_size=48, num_attention_heads=4, intermediate_size=96, num_hidden_layers=2,
        **common)).eval()
    generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=2,
        **common)).eval()
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    generator.tie_weights()
    return discriminator, generator


def batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 120, size=(3, 16))
    mask = np.arange(16)[None, :] < np.array([[16], [10], [7]])
    types_ = (np.arange(16)[None, :] >= np.array([[8], [5], [3]])).astype(int) * mask
    return np.where(mask, tokens, 0).astype(np.int32), types_.astype(np.int32), mask


def hf_logits(model, tokens, types_, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), token_type_ids=torch.tensor(types_),
                     attention_mask=torch.tensor(mask)).logits.numpy()


def relative_error(ours, theirs):
    return np.abs(ours - theirs).max() / np.abs(theirs).max()


def test_imported_electra_matches_transformers_and_exports_back(tmp_path):
    from t5x_like.convert import __main__ as convert_cli
    from t5x_like.convert import load_pretrained
    discriminator, generator = tiny_hf_pair()
    discriminator.save_pretrained(tmp_path / "disc")
    generator.save_pretrained(tmp_path / "gen")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'disc'}",
                             f"--generator_dir={tmp_path / 'gen'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    model_config, params = load_pretrained(tmp_path / "ours")
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    tokens, types_, mask = batch()
    rtd = model.apply({"params": params}, tokens, types_, method=model.discriminate)
    assert relative_error(np.asarray(rtd["rtd_logits"])[mask],
                          hf_logits(discriminator, tokens, types_, mask)[mask]) < 1e-4
    mlm = model.apply({"params": params}, tokens, types_)["mlm_logits"]
    assert relative_error(np.asarray(mlm)[mask],
                          hf_logits(generator, tokens, types_, mask)[mask]) < 1e-4

    assert convert_cli.main(["export", f"--checkpoint={tmp_path / 'ours'}",
                             f"--out={tmp_path / 'back'}"]) == 0
    reloaded = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "back").eval()
    regenerated = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "back" /
                                                                  "generator").eval()
    np.testing.assert_allclose(hf_logits(reloaded, tokens, types_, mask),
                               hf_logits(discriminator, tokens, types_, mask), atol=1e-5)
    np.testing.assert_allclose(hf_logits(regenerated, tokens, types_, mask),
                               hf_logits(generator, tokens, types_, mask), atol=1e-5)


def test_a_generator_given_as_the_discriminator_is_refused(tmp_path, capsys):
    from t5x_like.convert import __main__ as convert_cli
    _, generator = tiny_hf_pair()
    generator.save_pretrained(tmp_path / "gen")
    code = convert_cli.main(["import", f"--hf_dir={tmp_path / 'gen'}", f"--out={tmp_path / 'x'}"])
    assert code == 2
    assert "--generator_dir" in capsys.readouterr().err


def test_a_discriminator_imported_alone_fine_tunes_but_does_not_pretrain(tmp_path, capsys):
    from t5x_like.convert import __main__ as convert_cli
    from t5x_like.convert import load_pretrained
    discriminator, _ = tiny_hf_pair()
    discriminator.save_pretrained(tmp_path / "disc")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'disc'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    assert "without a generator" in capsys.readouterr().err
    model_config, params = load_pretrained(tmp_path / "ours")
    assert model_config["generator"]["d_model"] == 0 and "generator" not in params
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    tokens, types_, mask = batch()
    rtd = model.apply({"params": params}, tokens, types_)["rtd_logits"]
    assert relative_error(np.asarray(rtd)[mask],
                          hf_logits(discriminator, tokens, types_, mask)[mask]) < 1e-4


def test_bad_sampling_settings_are_named():
    config = electra_config()
    config.model.sampling_temperature = 0.0
    with pytest.raises(errors.ConfigError, match="sampling_temperature"):
        config_lib.validate(config)
    config.model.sampling_temperature = 1.0
    config.model.max_predictions_per_seq = -1
    with pytest.raises(errors.ConfigError, match="max_predictions_per_seq"):
        config_lib.validate(config)
