"""Clock offsets are estimated over the c10d store, NTP-style, and a silent peer only costs the timeout."""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from skewlens.profiler.capture.clock import estimate_offset


def test_ranks_sharing_a_clock_get_an_offset_near_zero() -> None:
    store = dist.HashStore()
    out: dict[int, int | None] = {}
    threads = [
        threading.Thread(target=lambda r=r: out.__setitem__(r, estimate_offset(store, r, 3, timeout_s=5)))
        for r in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert out[0] == 0
    assert out[1] is not None and abs(out[1]) < 2_000_000
    assert out[2] is not None and abs(out[2]) < 2_000_000


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
