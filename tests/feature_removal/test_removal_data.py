"""Removals of the input pipeline's features: exact resume of the streams, packing and the
segment masks that keep packed examples apart, Parquet's row-group windows, and
temperature sampling of mixtures."""

import json

import numpy as np
from removals import Removal, existing, proving_tests
from test_parquet_source import corpus  # noqa: F401  (the fixture the windows check reads)

import t5x_like.data as td
from t5x_like.data import feature_converters, parquet, pipeline, sources
from t5x_like.data.streams import HostBatchIterator
from t5x_like.models import attention


def _batches(iterator, count):
    return [next(iterator) for _ in range(count)]


def streams_resume_exactly(request):
    """A packed LM stream and a packed span-corruption stream stopped after 3 batches and
    restored from their JSON state give the batches an uninterrupted stream gives."""
    cases = [("embedded_en_lm", {"targets": 32}, lambda: td.DecoderFeatureConverter(pack=True)),
             ("embedded_en_span_corruption", {"inputs": 32, "targets": 8},
              lambda: td.EncDecFeatureConverter(pack=True, num_packing_bins=4))]
    for name, lengths, converter in cases:
        def iterator(name=name, lengths=lengths, converter=converter):
            return pipeline.HostBatchIterator(
                td.get_dataset(name, lengths, feature_converter=converter(), seed=7), 4)
        straight = _batches(iterator(), 6)
        interrupted = iterator()
        _batches(interrupted, 3)
        state = json.loads(json.dumps(interrupted.get_state()))  # as the checkpoint keeps it
        resumed = iterator()
        resumed.set_state(state)
        for a, b in zip(straight[3:], _batches(resumed, 3), strict=True):
            assert all(np.array_equal(a[k], b[k]) for k in a), name


def _state_not_restored(monkeypatch):
    """A restored iterator takes the step but starts its streams over."""
    monkeypatch.setattr(HostBatchIterator, "set_state",
                        lambda self, state: setattr(self, "step", int(state["step"])))


def packed_rows_are_full(request):
    """400 examples of 5 to 120 tokens packed into rows of 128: one bin fills rows as
    seqio's greedy packing (written out in ``test_feature_converters``), 64 best-fit bins
    over 0.85, with several examples a row."""
    from test_feature_converters import greedy_fill_ratio
    sizes = np.random.default_rng(0).integers(5, 120, size=400).tolist()
    examples = [{"targets": np.full(n, 7)} for n in sizes]

    def fill(bins):
        rows = td.DecoderFeatureConverter(pack=True, num_packing_bins=bins)(
            examples, {"targets": 128})
        return sum(int((r["decoder_loss_weights"] > 0).sum()) for r in rows) / (
            len(rows) * 128), len(rows)
    greedy, (best, rows) = greedy_fill_ratio(sizes, 128), fill(64)
    assert abs(fill(1)[0] - greedy) < 1e-9, (fill(1)[0], greedy)
    assert best > 0.85 and len(sizes) / rows > 1.5, (best, rows)  # 1.76 examples a row


def _no_packing(monkeypatch):
    """``pack=True`` converters emit one example a row."""
    original = feature_converters.FeatureConverter.apply

    def apply(self, ds, task_feature_lengths):
        pack, self.pack = self.pack, False
        try:
            return original(self, ds, task_feature_lengths)
        finally:
            self.pack = pack
    monkeypatch.setattr(feature_converters.FeatureConverter, "apply", apply)


def _segments_ignored(monkeypatch):
    """Attention lets every real token see every other of its row, whatever its segment."""
    monkeypatch.setattr(attention, "same_segment", lambda q, k: (q[..., :, None] > 0)
                        & (k[..., None, :] > 0))


def _parquet_read_row_by_row(monkeypatch):
    """Training reads Parquet rows by a global random index, as other sources are."""
    monkeypatch.setattr(parquet.ParquetRows, "windowed", False)
    monkeypatch.setattr(sources.Strided, "windowed", property(lambda self: False))


def _temperature_ignored(monkeypatch):
    """Every registered temperature-sampled mixture samples its tasks by size (alpha 1)."""
    for mixture in map(td.MixtureRegistry.get, td.MixtureRegistry.names()):
        for _, rate in mixture.components:
            free = getattr(getattr(rate, "__code__", None), "co_freevars", ())
            if "alpha" in free and rate.__qualname__.startswith("temperature_rates"):
                cell = rate.__closure__[free.index("alpha")]
                monkeypatch.setattr(cell, "cell_contents", 1.0)


SEGMENTS = existing("test_model_features.py::test_packed_rows_give_the_logits_of_separate_rows")
WINDOWS = existing(
    "test_parquet_source.py::test_a_shuffled_stream_reads_row_groups_whole_and_every_row_once",
    streams=2)
TEMPERATURE = existing(
    "test_tfds_tasks.py::test_mc4_samples_languages_by_the_temperature_formula")

REMOVALS = [
    Removal("exact resume of the input streams", "`set_state` restores the step and starts the "
            "streams over", "packed LM and span-corruption streams stopped at 3 batches and "
            "restored from JSON give the uninterrupted batches", _state_not_restored,
            streams_resume_exactly),
    Removal("packing", "`pack=True` converters emit one example a row",
            "400 examples of 5-120 tokens fill rows of 128 as seqio's greedy packing does, "
            "best fit over 64 bins fuller",
            _no_packing, packed_rows_are_full),
    Removal("segment masks of packed rows", "attention ignores segment ids",
            "a packed row's logits equal each example's alone", _segments_ignored, SEGMENTS[1],
            holds_in=SEGMENTS[0]),
    Removal("Parquet row-group windows", "training reads rows by a global random index",
            "a shuffled stream reads each row group at most once per epoch",
            _parquet_read_row_by_row, WINDOWS[1], holds_in=WINDOWS[0]),
    Removal("temperature sampling of mixtures", "the temperature alpha read as 1",
            "mC4's rates equal p^0.3 / sum p^0.3 written out", _temperature_ignored,
            TEMPERATURE[1], holds_in=TEMPERATURE[0]),
]

globals().update(proving_tests(REMOVALS))
