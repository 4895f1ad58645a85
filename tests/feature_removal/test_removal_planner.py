"""Removals in the planner: what it reads from a compiled program, checked on a program
compiled here (a scanned model's FLOPs against the same model unrolled), and what its
predicted step time plays of a schedule (hand-written programs of known times)."""

import test_step_time as step_time_tests
from removals import Removal, proving_tests
from test_quantization import decoder

from t5x_like.planner import aot_planner, hlo_matmuls, step_time


def _planned_flops(scan_layers: bool) -> float:
    """The planner's compiled FLOPs per device for a 4-layer decoder on one CPU device."""
    config = decoder(**{"model.num_layers": 4, "model.vocab_size": 512,
                        "model.scan_layers": scan_layers, "task_feature_lengths": {"targets": 64}})
    return aot_planner.plan(config, "cpu:1")["compiled_flops_per_device"]


def scanned_layers_count_every_trip(request):
    """XLA's cost analysis counts a scanned loop body once (a quarter of 4 layers' work);
    the planner counts each matmul per trip, landing within a few percent of the unrolled
    program's count (elementwise work stays counted once)."""
    ratio = _planned_flops(True) / _planned_flops(False)
    assert 0.93 < ratio <= 1.0, ratio


def _matmuls_counted_once(monkeypatch):
    counted = hlo_matmuls.matmul_flops
    monkeypatch.setattr(hlo_matmuls, "matmul_flops", lambda text: (counted(text)[1],) * 2)


def _every_collective_waited_for(monkeypatch):
    """Asynchronous collectives are played as synchronous ones."""
    monkeypatch.setattr(step_time._Schedule, "_starts", lambda self, instruction: False)


def _matrix_units_always_full(monkeypatch):
    """Every matmul keeps the whole matrix unit busy, whatever its shapes."""
    monkeypatch.setattr(hlo_matmuls, "_fill", lambda matmul, instructions, width: 1.0)


REMOVALS = [
    Removal("scanned layers' FLOPs per trip", "the planner counts each loop body's matmuls once",
            "a scanned 4-layer decoder's compiled FLOPs within 7% of the same model unrolled",
            _matmuls_counted_once, scanned_layers_count_every_trip),
    Removal("overlapped collectives in the predicted step",
            "asynchronous collectives are played as synchronous",
            "a gather started before a matmul and done after it costs nothing when shorter",
            _every_collective_waited_for,
            lambda request: step_time_tests.
            test_an_asynchronous_gather_hides_behind_the_matmul_scheduled_beside_it(),
            holds_in="tests/test_step_time.py::"
                     "test_an_asynchronous_gather_hides_behind_the_matmul_scheduled_beside_it"),
    Removal("matrix-unit fill in the predicted step", "every matmul fills the matrix unit",
            "a matmul contracting 64 on 128-wide units takes twice its FLOPs' time",
            _matrix_units_always_full,
            lambda request: step_time_tests.
            test_a_matmul_that_underfills_the_matrix_unit_takes_its_padded_time(),
            holds_in="tests/test_step_time.py::"
                     "test_a_matmul_that_underfills_the_matrix_unit_takes_its_padded_time"),
]

globals().update(proving_tests(REMOVALS))
