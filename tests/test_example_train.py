"""The bundled example: its knobs and its per-step timing output."""

from __future__ import annotations

import time
from types import ModuleType

import pytest
import torch
from capture_helpers import load_example


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("skl_example_train_t")


def test_the_straggler_work_is_real_matmul_compute_for_the_requested_time(example: ModuleType) -> None:
    t0 = time.perf_counter()
    n = example.extra_compute(30.0, torch.device("cpu"))
    took_ms = (time.perf_counter() - t0) * 1000
    assert n > 0
    assert took_ms >= 30.0  # deadline-bound: never shorter (an upper bound would only measure the load)


def test_knobs_parse_and_bad_step_counts_are_refused(example: ModuleType) -> None:
    args = example.parse_args(
        [
            "--steps",
            "3",
            "--straggler-rank",
            "1",
            "--straggler-ms",
            "50",
            "--slow-send-rank",
            "2",
            "--slow-send-ms",
            "20",
        ]
    )
    assert (args.steps, args.straggler_rank, args.straggler_ms, args.slow_send_rank, args.slow_send_ms) == (
        3,
        1,
        50.0,
        2,
        20.0,
    )
    with pytest.raises(SystemExit):
        example.parse_args(["--steps", "0"])


# A one-rank run with --step-times-out is exercised (under capture) by
# test_capture_run.py::test_single_process_python_run_is_captured_too.
