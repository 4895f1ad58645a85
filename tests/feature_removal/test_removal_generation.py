"""Removals of what the continuous-batching engine promises: requests admitted while
others decode, prompt pages shared, each request sampled from its own seed, the paged
cache read through each layer's own attention window, windows of steps a call, a
prefill that projects only its last positions, the TPU paged-attention kernel, and
evaluation's generations decoded by
it when asked."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import test_evaluation as evaluation_tests
import test_generation_engine as engine_tests
from removals import Removal, proving_tests

from t5x_like.evaluation import evaluator
from t5x_like.generation import engine, pages, sampling
from t5x_like.models import attention, decoding


@pytest.fixture(scope="module")
def gpt_served():
    return engine_tests.serving(engine_tests.GPT)


@pytest.fixture(scope="module")
def modern_served():
    return engine_tests.serving(engine_tests.MODERN)


def _no_sharing(monkeypatch):
    """No prompt page is ever found: every request prefills its whole prompt."""
    monkeypatch.setattr(pages.PagePool, "shared_prefix", lambda self, prompt: [])


def _static_batches(monkeypatch):
    """Requests are admitted only when every slot is free: a batch runs to its longest
    request."""
    original = engine.Engine._admit_round

    def only_when_empty(self):
        return original(self) if all(r is None for r in self._rows) else False
    monkeypatch.setattr(engine.Engine, "_admit_round", only_when_empty)


def _seeds_by_slot(monkeypatch):
    """A row samples from its slot's stream, not its request's seed."""
    original = sampling.choose

    def by_slot(logits, temperature, top_k, top_p, seeds, counters, wanted=None):
        slots = np.arange(len(temperature), dtype=np.int32)
        return original(logits, temperature, top_k, top_p, slots, counters, wanted)
    monkeypatch.setattr(sampling, "choose", by_slot)


def _window_ignored(monkeypatch):
    """The paged cache is read whole by every layer, sliding ones included."""
    original = attention.paged_bias
    monkeypatch.setattr(attention, "paged_bias", lambda positions, table, length, window=0:
                        original(positions, table, length))


def _one_step_a_call(monkeypatch):
    """Every call decodes one step: the host round trip comes back for every token."""
    monkeypatch.setattr(engine.Engine, "_window", lambda self, running: 1)


def _every_position_projected(monkeypatch):
    """The prefill projects every padded prompt position onto the vocabulary and keeps
    the last one's logits."""
    def whole(model, params, cache, tokens, positions, table, page_size, last):
        logits, cache = decoding.paged_forward(model, params, cache, tokens, positions, table,
                                               page_size)
        return jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0], cache
    monkeypatch.setattr(decoding, "paged_prefill", whole)


def _no_paged_kernel(monkeypatch):
    """A TPU decoding step gathers every row's pages, as on CPU."""
    monkeypatch.setattr(attention, "paged_kernel_fits", lambda *args: False)


def _sampler_ignored(monkeypatch):
    """The evaluator's generations ignore ``sampler``: static batches, always."""
    original = evaluator.ModelRunner.predict_rows

    def static(self, params, rows, max_decode_length, seed=None, **decode):
        asked, self.settings = self.settings, dataclasses.replace(self.settings,
                                                                  sampler="static")
        try:
            return original(self, params, rows, max_decode_length, seed, **decode)
        finally:
            self.settings = asked
    monkeypatch.setattr(evaluator.ModelRunner, "predict_rows", static)


def _check(test, fixture):
    """``(holds_in, check)``: ``test`` of test_generation_engine.py run on ``fixture``'s
    model (the suite runs it with the feature, parametrised as ``gpt2`` and ``modern``)."""
    shown = fixture.removesuffix("_served").replace("gpt", "gpt2")
    return (f"tests/test_generation_engine.py::{test.__name__}[{shown}]",
            lambda request: test(request.getfixturevalue(fixture)))


SHARING = _check(engine_tests.test_a_request_sharing_pages_decodes_as_it_does_alone,
                 "gpt_served")
CONTINUOUS = _check(engine_tests.test_a_short_request_does_not_wait_for_the_long_one_beside_it,
                    "gpt_served")
SEEDS = _check(engine_tests.test_sampling_follows_each_requests_seed_not_its_neighbours,
               "gpt_served")
CALLS = _check(engine_tests.test_greedy_tokens_are_the_static_batchs_with_slots_coming_and_going,
               "gpt_served")
PREFILL = _check(engine_tests.test_a_prefill_projects_only_each_rows_last_position, "gpt_served")
WINDOW = _check(engine_tests.test_greedy_tokens_are_the_static_batchs_with_slots_coming_and_going,
                "modern_served")

REMOVALS = [
    Removal("continuous batching", "requests are admitted only when every slot is free",
            "a short request's slot is taken by the next while a long one decodes",
            _static_batches, CONTINUOUS[1], holds_in=CONTINUOUS[0]),
    Removal("shared prompt pages", "no prompt page is found again",
            "four requests of one prompt prefill it once and read its full pages three times",
            _no_sharing, SHARING[1], holds_in=SHARING[0]),
    Removal("engine seeds per request", "a row samples from its slot's stream",
            "a seeded request samples the same tokens alone and among others",
            _seeds_by_slot, SEEDS[1], holds_in=SEEDS[0]),
    Removal("paged attention windows", "sliding layers read the whole paged cache",
            "greedy tokens of a model with sliding layers equal the static batch's",
            _window_ignored, WINDOW[1], holds_in=WINDOW[0]),
    Removal("decoding windows", "every call decodes one step",
            "a run of mixed requests takes fewer calls than half its steps",
            _one_step_a_call, CALLS[1], holds_in=CALLS[0]),
    Removal("prefill of last positions", "the prefill projects every prompt position",
            "the compiled prefill's logits are one position a row, never the rows' width",
            _every_position_projected, PREFILL[1], holds_in=PREFILL[0]),
    Removal("paged-attention kernel on TPU", "a TPU step gathers the rows' pages",
            "a TPU decoding step (the kernel interpreted on CPU) attends with the paged-"
            "attention kernel, to the gathering step's logits",
            _no_paged_kernel,
            lambda request: engine_tests.
            test_on_a_tpu_a_step_reads_its_pages_with_the_paged_attention_kernel(
                request.getfixturevalue("monkeypatch")),
            holds_in="tests/test_generation_engine.py::"
                     "test_on_a_tpu_a_step_reads_its_pages_with_the_paged_attention_kernel"),
    Removal("evaluation through the engine", "eval's generations ignore --sampler=engine",
            "eval with the engine sampler decodes every row through an engine of batch-size "
            "slots, to the static batches' predictions",
            _sampler_ignored,
            lambda request: evaluation_tests.test_the_engine_sampler_predicts_what_static_batches_predict(),
            holds_in="tests/test_evaluation.py::"
                     "test_the_engine_sampler_predicts_what_static_batches_predict"),
]

globals().update(proving_tests(REMOVALS))
