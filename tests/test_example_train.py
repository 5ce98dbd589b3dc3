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


def test_the_straggler_work_is_matmuls_until_the_requested_time_has_passed(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a clock that advances 0.25 s each time it is read: the deadline (1 s) passes at the 4th check
    ticks = iter(range(100))
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 0.25)
    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    mm = torch.mm

    def counted_mm(a: torch.Tensor, b: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        shapes.append((tuple(a.shape), tuple(b.shape)))
        return mm(a, b, **kwargs)

    monkeypatch.setattr(torch, "mm", counted_mm)
    n = example.extra_compute(1000.0, torch.device("cpu"))
    # checks at 0.25, 0.5 and 0.75 s run 4 matmuls each; the one at 1.0 s stops
    assert n == 12 and len(shapes) == 12
    assert set(shapes) == {((128, 128), (128, 128))}
    assert next(ticks) == 5  # read once for the deadline and once per check


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
