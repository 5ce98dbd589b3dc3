"""How the real-replay worker learns that an asynchronous op completed (in-process, fake Works)."""

from __future__ import annotations

import threading
import time

import pytest

from skewlens.replay.real.ops import Completion, track


class FakeWork:
    """A Work without a future (as gloo's send and recv): ``wait()`` may be called once."""

    def __init__(self, delay_s: float = 0.0, error: str = "") -> None:
        self.waits: list[str] = []
        self.delay_s = delay_s
        self.error = error
        self._done = threading.Event()

    def get_future(self) -> None:
        raise RuntimeError("no future")

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self) -> bool:
        self.waits.append(threading.current_thread().name)
        if len(self.waits) > 1:
            raise AssertionError("waited twice (gloo would hang)")
        time.sleep(self.delay_s)
        self._done.set()
        if self.error:
            raise RuntimeError(self.error)
        return True


def test_an_op_the_issuing_thread_waits_for_is_waited_on_by_that_thread_alone() -> None:
    work, c = FakeWork(delay_s=0.01), Completion(desc="op", issued_ns=time.perf_counter_ns())
    track(work, c, ("send", "waited"), waited=True)
    assert c.work is work and not c.done() and work.waits == []  # nobody else waits on it
    before = time.perf_counter_ns()
    c.wait()
    assert work.waits == [threading.current_thread().name]
    assert c.event.is_set() and c.error == "" and c.end_ns >= before + 10_000_000
    c.wait()  # a second wait returns at once, without waiting on the Work again
    assert len(work.waits) == 1


def test_an_op_nobody_waits_for_is_recorded_by_a_waiter_thread_when_it_completes() -> None:
    work, c = FakeWork(delay_s=0.01), Completion(desc="op", issued_ns=time.perf_counter_ns())
    track(work, c, ("send", "unwaited"))
    assert c.work is None
    assert c.event.wait(5)
    assert work.waits and work.waits[0] != threading.current_thread().name
    assert c.error == "" and c.end_ns > c.issued_ns


@pytest.mark.parametrize("waited", [True, False])
def test_a_failed_op_reports_the_backends_message_either_way(waited: bool) -> None:
    work, c = FakeWork(error="connection reset by peer"), Completion(desc="op", issued_ns=0)
    track(work, c, ("recv", f"failing-{waited}"), waited=waited)
    c.wait()
    assert c.error == "connection reset by peer" and c.event.is_set() and c.done()


def test_an_op_whose_issue_returned_a_future_not_a_work_is_recorded_when_the_future_completes() -> None:
    # an asynchronous all_reduce_coalesced on gloo returns a torch Future: the worker asked it for its
    # future and failed the replay in its warm-up ("'torch._C.Future' object has no attribute 'get_future'")
    import torch

    for fut in (torch._C.Future([]), torch.futures.Future()):  # the bare one, as the call returns it
        c = Completion(desc="op", issued_ns=time.perf_counter_ns())
        track(fut, c, ("coll", "future"))
        assert not c.event.is_set()
        fut.set_result(None)
        assert c.event.wait(5) and c.error == "" and c.end_ns >= c.issued_ns


def test_an_op_left_to_the_issuing_thread_is_done_once_its_work_completed_though_nobody_waited_yet() -> None:
    # (the worker's progress report and a timeout's error count it as finished, not in flight)
    work, c = FakeWork(), Completion(desc="op", issued_ns=time.perf_counter_ns())
    track(work, c, ("send", "left to the thread"), waited=True)
    assert not c.done()
    work._done.set()
    assert c.done() and not c.event.is_set() and work.waits == []
