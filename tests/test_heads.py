"""Fine-tuning heads on encoder and decoder backbones, and their losses."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import config_lib, objectives
from t5x_like.models import decoder, encoder, heads


def bert():
    return encoder.EncoderOnly(config_lib.model_spec_of(dict(vocab_size=50, d_model=16, num_heads=2,
                                                     head_dim=8, d_ff=32, num_layers=1,
                                                     max_length=16, family="encoder")))


def gpt():
    return decoder.DecoderOnly(config_lib.model_spec_of(dict(vocab_size=50, d_model=16, num_heads=2,
                                                     head_dim=8, d_ff=32, num_layers=1,
                                                     max_length=16, family="decoder")))


def padded_tokens():
    tokens = np.random.default_rng(0).integers(5, 50, size=(3, 10)).astype(np.int32)
    tokens[1, 6:] = 0
    tokens[2, 3:] = 0
    return jnp.asarray(tokens)


def init(model, tokens):
    return nn.unbox(model.init(jax.random.key(0), tokens)["params"])


@pytest.mark.parametrize("backbone", [bert, gpt])
@pytest.mark.parametrize("kind,shape", [("classification", (3, 4)),
                                        ("token_classification", (3, 10, 4))])
def test_head_output_shapes(backbone, kind, shape):
    model = heads.WithHead(backbone(), heads.HeadConfig(kind=kind, num_labels=4,
                                                        pooling="last"))
    tokens = padded_tokens()
    params = init(model, tokens)
    assert set(params) == {"backbone", "head"}
    assert model.apply({"params": params}, tokens).shape == shape


def test_last_pooling_reads_the_last_real_token_of_a_decoder():
    backbone = gpt()
    model = heads.WithHead(backbone, heads.HeadConfig(num_labels=3, pooling="last"))
    tokens = padded_tokens()
    params = init(model, tokens)
    hidden = backbone.apply({"params": params["backbone"]}, tokens, return_hidden=True)
    last = hidden[jnp.arange(3), jnp.array([9, 5, 2])]
    expected = last @ params["head"]["kernel"] + params["head"]["bias"]
    np.testing.assert_allclose(model.apply({"params": params}, tokens), expected, atol=1e-5)


def test_cls_pooling_uses_the_pretrained_pooler_and_mean_pooling_ignores_padding():
    tokens = padded_tokens()
    cls_model = heads.WithHead(bert(), heads.HeadConfig(num_labels=2, pooling="cls"))
    params = init(cls_model, tokens)
    assert "pooler" in params["backbone"]
    mean_model = heads.WithHead(bert(), heads.HeadConfig(num_labels=2, pooling="mean"))
    changed_padding = tokens.at[2, 3:].set(7)  # not padding anymore: the mean must change
    a = mean_model.apply({"params": params}, tokens)[2]
    b = mean_model.apply({"params": params}, changed_padding)[2]
    assert not np.allclose(a, b)


def test_span_extraction_masks_padding_and_its_loss_trains():
    model = heads.WithHead(bert(), heads.HeadConfig(kind="span_extraction", dropout_rate=0.0))
    tokens = padded_tokens()
    params = init(model, tokens)
    out = model.apply({"params": params}, tokens)
    assert out["start_logits"].shape == (3, 10)
    assert float(out["end_logits"][2, 5]) < -1e9  # a padded position
    batch = {"input_tokens": tokens, "start_positions": jnp.array([1, 2, 0]),
             "end_positions": jnp.array([3, 4, 2])}
    loss, grads = jax.value_and_grad(
        lambda p: objectives.span_extraction_loss(model.apply({"params": p}, tokens), batch,
                                                  jnp.ones(3))[0])(
        params)
    assert abs(float(loss) - np.log([10, 6, 3]).mean()) < 0.5  # near uniform at init
    assert float(jnp.abs(grads["head"]["kernel"]).sum()) > 0


def test_classification_regression_and_tagging_losses():
    tokens = padded_tokens()
    cls = heads.WithHead(bert(), heads.HeadConfig(num_labels=3, dropout_rate=0.0))
    params = init(cls, tokens)
    logits = cls.apply({"params": params}, tokens)
    batch = {"input_tokens": tokens, "labels": jnp.array([0, 1, 2])}
    loss, metrics = objectives.classification_loss(logits, batch, jnp.ones(3))
    expected = -jax.nn.log_softmax(logits)[jnp.arange(3), jnp.array([0, 1, 2])].mean()
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    # A row weighed 0 (evaluation's padding) is left out of the mean.
    loss, _ = objectives.classification_loss(logits, batch, jnp.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(
        loss, -jax.nn.log_softmax(logits)[jnp.arange(2), jnp.array([0, 1])].mean(), rtol=1e-6)

    reg = heads.WithHead(bert(), heads.HeadConfig(num_labels=1, dropout_rate=0.0))
    reg_params = init(reg, tokens)
    labels = jnp.array([0.5, 2.0, -1.0])
    outputs = reg.apply({"params": reg_params}, tokens)
    loss, _ = objectives.regression_loss(outputs, {"input_tokens": tokens, "labels": labels},
                                         jnp.ones(3))
    predictions = outputs[:, 0]
    np.testing.assert_allclose(loss, jnp.mean((predictions - labels) ** 2), rtol=1e-6)

    tagger = heads.WithHead(bert(), heads.HeadConfig(kind="token_classification", num_labels=5))
    tag_params = init(tagger, tokens)
    weights = (tokens > 0).astype(jnp.float32)
    batch = {"input_tokens": tokens, "labels": jnp.zeros_like(tokens), "label_weights": weights}
    tags = tagger.apply({"params": tag_params}, tokens)
    loss, _ = objectives.token_classification_loss(tags, batch)
    changed = dict(batch, labels=jnp.where(weights > 0, 0, 4))  # only weightless labels change
    np.testing.assert_allclose(loss, objectives.token_classification_loss(tags, changed)[0],
                               rtol=1e-6)


def test_bad_head_settings_are_named():
    with pytest.raises(ValueError, match="Unknown head kind 'qa'"):
        heads.HeadConfig(kind="qa")
    with pytest.raises(ValueError, match="Unknown pooling 'max'"):
        heads.HeadConfig(pooling="max")
    from t5x_like.models import t5

    spec = config_lib.model_spec_of(dict(vocab_size=50, d_model=16, num_heads=2, head_dim=8,
                                         d_ff=32, family="encoder_decoder"))
    model = heads.WithHead(t5.EncoderDecoder(spec), heads.HeadConfig())
    with pytest.raises(TypeError, match="fine-tune encoder-decoders text-to-text"):
        model.init(jax.random.key(0), padded_tokens())
