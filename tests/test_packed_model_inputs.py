"""The data pipeline's packed features feed every family's model and loss as they are:
a packed row scores its examples as if each had a row of its own."""

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import structure_loss

import t5x_like.data as td
from t5x_like import config_lib, models, structures

TINY = dict(vocab_size=8192, d_model=16, num_heads=2, head_dim=8, d_ff=32)
CASES = {
    # family: (task, converter, lengths, the structure whose loss it trains with)
    "encoder_decoder": ("embedded_en_span_corruption", td.EncDecFeatureConverter,
                        {"inputs": 64, "targets": 16}, "encoder_decoder"),
    "bart": ("embedded_en_bart", td.EncDecFeatureConverter, {"inputs": 32, "targets": 32},
             "encoder_decoder"),
    "decoder": ("embedded_en_prefix_lm",
                functools.partial(td.DecoderFeatureConverter, prefix_lm=True),
                {"inputs": 32, "targets": 32}, "decoder"),
    "encoder": ("embedded_en_span_mlm", td.EncoderFeatureConverter, {"inputs": 64},
                "encoder"),
}


def tiny_model(family):
    cfg = config_lib.model_defaults(family)
    cfg.update(TINY)
    if "num_layers" in cfg:
        cfg.update(num_layers=1)
    else:
        cfg.update(num_encoder_layers=1, num_decoder_layers=1)
    if "max_length" in cfg:
        cfg.update(max_length=128)
    if family == "bart":
        cfg.update(pad_id=0, eos_id=1, decoder_start_id=0)  # the embedded vocabulary's ids
    if family == "encoder":
        cfg.update(span_boundary_head=True)
    return structures.build_model(cfg)


def packed_row(task, converter, lengths):
    """Task examples made at ``lengths``, packed by the converter into rows three times as
    long (tasks fill their own lengths, so packing at those would not combine examples)."""
    it = iter(td.get_dataset(task, lengths, seed=0))
    examples = [next(it) for _ in range(8)]
    return converter(pack=True)(examples, {k: 3 * v for k, v in lengths.items()})[0]


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f == "bart" else f
                                    for f in sorted(CASES)])  # BART: ~30 s, in -m slow
def test_packed_rows_give_each_example_its_unpacked_loss(family):
    task, converter, lengths, structure = CASES[family]
    model = tiny_model(family)
    packed = packed_row(task, converter, lengths)
    assert packed.get("decoder_segment_ids", packed.get("encoder_segment_ids")).max() >= 2
    batch = {k: v[None] for k, v in packed.items()}
    inputs = models.example_inputs(model, {}, batch_size=1)
    params = nn.unbox(model.init(jax.random.key(0), *inputs)["params"])
    loss_fn = structure_loss(structure, model)
    _, packed_metrics = loss_fn(params, batch)

    # Unpack: cut each segment out into a row of its own, then average the token losses.
    segments_key = "decoder_segment_ids" if "decoder_segment_ids" in packed else "encoder_segment_ids"
    total, tokens = 0.0, 0.0
    for segment in range(1, int(packed[segments_key].max()) + 1):
        row = {}
        for key, value in packed.items():
            if key.endswith(("segment_ids", "positions")) or key == "next_sentence_labels":
                continue
            side = "decoder_segment_ids" if key.startswith("decoder") else "encoder_segment_ids"
            keep = packed.get(side, packed[segments_key]) == segment
            row[key] = np.where(keep, value, 0)[keep][None] if keep.any() else None
        row = {k: v for k, v in row.items() if v is not None}
        _, metrics = loss_fn(params, row)
        weight = float(metrics["num_target_tokens"])
        total += float(metrics.get("mlm_loss", metrics["loss"])) * weight
        tokens += weight
    assert tokens == float(packed_metrics["num_target_tokens"])
    expected = total / tokens
    got = float(packed_metrics.get("mlm_loss", packed_metrics["loss"]))
    np.testing.assert_allclose(got, expected, rtol=2e-4)
