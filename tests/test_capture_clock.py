"""Clock offsets are estimated over the c10d store, NTP-style, and a silent peer only costs the timeout."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from skewlens.cli import main as skewlens_main
from skewlens.profiler.capture import clock
from skewlens.profiler.capture.clock import ROUNDS, estimate_offset


class RankClocks:
    """``time.time_ns`` as each rank's thread (named ``rank<r>``) reads it: from that rank's script."""

    def __init__(self, readings: dict[int, list[int]]) -> None:
        self.readings = {r: iter(v) for r, v in readings.items()}

    def time_ns(self) -> int:
        return next(self.readings[int(threading.current_thread().name.removeprefix("rank"))])


def exchange(world_size: int, store: dist.Store | None = None) -> dict[int, int | None]:
    """Every rank's :func:`estimate_offset` over one store (a new one unless given), each on a thread of its
    own."""
    store = store if store is not None else dist.HashStore()
    out: dict[int, int | None] = {}
    threads = [
        threading.Thread(
            target=lambda r=r: out.__setitem__(r, estimate_offset(store, r, world_size, timeout_s=5)),
            name=f"rank{r}",
        )
        for r in range(world_size)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)  # (a guard against a hang only)
    return out


def test_ranks_whose_clocks_stand_still_get_exactly_their_offset_to_rank_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # clocks that do not move: every round trip takes 0 ns, and rank 0's answer is its clock
    base = 1_700_000_000_000_000_000
    skew = {0: 0, 1: 2_500_000, 2: -40_000}  # what each rank's clock reads ahead of rank 0's
    reads = {r: [base + skew[r]] * (4 * ROUNDS) for r in skew}
    monkeypatch.setattr(clock, "time", RankClocks(reads))
    assert exchange(3) == {0: 0, 1: -2_500_000, 2: 40_000}


def test_the_round_with_the_shortest_round_trip_gives_the_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    rtts = [900, 700, 100, 800, 300, 600, 500, 400]  # rank 1's round trips, ns; round 2 is the shortest
    assert len(rtts) == ROUNDS
    rank1, rank0 = [], []
    for i, rtt in enumerate(rtts):
        t0 = 10_000_000 * (i + 1)
        rank1 += [t0, t0 + rtt]  # sends the ping at t0, reads the pong at t0 + rtt
        rank0.append(t0 + rtt // 2 + 5_000 + i)  # the answer implies an offset of 5000 + i ns
    monkeypatch.setattr(clock, "time", RankClocks({0: rank0, 1: rank1}))
    assert exchange(2) == {0: 0, 1: 5_000 + 2}


def _offset_over_file_store(path: str, rank: int, world_size: int, out: Any) -> None:
    """One rank's :func:`estimate_offset` over the ``FileStore`` at ``path``, put on ``out``."""
    store = dist.FileStore(path, world_size)
    out.put((rank, estimate_offset(store, rank, world_size, timeout_s=20)))


def test_ranks_of_one_clock_over_a_file_store_get_an_offset_under_a_millisecond(tmp_path: Path) -> None:
    # init_method="file://...": a FileStore looks for a key every 10 ms in its wait, and the exchange took
    # up to half that for the offset between two ranks of one host (before: 5.0 ms in a 2-rank capture)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_offset_over_file_store, args=(str(tmp_path / "store"), r, 2, out))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    offsets = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=20)
    assert offsets[0] == 0
    assert offsets[1] is not None and abs(offsets[1]) < 1_000_000, offsets


def test_without_rank_0_a_rank_gives_up_after_the_timeout() -> None:
    t0 = time.monotonic()
    assert estimate_offset(dist.HashStore(), 1, 2, timeout_s=0.3) is None
    assert time.monotonic() - t0 < 5


def test_rank_0_serves_the_ranks_that_answer_and_skips_a_dead_one() -> None:
    store = dist.HashStore()
    result: list[int | None] = []
    live = threading.Thread(target=lambda: result.append(estimate_offset(store, 2, 3, timeout_s=5)))
    live.start()
    assert estimate_offset(store, 0, 3, timeout_s=0.3) == 0  # rank 1 never shows up
    live.join(timeout=20)
    assert result and result[0] is not None


