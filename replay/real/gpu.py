"""GPU work of a real replay on a CUDA device, behind one small interface (imported only by the worker).

The worker's :class:`~skewlens.replay.real.worker.Runner` decides what is enqueued where and what waits for
what (reading the plan, which reads the execution model); a :class:`GpuQueue` only does it:

- :meth:`~GpuQueue.enqueue` puts ``dur_ns`` of GPU work on a stream and returns a token for it (on CUDA: a
  timing event, ``torch.cuda._sleep`` of the calibrated cycles, a timing event; nothing is synchronised);
- :meth:`~GpuQueue.wait` makes a stream wait for a token (``Stream.wait_event``);
- :meth:`~GpuQueue.comm_done` returns a token for a communication op's completion on the device: a blocking
  NCCL call has already made the issuing stream wait for NCCL's; an asynchronous one's ``Work.wait()`` is
  called under a stream of its own, so that nothing else waits for it;
- :meth:`~GpuQueue.sync` blocks the host until a token's work is done (``Event.synchronize``);
- :meth:`~GpuQueue.finish` waits for all of it, once, at the end; only then does :meth:`~GpuQueue.times`
  read when each token's work ran (``elapsed_time`` against one reference event recorded at the replay's
  origin by :meth:`~GpuQueue.begin`, on the worker's monotonic clock).

A stream is named by a key: an ``int`` is a recorded device stream of the rank's trace, :data:`ISSUE` the
stream communication is issued from (NCCL orders its own stream after it), anything else a stream of the
worker's own (the completion of an asynchronous op). Streams are made on first use.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any, Protocol

import torch

#: The stream communication is issued from (the device's current stream).
ISSUE = "issue"


class GpuQueue(Protocol):
    """Where a CUDA worker's GPU work goes (see the module docstring)."""

    def begin(self) -> None:
        """Record the reference event at the replay's origin (the device is idle)."""

    def enqueue(self, stream: Hashable, dur_ns: int) -> Any:
        """Enqueue ``dur_ns`` of work on ``stream``; returns its token."""

    def wait(self, stream: Hashable, token: Any) -> None:
        """Work enqueued on ``stream`` from now on waits for ``token``'s."""

    def comm_done(self, stream: Hashable, work: Any) -> Any:
        """A token for the completion of a communication op just issued: ``work`` (an asynchronous op's
        Work) waited for on ``stream``; ``None`` for a blocking call (the issuing stream waits already)."""

    def sync(self, token: Any) -> None:
        """Block the host until ``token``'s work is done."""

    def finish(self) -> None:
        """Block the host until every stream's work is done."""

    def times(self, token: Any) -> tuple[int, int]:
        """When ``token``'s work started and ended, local monotonic ns (after :meth:`finish`)."""


class CudaQueue:
    """A :class:`GpuQueue` on one CUDA device: ``torch.cuda._sleep`` for work, events for order and time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cycles_per_ns = _calibrate(device)
        self._streams: dict[Hashable, torch.cuda.Stream] = {}
        self._ref = torch.cuda.Event(enable_timing=True)
        self._ref_ns = 0

    def _stream(self, key: Hashable) -> torch.cuda.Stream:
        if key == ISSUE:
            return torch.cuda.current_stream(self.device)
        s = self._streams.get(key)
        if s is None:
            s = self._streams[key] = torch.cuda.Stream(device=self.device)
        return s

    def begin(self) -> None:
        torch.cuda.synchronize(self.device)
        before = time.perf_counter_ns()
        self._ref.record(torch.cuda.current_stream(self.device))
        self._ref.synchronize()  # on an idle device it fires when recorded: between the two readings
        self._ref_ns = (before + time.perf_counter_ns()) // 2

    def enqueue(self, stream: Hashable, dur_ns: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        s = self._stream(stream)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(s)
        cycles = int(dur_ns * self.cycles_per_ns)
        if cycles > 0:
            with torch.cuda.stream(s):
                torch.cuda._sleep(cycles)
        end.record(s)
        return start, end

    def wait(self, stream: Hashable, token: tuple[torch.cuda.Event, torch.cuda.Event]) -> None:
        self._stream(stream).wait_event(token[1])

    def comm_done(self, stream: Hashable, work: Any) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        s = self._stream(stream)
        if work is not None:
            with torch.cuda.stream(s):
                work.wait()  # NCCL: this stream waits for NCCL's (the host does not)
        done = torch.cuda.Event(enable_timing=True)
        done.record(s)
        return done, done

    def sync(self, token: tuple[torch.cuda.Event, torch.cuda.Event]) -> None:
        token[1].synchronize()

    def finish(self) -> None:
        torch.cuda.synchronize(self.device)

    def times(self, token: tuple[torch.cuda.Event, torch.cuda.Event]) -> tuple[int, int]:
        return self._at(token[0]), self._at(token[1])

    def _at(self, event: torch.cuda.Event) -> int:
        return self._ref_ns + round(float(self._ref.elapsed_time(event)) * 1e6)


def _calibrate(device: torch.device) -> float:
    """Cycles of ``torch.cuda._sleep`` per ns on ``device`` (one timed sleep after a warm-up one)."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm up
    torch.cuda.synchronize(device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    ms = float(start.elapsed_time(end))
    return cycles / max(ms * 1e6, 1.0)
