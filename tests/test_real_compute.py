"""How real replay reproduces a compute node's duration on the CPU (the worker's compute modes)."""

from __future__ import annotations

import time

import pytest
import torch

from skewlens.replay.real import ops


@pytest.mark.parametrize(
    ("cores", "ranks", "mode"),
    [(8, 2, "spin"), (4, 2, "spin"), (2, 2, "sleep"), (3, 2, "sleep"), (2, 4, "share"), (1, 2, "share")],
)
def test_auto_spins_with_two_cores_a_rank_sleeps_with_one_and_shares_with_fewer(
    monkeypatch: pytest.MonkeyPatch, cores: int, ranks: int, mode: str
) -> None:
    monkeypatch.setattr(ops, "host_cores", lambda: cores)
    assert ops.resolve_compute_mode("auto", ranks) == mode


def test_an_explicit_compute_mode_is_kept_whatever_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "host_cores", lambda: 1)
    assert [ops.resolve_compute_mode(m, 8) for m in ("spin", "sleep", "share")] == ["spin", "sleep", "share"]


def test_share_mode_spins_for_each_rank_s_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "host_cores", lambda: 2)
    assert [ops.busy_share(n) for n in (1, 2, 4, 8)] == [1.0, 1.0, 0.5, 0.25]


@pytest.mark.parametrize("mode", ["spin", "sleep", "share"])
def test_every_cpu_mode_returns_no_earlier_than_the_recorded_duration(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(ops, "host_cores", lambda: 2)
    compute = ops.Compute(mode, torch.device("cpu"), local_ranks=4)
    for dur_ns in (0, 1, 250_000, 2_500_000):
        t0 = time.perf_counter_ns()
        compute.run(dur_ns)
        assert time.perf_counter_ns() - t0 >= dur_ns


def test_share_mode_busy_loops_for_part_of_the_time_and_sleeps_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spun: list[int] = []
    slept: list[float] = []
    real_spin = ops.spin_until

    def spin(deadline_ns: int) -> None:
        spun.append(deadline_ns)
        real_spin(deadline_ns)

    monkeypatch.setattr(ops, "spin_until", spin)
    monkeypatch.setattr(ops.time, "sleep", slept.append)
    ops.shared_spin(time.perf_counter_ns() + 5 * ops.SHARE_SLICE_NS, 0.25)
    assert len(spun) >= 2  # a busy part in more than one slice
    assert slept and all(0 < s <= 0.75 * ops.SHARE_SLICE_NS / 1e9 for s in slept)