def test_no_rank_leaves_the_exchange_before_the_last_one_has_entered_it() -> None:
    # rank 0 serves every rank, so it left the exchange (and began the first recorded step) only once the
    # slowest rank had come, while rank 1, served first, began at once: on 4 gloo ranks in two pairs whose
    # second pair ran 50 ms a step behind, rank 0 was 63.9 ms late at its pair's first recorded all_reduce,
    # and analyze blamed it ("host idle/gap +63.9 ms") for the capture's own exchange
    store = dist.HashStore()
    entered: dict[int, float] = {}
    left: dict[int, float] = {}

    def rank(r: int, delay_s: float) -> None:
        time.sleep(delay_s)
        entered[r] = time.monotonic()
        estimate_offset(store, r, 3, timeout_s=5)
        left[r] = time.monotonic()

    threads = [threading.Thread(target=rank, args=(r, 0.5 if r == 2 else 0.0)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(left) == [0, 1, 2]
    assert min(left.values()) >= entered[2]


def test_every_rank_leaves_the_exchange_once_rank_0_has_served_all_not_at_its_timeout() -> None:
    # the ranks wait for rank 0's word that it is done; a word they never get (not said, or said under
    # another key) held each of them for the whole timeout, here 100 s, before the first recorded step
    store = dist.HashStore()
    left: dict[int, float] = {}
    start = time.monotonic()

    def rank(r: int) -> None:
        estimate_offset(store, r, 3, timeout_s=100)
        left[r] = time.monotonic() - start

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert sorted(left) == [0, 1, 2]
    assert max(left.values()) < 50


def _attempts(
    store: dist.Store, late: list[tuple[int, float]], world_size: int = 3
) -> tuple[dict[int, float], dict[int, float], dict[int, int | None]]:
    """One exchange on ``store`` per ``(rank, delay)`` of ``late``, one after another as torchrun's restarts
    on one agent store, each ``delay`` seconds after the one before, its ``rank`` ``delay`` seconds late
    too (the others at once): the last attempt's (entered, left, offset) per rank."""
    entered: dict[int, float] = {}
    left: dict[int, float] = {}
    offsets: dict[int, int | None] = {}

    def rank(r: int, delay_s: float) -> None:
        time.sleep(delay_s)
        entered[r] = time.monotonic()
        offsets[r] = estimate_offset(store, r, world_size, timeout_s=5)
        left[r] = time.monotonic()

    for late_rank, delay in late:
        time.sleep(delay)
        threads = [
            threading.Thread(target=rank, args=(r, delay if r == late_rank else 0.0))
            for r in range(world_size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
    return entered, left, offsets


def test_an_exchange_after_a_restart_reads_none_of_the_earlier_attempts_answers() -> None:
    # torchrun's restarts keep the agent's store (``TORCHELASTIC_USE_AGENT_STORE``: one TCPStore for every
    # attempt), so the keys of attempt 0's exchange were still there in attempt 1's: rank 1 found its pongs
    # already answered and took attempt 0's rank 0 time for an answer (a torchrun --max-restarts 1 run whose
    # rank 0 came 2 s after rank 1: rank 1's offset -20.8 s, on one host), and left before rank 0 came
    # (attempt 1, 0.5 s later (the restart): rank 0 comes 0.5 s late)
    entered, left, offsets = _attempts(dist.HashStore(), [(0, 0.0), (0, 0.5)])
    # one clock: every offset is the store's round trip at most, nowhere near the 0.5 s since attempt 0
    assert all(o is not None and abs(o) < 100_000_000 for o in offsets.values()), offsets
    assert min(left.values()) >= entered[0]


@pytest.mark.parametrize("late_rank", [1, 2])
def test_an_exchange_after_a_finished_attempt_waits_for_its_late_rank_whichever_it_is(late_rank: int) -> None:
    # attempt 0 finished its exchange; in attempt 1 one rank comes 0.5 s late. Rank 0 must not take attempt
    # 0's pings for the late rank's (it would answer them before the rank came, and the rank wait for
    # answers never given), and no rank may leave on attempt 0's word that rank 0 is done
    entered, left, offsets = _attempts(dist.HashStore(), [(0, 0.0), (late_rank, 0.5)])
    assert all(o is not None and abs(o) < 100_000_000 for o in offsets.values()), offsets
    assert min(left.values()) >= entered[late_rank]
    assert max(left.values()) - entered[late_rank] < 4  # not the 5 s timeout


def test_an_answer_left_unread_by_an_attempt_that_ended_inside_the_exchange_is_not_the_next_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # attempt 0's rank 1 died between rank 0's answer to its first ping and reading it: the answer, rank 0's
    # clock 20 s before, is still in the store when attempt 1's rank 1 pings (clocks that stand still: every
    # round trip 0 ns, so the first round's answer gives the offset)
    base = 1_700_000_000_000_000_000
    skew = {0: 0, 1: 2_500_000, 2: -40_000}
    monkeypatch.setattr(clock, "time", RankClocks({r: [base + skew[r]] * (4 * ROUNDS) for r in skew}))
    store = dist.HashStore()
    store.set(clock._key("pong", 1, 0, 0), str(base - 20 * 10**9))  # (rank 0 deleted the ping it read)
    assert exchange(3, store) == {0: 0, 1: -2_500_000, 2: 40_000}


#: Values of the clock timeout that are no time: an infinite one (a rank would wait for rank 0 for ever) and a
#: variable set to nothing are refused too.
NO_TIME = ["soon", "0", "-3", "nan", "inf", ""]


def test_skewlens_profile_gives_its_command_the_clock_timeout_set_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # docs/capture.md: "If rank 0 does not answer within SKEWLENS_CLOCK_TIMEOUT_S, the offset is 0"; under
    # skewlens profile the ranks read 10 s whatever it was set to (SKEWLENS_CLOCK_TIMEOUT_S=45: '10.0')
    monkeypatch.setenv("SKEWLENS_CLOCK_TIMEOUT_S", "45")
    show = "import os; print('timeout', os.environ['SKEWLENS_CLOCK_TIMEOUT_S'])"
    out = str(tmp_path / "run")
    skewlens_main(["profile", "--out", out, "--level", "ops", "--", sys.executable, "-c", show])
    assert "timeout 45.0" in capfd.readouterr().out.splitlines()


@pytest.mark.parametrize("value", NO_TIME)
def test_skewlens_profile_refuses_a_clock_timeout_that_is_no_time_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    monkeypatch.setenv("SKEWLENS_CLOCK_TIMEOUT_S", value)
    assert skewlens_main(["profile", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert f"SKEWLENS_CLOCK_TIMEOUT_S='{value}': not a number of seconds above 0" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", NO_TIME)
def test_skewlens_profile_refuses_a_clock_timeout_option_that_is_no_time_as_it_refuses_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # the (hidden) option was a bare float: 'nan' was handed to every rank, which then refused to capture
    argv = [
        "profile",
        "--out",
        str(tmp_path / "run"),
        "--clock-timeout",
        value,
        "--",
        sys.executable,
        "-c",
        "pass",
    ]
    assert skewlens_main(argv) == 2
    err = capsys.readouterr().err
    assert f"--clock-timeout {value}: not a number of seconds above 0" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", NO_TIME)
def test_a_rank_started_with_a_clock_timeout_that_is_no_time_refuses_it_as_skewlens_profile_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # the variable had two readers: skewlens profile refused these, while a rank's autostart took 0, -3 and
    # nan as its wait and failed on 'soon' with float's "could not convert string to float: 'soon'"
    from skewlens.profiler.capture import autostart, session
    from skewlens.profiler.errors import CaptureError

    made: list[float] = []

    class Session:
        def __init__(self, run_dir: str, *, clock_timeout_s: float, **_: object) -> None:
            made.append(clock_timeout_s)

        def install(self) -> Session:
            return self

    monkeypatch.setattr(session, "CaptureSession", Session)
    monkeypatch.setattr(autostart, "_session", None)
    monkeypatch.setenv(autostart.ENV_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(autostart.ENV_CLOCK_TIMEOUT, value)
    with pytest.raises(CaptureError) as e:
        autostart.start_from_env()
    assert str(e.value) == f"SKEWLENS_CLOCK_TIMEOUT_S='{value}': not a number of seconds above 0"
    assert autostart.profiled() is None and made == []
    # a time is taken as it is, and none set is the default
    monkeypatch.setenv(autostart.ENV_CLOCK_TIMEOUT, "2.5")
    autostart.start_from_env()
    monkeypatch.setattr(autostart, "_session", None)
    monkeypatch.delenv(autostart.ENV_CLOCK_TIMEOUT)
    autostart.start_from_env()
    assert made == [2.5, autostart.CLOCK_TIMEOUT_DEFAULT_S]
