"""Synthetic multi-rank GPU runs written as Kineto (torch.profiler Chrome-JSON) files, with a known answer.

    spec = GpuRunSpec(world_size=32, steps=5, layers=8, slow_ranks={5: 1.3}, seed=0)
    truth = write_gpu_run(spec, out_dir)        # out_dir/rank{r}_kineto.json.gz, one per rank
    base = simulate_gpu_run(spec.without_slow_ranks())
    extra_ns = truth.total_ns - base.total_ns   # what rank 5's slowness costs the run

The generator simulates a DDP-like data-parallel step on every rank with exact integer-ns rules and
writes what torch.profiler would have recorded; the returned :class:`GpuRunTruth` is that schedule.
Nothing here imports replay or analysis: the answer is computed here, independently of them.

Schedule (all ranks on one aligned clock; ``spec`` names the durations):

- Host, one thread per rank. Step ``k`` starts at the previous step's ``cudaStreamSynchronize`` return
  plus ``step_gap_ns`` plus a seeded per-(rank, step) delay in ``[0, start_skew_ns]`` (step 0: at
  ``RUN_START_NS`` plus that delay). Host calls follow each other ``host_gap_ns`` apart; the host never
  waits for the device except in that synchronisation.
- Forward: ``layers`` layer ops (``cpu_op`` of ``op_cpu_ns``), each launching one kernel on the compute
  stream (``cudaLaunchKernel`` of ``launch_ns``, centred in the op). Backward: the layers in reverse;
  after every ``bucket_layers`` layers (and after the last one) the bucket's gradients are all-reduced:
  ``c10d::allreduce_`` > ``record_param_comms`` > ``nccl:all_reduce`` > ``cudaEventRecord`` (compute
  stream), ``cudaStreamWaitEvent`` (NCCL stream waits for it), ``cudaLaunchKernel`` (NCCL kernel). After
  the backward: ``cudaEventRecord`` on the NCCL stream and ``cudaStreamWaitEvent`` of the compute
  stream. Then ``optimizer_kernels`` optimizer ops, then ``aten::item`` (``cudaMemcpyAsync`` DtoH of
  ``memcpy_ns`` on the compute stream, then ``cudaStreamSynchronize`` of the compute stream).
- Device: an activity starts at ``max(launch call start + launch_latency_ns, its stream free)``; a
  stream's wait for an event makes the stream free no earlier than the event; an event fires when the
  work issued before it on its stream is done (or at its record call, on an idle stream). Compute
  kernels last ``forward_kernel_ns`` / ``backward_kernel_ns`` / ``optimizer_kernel_ns`` times
  ``1 + kernel_jitter * u`` (``u`` seeded, uniform in [-1, 1]), times the rank's ``slow_ranks`` factor.
- NCCL all_reduce: each rank's kernel starts by the rule above; the transfer begins when every rank's
  kernel has started (the last member's start) and every member's kernel ends
  :meth:`GpuRunSpec.transfer_ns` later.
- ``cudaStreamSynchronize`` returns ``sync_return_ns`` after ``max(call start, compute stream done)``.

Truth: a rank's step ``k`` ends on the device when its last activity of step ``k`` ends (the DtoH copy);
the run's step ``k`` ends at the latest of those over the ranks; ``step_period_ns[k]`` is that end minus
step ``k-1``'s (for ``k = 0``: minus the run start, the first step's earliest ``ProfilerStep`` start).
The jitter and delays are drawn per rank in a fixed order, so a spec differing only in ``slow_ranks``
(or ``sync_events``) draws the same numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import random
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: File name of a rank's trace (``.gz`` appended when compressed), torch.profiler style.
RANK_FILE = "rank{rank}_kineto.json"
#: Stream of the compute kernels (the default stream's number in real traces).
COMPUTE_STREAM = 7
#: Stream of the NCCL kernels.
NCCL_STREAM = 20
#: Where the run starts on the aligned clock, ns after ``base_time_ns`` (keeps every ``ts`` positive).
RUN_START_NS = 1_000_000
#: Process group every collective runs on (the default group, as PyTorch names it).
PG_NAME = "0"

NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
MEMCPY_NAME = "Memcpy DtoH (Device -> Pageable)"
#: (forward op, forward kernel, backward op, backward kernel), cycled over the layers.
LAYER_KINDS = (
    (
        "aten::addmm",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas",
        "aten::mm",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_cublas",
    ),
    ("aten::mm", "ampere_sgemm_128x64_nn", "aten::mm", "ampere_sgemm_128x64_nt"),
)
OPTIMIZER_OP = "aten::_foreach_add_"
OPTIMIZER_KERNEL = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, "
    "2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, "
    "at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)"
)
#: CUPTI callback ids of the runtime calls written (as real files carry them in ``args.cbid``).
CBID = {
    "cudaLaunchKernel": 211,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
    "cudaMemcpyAsync": 41,
    "cudaStreamSynchronize": 131,
}
_DEVICE_PROPERTIES = {
    "name": "NVIDIA H100 80GB HBM3",
    "totalGlobalMem": 85029158912,
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": 132,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
}
_HOST_PID0 = 41_000  # host process id of rank 0; rank r is _HOST_PID0 + r


_AT_LEAST_ONE = (
    "world_size", "steps", "layers", "bucket_layers", "gpus_per_node", "forward_kernel_ns",
    "backward_kernel_ns", "optimizer_kernel_ns", "memcpy_ns", "op_cpu_ns", "launch_ns", "runtime_call_ns",
    "sync_return_ns",
)  # fmt: skip
_NON_NEGATIVE = (
    "optimizer_kernels", "nccl_latency_ns", "launch_latency_ns", "host_gap_ns", "step_gap_ns",
    "start_skew_ns", "first_step", "base_time_ns",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuRunSpec:
    """What to generate: the job's shape, the durations of the schedule's steps, who is slow."""

    world_size: int = 8
    """Ranks (one GPU each), all in one process group."""
    steps: int = 3
    """Profiled training steps."""
    layers: int = 8
    """Layers of the model: one forward and one backward kernel each."""
    bucket_layers: int = 2
    """Layers per gradient bucket: one all_reduce per bucket in backward (the last one may be smaller)."""
    slow_ranks: Mapping[int, float] = field(default_factory=dict)
    """Rank -> factor (> 0) its compute kernels' durations are multiplied by."""
    device_properties: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Rank -> ``deviceProperties`` keys its file's GPUs have instead of an H100's (a rank on an A100 host:
    ``{"name": "NVIDIA A100-SXM4-80GB", "numSms": 108}``); timing is ``slow_ranks``' alone."""
    sync_events: bool = True
    """Also write the ``cuda_sync`` events (``enable_cuda_sync_events``): Stream Wait Event, Stream Sync."""
    seed: int = 0
    """Seed of the kernel jitter and the step-start delays."""
    first_step: int = 0
    """Number of the first ``ProfilerStep#N``."""
    gpus_per_node: int = 8
    """GPUs per host: rank r uses device ``r % gpus_per_node``."""
    forward_kernel_ns: int = 400_000
    """Mean forward kernel duration of a layer."""
    backward_kernel_ns: int = 800_000
    """Mean backward kernel duration of a layer."""
    optimizer_kernels: int = 2
    """Optimizer ops (one kernel each) per step."""
    optimizer_kernel_ns: int = 150_000
    """Mean optimizer kernel duration."""
    kernel_jitter: float = 0.03
    """Relative jitter of every compute kernel's duration (uniform in +-this fraction)."""
    layer_param_bytes: int = 8 << 20
    """Gradient bytes of one layer (float32)."""
    bus_bandwidth_gbps: float = 100.0
    """All_reduce bus bandwidth, GB/s (= bytes per ns)."""
    nccl_latency_ns: int = 20_000
    """Fixed part of an all_reduce's transfer time."""
    memcpy_ns: int = 2_000
    """Duration of the loss's DtoH copy."""
    op_cpu_ns: int = 20_000
    """Host time of one layer or optimizer op (its launch included)."""
    launch_ns: int = 6_000
    """Host time of one ``cudaLaunchKernel`` / ``cudaMemcpyAsync`` call."""
    runtime_call_ns: int = 3_000
    """Host time of one ``cudaEventRecord`` / ``cudaStreamWaitEvent`` call."""
    launch_latency_ns: int = 4_000
    """Earliest start of a device activity after its launch call began."""
    host_gap_ns: int = 1_000
    """Host time between consecutive calls and around nested ops."""
    sync_return_ns: int = 2_000
    """Host time for ``cudaStreamSynchronize`` to return once the stream is done."""
    step_gap_ns: int = 200_000
    """Host time between a step's synchronisation and the next step's start (data loading)."""
    start_skew_ns: int = 50_000
    """Largest seeded extra delay of a rank's step start."""
    base_time_ns: int = 1_700_000_000_000_000_000
    """``baseTimeNanoseconds`` of every file; ``ts`` are µs after it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "slow_ranks", dict(self.slow_ranks))  # the caller's dict may change
        object.__setattr__(self, "device_properties", {r: dict(p) for r, p in self.device_properties.items()})
        for names, least in ((_AT_LEAST_ONE, 1), (_NON_NEGATIVE, 0)):
            for name in names:
                if getattr(self, name) < least:
                    raise ValueError(f"GpuRunSpec.{name} must be >= {least}, got {getattr(self, name)}")
        if self.layer_param_bytes < 4 or self.layer_param_bytes % 4:
            raise ValueError(
                f"GpuRunSpec.layer_param_bytes must be a positive multiple of 4 (float32), "
                f"got {self.layer_param_bytes}"
            )
        if self.op_cpu_ns < self.launch_ns:
            raise ValueError(
                f"GpuRunSpec.op_cpu_ns ({self.op_cpu_ns}) must be >= launch_ns ({self.launch_ns}): "
                "an op contains its launch"
            )
        if not 0 <= self.kernel_jitter < 1:
            raise ValueError(f"GpuRunSpec.kernel_jitter must be in [0, 1), got {self.kernel_jitter}")
        if not (math.isfinite(self.bus_bandwidth_gbps) and self.bus_bandwidth_gbps > 0):
            raise ValueError(f"GpuRunSpec.bus_bandwidth_gbps must be > 0, got {self.bus_bandwidth_gbps}")
        for r, f in self.slow_ranks.items():
            if not 0 <= r < self.world_size:
                raise ValueError(f"GpuRunSpec.slow_ranks: rank {r} is outside world_size {self.world_size}")
            if not (math.isfinite(f) and f > 0):
                raise ValueError(f"GpuRunSpec.slow_ranks: rank {r}'s factor must be > 0, got {f}")
        for r in self.device_properties:
            if not 0 <= r < self.world_size:
                raise ValueError(
                    f"GpuRunSpec.device_properties: rank {r} is outside world_size {self.world_size}"
                )

    @property
    def buckets(self) -> int:
        """All_reduces per step."""
        return -(-self.layers // self.bucket_layers)

    def bucket_bytes(self, bucket: int) -> int:
        """Gradient bytes of backward bucket ``bucket`` (0 = the first all-reduced, the last layers)."""
        n_layers = min(self.bucket_layers, self.layers - bucket * self.bucket_layers)
        return n_layers * self.layer_param_bytes

    def transfer_ns(self, size_bytes: int) -> int:
        """A ring all_reduce's time from the last member's start: latency + 2(n-1)/n x bytes / bandwidth."""
        n = self.world_size
        return self.nccl_latency_ns + math.ceil(2 * (n - 1) * size_bytes / (n * self.bus_bandwidth_gbps))

    def without_slow_ranks(self) -> GpuRunSpec:
        """The same run (same seed, same draws) with every rank at normal speed: the blame baseline."""
        return dataclasses.replace(self, slow_ranks={})


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveTruth:
    """One all_reduce instance as the schedule ran it."""

    step: int
    """Step index (0-based, not the ``ProfilerStep`` number)."""
    bucket: int
    """Bucket within the step's backward."""
    seq: int
    """Sequence number on the process group (0-based, counted over the run)."""
    size_bytes: int
    """Bytes each rank reduces."""
    start_ns: tuple[int, ...]
    """Each rank's kernel start, by rank."""
    transfer_start_ns: int
    """When the transfer began: the last member's kernel start."""
    end_ns: int
    """When every member's kernel ended."""
    last_rank: int
    """The member whose kernel started last (lowest rank on a tie)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuRunTruth:
    """The schedule a run was generated from (ns on the aligned clock, as the importer reads them)."""

    spec: GpuRunSpec
    """What was generated."""
    run_start_ns: int
    """Earliest ``ProfilerStep`` start of the first step."""
    step_end_ns: tuple[int, ...]
    """Per step: the latest end of any rank's device activity of that step."""
    step_period_ns: tuple[int, ...]
    """Per step: ``step_end_ns[k]`` minus the previous step's end (the run start for step 0)."""
    rank_step_end_ns: tuple[tuple[int, ...], ...]
    """``[rank][step]``: that rank's last device activity end of that step."""
    collectives: tuple[CollectiveTruth, ...]
    """Every all_reduce, in issue order."""
    files: tuple[Path, ...] = ()
    """The files written, by rank (empty from :func:`simulate_gpu_run`)."""

    @property
    def total_ns(self) -> int:
        """The sum of the step periods: from the run start to the last step's end."""
        return sum(self.step_period_ns)


@dataclass(slots=True)
class _Event:
    """One Kineto complete event under construction (times in ns after ``base_time_ns``)."""

    name: str
    cat: str
    pid: int
    tid: int
    start_ns: int
    dur_ns: int
    args: dict[str, Any]
    flow: str = ""
    """``s``: this event starts the ``ac2g`` flow of its correlation; ``f``: it ends it."""


@dataclass(slots=True)
class _DevOp:
    """One entry of a rank's device program, in host issue order."""

    kind: str
    """``work`` (kernel/memcpy), ``record`` (event record) or ``wait`` (stream waits for an event)."""
    stream: int
    earliest_ns: int
    """Work: launch call start + launch latency; record: the record call's start."""
    dur_ns: int = 0
    event: int = -1
    """Record: the event recorded; wait: the event waited for."""
    comm: int = -1
    """Index of the collective instance this NCCL kernel belongs to (-1: none)."""
    out: _Event | None = None
    """The device event whose times the simulation fills in."""


@dataclass(slots=True)
class _Rank:
    """One rank's state across steps."""

    rank: int
    device: int
    rng: random.Random
    factor: float
    host: list[_Event] = field(default_factory=list)
    dev: list[_Event] = field(default_factory=list)
    prog: list[_DevOp] = field(default_factory=list)
    stream_free: dict[int, int] = field(default_factory=dict)
    event_ns: dict[int, int] = field(default_factory=dict)
    next_corr: int = 1_000
    next_ext: int = 1
    next_cuda_event: int = 1

    @property
    def pid(self) -> int:
        return _HOST_PID0 + self.rank


class _Step:
    """Writes one rank's host events of one step and its device program (the host side's rules)."""

    def __init__(self, spec: GpuRunSpec, st: _Rank, step: int, start_ns: int, seq0: int) -> None:
        self.spec, self.st, self.step, self.t, self.seq0 = spec, st, step, start_ns, seq0
        self.ext_stack: list[int] = []
        self.prof: _Event | None = None

    @property
    def end_ns(self) -> int:
        """End of the step's ``ProfilerStep`` span (once :meth:`run` finished)."""
        assert self.prof is not None
        return self.prof.start_ns + self.prof.dur_ns

    def _open(self, name: str, cat: str, args: dict[str, Any] | None = None) -> _Event:
        st = self.st
        ext = st.next_ext
        st.next_ext += 1
        a: dict[str, Any] = {"External id": ext, "Record function id": ext, "Ev Idx": ext - 1}
        a.update(args or {})
        ev = _Event(name, cat, st.pid, st.pid, self.t, 0, a)
        st.host.append(ev)
        self.ext_stack.append(ext)
        self.t += self.spec.host_gap_ns
        return ev

    def _close(self, ev: _Event, *, end_ns: int = 0) -> None:
        """End ``ev`` ``host_gap_ns`` after the last call in it, or at ``end_ns`` if that is later."""
        self.t = max(self.t + self.spec.host_gap_ns, end_ns)
        ev.dur_ns = self.t - ev.start_ns
        self.ext_stack.pop()

    def _call(self, name: str, dur_ns: int) -> tuple[_Event, int]:
        """A runtime call of ``dur_ns`` at the host's cursor; returns it and its correlation id."""
        st = self.st
        corr = st.next_corr
        st.next_corr += 1
        args = {"External id": self.ext_stack[-1], "cbid": CBID[name], "correlation": corr}
        ev = _Event(name, "cuda_runtime", st.pid, st.pid, self.t, dur_ns, args)
        st.host.append(ev)
        self.t += dur_ns + self.spec.host_gap_ns
        return ev, corr

    def _jittered(self, mean_ns: int) -> int:
        u = self.st.rng.uniform(-1.0, 1.0)  # drawn whatever the factor: same draws with or without it
        return max(1, round(mean_ns * (1.0 + self.spec.kernel_jitter * u) * self.st.factor))

    def _launch(self, name: str, stream: int, dur_ns: int, extra: dict[str, Any], comm: int = -1) -> int:
        call, corr = self._call("cudaLaunchKernel", self.spec.launch_ns)
        call.flow = "s"
        args = {
            "External id": call.args["External id"],
            "queued": 0,
            "device": self.st.device,
            "context": 1,
            "stream": stream,
            "correlation": corr,
            "registers per thread": 128,
            "shared memory": 0,
            "blocks per SM": 1.0,
            "warps per SM": 8.0,
            "grid": [132, 1, 1],
            "block": [256, 1, 1],
            "est. achieved occupancy %": 12,
        }
        args.update(extra)
        kernel = _Event(name, "kernel", self.st.device, stream, 0, 0, args, flow="f")
        self.st.dev.append(kernel)
        earliest = call.start_ns + self.spec.launch_latency_ns
        self.st.prog.append(_DevOp("work", stream, earliest, dur_ns=dur_ns, comm=comm, out=kernel))
        return corr

    def _op(self, name: str, kernel: str, mean_ns: int) -> None:
        """A layer/optimizer op: ``op_cpu_ns`` of host time with its kernel's launch in the middle."""
        spec = self.spec
        op = self._open(name, "cpu_op")
        self.t = max(self.t, op.start_ns + (spec.op_cpu_ns - spec.launch_ns) // 2)
        self._launch(kernel, COMPUTE_STREAM, self._jittered(mean_ns), {})
        self._close(op, end_ns=op.start_ns + spec.op_cpu_ns)

    def _record(self, stream: int) -> tuple[int, int, int]:
        """``cudaEventRecord`` on ``stream``; returns (event, record correlation, stream)."""
        call, corr = self._call("cudaEventRecord", self.spec.runtime_call_ns)
        event = self.st.next_cuda_event
        self.st.next_cuda_event += 1
        self.st.prog.append(_DevOp("record", stream, call.start_ns, event=event))
        return event, corr, stream

    def _wait(self, stream: int, recorded: tuple[int, int, int]) -> None:
        """``cudaStreamWaitEvent``: ``stream`` waits for ``recorded`` (and its cuda_sync event)."""
        event, record_corr, on_stream = recorded
        call, _ = self._call("cudaStreamWaitEvent", self.spec.runtime_call_ns)
        self.st.prog.append(_DevOp("wait", stream, call.start_ns, event=event))
        if self.spec.sync_events:
            wait_on = {
                "wait_on_stream": on_stream,
                "wait_on_cuda_event_record_corr_id": record_corr,
                "wait_on_cuda_event_id": event,
            }
            self._sync_event(call, "Stream Wait Event", stream, wait_on)

    def _sync_event(self, call: _Event, kind: str, stream: int, wait_on: dict[str, int]) -> None:
        """The ``cuda_sync`` event of runtime call ``call`` (on ``stream``'s row, flow from the call)."""
        call.flow = "s"
        args = {"External id": call.args["External id"], "cuda_sync_kind": kind, **wait_on}
        args |= {"stream": stream, "correlation": call.args["correlation"], "device": self.st.device}
        args["context"] = 1
        start = call.start_ns + min(1_000, call.dur_ns)  # as recorded: from just after the call began
        end = call.start_ns + call.dur_ns  # to its return
        self.st.dev.append(
            _Event(kind, "cuda_sync", self.st.device, stream, start, end - start, args, flow="f")
        )

    def _all_reduce(self, bucket: int, comm: int) -> None:
        spec = self.spec
        size = spec.bucket_bytes(bucket)
        ranks = str(list(range(spec.world_size)))
        coll = {
            "Collective name": "allreduce",
            "In msg nelems": size // 4,
            "Out msg nelems": size // 4,
            "Group size": spec.world_size,
            "dtype": "Float",
            "In split size": "[]",
            "Out split size": "[]",
            "Process Group Name": PG_NAME,
            "Process Group Description": "default_pg",
            "Process Group Ranks": ranks,
        }
        rpc_args = coll | {"Global rank start": 0, "Global rank stride": 1}
        outer = self._open("c10d::allreduce_", "cpu_op")
        rpc = self._open("record_param_comms", "cpu_op", rpc_args)
        ann = self._open("nccl:all_reduce", "user_annotation")
        ready = self._record(COMPUTE_STREAM)
        self._wait(NCCL_STREAM, ready)
        self._launch(NCCL_KERNEL, NCCL_STREAM, 0, coll, comm=comm)
        for ev in (ann, rpc, outer):
            self._close(ev)

    def run(self) -> Generator[int, int, None]:
        """Issue the step; yields the ``cudaStreamSynchronize`` call's start, is sent the stream's end."""
        spec = self.spec
        prof = self._open(f"ProfilerStep#{spec.first_step + self.step}", "user_annotation")
        self.prof = prof
        fwd = self._open("## forward ##", "user_annotation")
        for i in range(spec.layers):
            kind = LAYER_KINDS[i % len(LAYER_KINDS)]
            self._op(kind[0], kind[1], spec.forward_kernel_ns)
        self._close(fwd)
        bwd = self._open("## backward ##", "user_annotation")
        for j, i in enumerate(reversed(range(spec.layers))):
            kind = LAYER_KINDS[i % len(LAYER_KINDS)]
            self._op(kind[2], kind[3], spec.backward_kernel_ns)
            if (j + 1) % spec.bucket_layers == 0 or j + 1 == spec.layers:
                bucket = j // spec.bucket_layers
                self._all_reduce(bucket, self.seq0 + bucket)
        reduced = self._record(NCCL_STREAM)
        self._wait(COMPUTE_STREAM, reduced)
        self._close(bwd)
        opt = self._open("Optimizer.step#SGD.step", "user_annotation")
        for _ in range(spec.optimizer_kernels):
            self._op(OPTIMIZER_OP, OPTIMIZER_KERNEL, spec.optimizer_kernel_ns)
        self._close(opt)
        item = self._open("aten::item", "cpu_op")
        dense = self._open("aten::_local_scalar_dense", "cpu_op")
        copy, corr = self._call("cudaMemcpyAsync", spec.launch_ns)
        copy.flow = "s"
        margs = {
            "External id": copy.args["External id"],
            "device": self.st.device,
            "context": 1,
            "stream": COMPUTE_STREAM,
            "correlation": corr,
            "bytes": 4,
            "memory bandwidth (GB/s)": 4 / spec.memcpy_ns,
        }
        memcpy = _Event(MEMCPY_NAME, "gpu_memcpy", self.st.device, COMPUTE_STREAM, 0, 0, margs, flow="f")
        self.st.dev.append(memcpy)
        self.st.prog.append(
            _DevOp(
                "work",
                COMPUTE_STREAM,
                copy.start_ns + spec.launch_latency_ns,
                dur_ns=spec.memcpy_ns,
                out=memcpy,
            )
        )
        call_ns = self.t
        drained_ns = yield call_ns
        sync, _ = self._call(
            "cudaStreamSynchronize", max(call_ns, drained_ns) + spec.sync_return_ns - call_ns
        )
        if spec.sync_events:
            self._sync_event(sync, "Stream Sync", COMPUTE_STREAM, {})
        for ev in (dense, item, prof):
            self._close(ev)


def _advance(st: _Rank, pos: int, starts: dict[int, int]) -> int:
    """Run ``st``'s device program from ``pos`` to its end or to an unresolved NCCL kernel (its start
    goes into ``starts``); returns the position reached."""
    free, prog = st.stream_free, st.prog
    while pos < len(prog):
        op = prog[pos]
        if op.kind == "record":
            st.event_ns[op.event] = max(free.get(op.stream, 0), op.earliest_ns)
        elif op.kind == "wait":
            free[op.stream] = max(free.get(op.stream, 0), st.event_ns[op.event])
        else:
            start = max(op.earliest_ns, free.get(op.stream, 0))
            if op.comm >= 0:
                starts[st.rank] = start
                return pos
            assert op.out is not None
            op.out.start_ns, op.out.dur_ns = start, op.dur_ns
            free[op.stream] = start + op.dur_ns
        pos += 1
    return pos


def _run_device(spec: GpuRunSpec, ranks: list[_Rank], step: int, seq0: int) -> list[CollectiveTruth]:
    """Run every rank's device program of one step; all-reduces resolve when all members started."""
    pos = [0] * len(ranks)
    out: list[CollectiveTruth] = []
    while True:
        starts: dict[int, int] = {}
        for st in ranks:
            pos[st.rank] = _advance(st, pos[st.rank], starts)
        if not starts:
            return out
        comms = {ranks[r].prog[pos[r]].comm for r in starts}
        if len(starts) != len(ranks) or len(comms) != 1:  # every rank issues the same all-reduces
            raise RuntimeError(f"synth_gpu: ranks {sorted(starts)} disagree on the next all_reduce {comms}")
        comm = comms.pop()
        bucket = comm - seq0
        size = spec.bucket_bytes(bucket)
        t0 = max(starts.values())
        end = t0 + spec.transfer_ns(size)
        for st in ranks:
            op = st.prog[pos[st.rank]]
            assert op.out is not None
            op.out.start_ns, op.out.dur_ns = starts[st.rank], end - starts[st.rank]
            st.stream_free[op.stream] = end
            pos[st.rank] += 1
        last = min(r for r, s in starts.items() if s == t0)
        by_rank = tuple(starts[r] for r in range(len(ranks)))
        out.append(
            CollectiveTruth(
                step=step,
                bucket=bucket,
                seq=comm,
                size_bytes=size,
                start_ns=by_rank,
                transfer_start_ns=t0,
                end_ns=end,
                last_rank=last,
            )
        )


def _simulate(spec: GpuRunSpec) -> tuple[GpuRunTruth, list[_Rank]]:
    ranks = [
        _Rank(
            rank=r,
            device=r % spec.gpus_per_node,
            rng=random.Random(f"skewlens.synth_gpu:{spec.seed}:{r}"),
            factor=float(spec.slow_ranks.get(r, 1.0)),
        )
        for r in range(spec.world_size)
    ]
    next_start = [RUN_START_NS] * spec.world_size
    collectives: list[CollectiveTruth] = []
    rank_ends: list[list[int]] = [[] for _ in ranks]
    run_start = 0
    for k in range(spec.steps):
        seq0 = k * spec.buckets
        issued = []
        starts = [next_start[st.rank] + st.rng.randint(0, spec.start_skew_ns) for st in ranks]
        if k == 0:
            run_start = min(starts)
        for st in ranks:
            st.prog = []
            step = _Step(spec, st, k, starts[st.rank], seq0)
            gen = step.run()
            next(gen)  # the host issues the step up to its synchronisation
            issued.append((step, gen))
        collectives += _run_device(spec, ranks, k, seq0)
        for st, (step, gen) in zip(ranks, issued, strict=True):
            rank_ends[st.rank].append(
                max(op.out.start_ns + op.out.dur_ns for op in st.prog if op.out is not None)
            )
            with contextlib.suppress(StopIteration):  # the host finishes the step
                gen.send(st.stream_free[COMPUTE_STREAM])
            next_start[st.rank] = step.end_ns + spec.step_gap_ns
    ends = [max(rank_ends[r][k] for r in range(spec.world_size)) for k in range(spec.steps)]
    prev = [run_start, *ends[:-1]]
    base = spec.base_time_ns
    truth = GpuRunTruth(
        spec=spec,
        run_start_ns=base + run_start,
        step_end_ns=tuple(base + e for e in ends),
        step_period_ns=tuple(e - p for e, p in zip(ends, prev, strict=True)),
        rank_step_end_ns=tuple(tuple(base + e for e in row) for row in rank_ends),
        collectives=tuple(
            dataclasses.replace(
                c,
                start_ns=tuple(base + s for s in c.start_ns),
                transfer_start_ns=base + c.transfer_start_ns,
                end_ns=base + c.end_ns,
            )
            for c in collectives
        ),
    )
    return truth, ranks


def simulate_gpu_run(spec: GpuRunSpec) -> GpuRunTruth:
    """The schedule of ``spec`` without writing any file (e.g. the baseline of a blame check)."""
    return _simulate(spec)[0]


def _us(ns: int) -> float:
    return ns / 1000


def _kineto_doc(spec: GpuRunSpec, st: _Rank, name: str) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    t0 = _us(RUN_START_NS)
    meta = [
        (st.pid, 0, "process_name", {"name": "python3.10"}),
        (st.pid, 0, "process_labels", {"labels": "CPU"}),
        (st.device, 0, "process_name", {"name": "python3.10"}),
        (st.device, 0, "process_labels", {"labels": f"GPU {st.device}"}),
        (st.pid, st.pid, "thread_name", {"name": f"thread {st.pid} (python3.10)"}),
        (st.device, COMPUTE_STREAM, "thread_name", {"name": f"stream {COMPUTE_STREAM} "}),
        (st.device, NCCL_STREAM, "thread_name", {"name": f"stream {NCCL_STREAM} "}),
    ]
    events += [{"name": n, "ph": "M", "ts": t0, "pid": p, "tid": t, "args": a} for p, t, n, a in meta]
    for ev in sorted([*st.host, *st.dev], key=lambda e: e.start_ns):
        ts = _us(ev.start_ns)
        events.append(
            {
                "ph": "X",
                "cat": ev.cat,
                "name": ev.name,
                "pid": ev.pid,
                "tid": ev.tid,
                "ts": ts,
                "dur": _us(ev.dur_ns),
                "args": ev.args,
            }
        )
        if ev.flow:
            flow = {
                "ph": ev.flow,
                "id": ev.args["correlation"],
                "pid": ev.pid,
                "tid": ev.tid,
                "ts": ts,
                "cat": "ac2g",
                "name": "ac2g",
            }
            if ev.flow == "f":
                flow["bp"] = "e"
            events.append(flow)
    n = spec.world_size
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": d, **_DEVICE_PROPERTIES, **spec.device_properties.get(st.rank, {})}
            for d in range(min(n, spec.gpus_per_node))
        ],
        "distributedInfo": {
            "backend": "nccl",
            "rank": st.rank,
            "world_size": n,
            "pg_count": 1,
            "pg_config": [
                {
                    "pg_name": PG_NAME,
                    "pg_desc": "default_pg",
                    "backend_config": "cuda:nccl",
                    "pg_size": n,
                    "ranks": list(range(n)),
                }
            ],
            "nccl_version": "2.21.5",
        },
        "traceEvents": events,
        "traceName": name,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": spec.base_time_ns,
    }


def write_gpu_run(spec: GpuRunSpec, out_dir: str | Path, *, compress: bool = True) -> GpuRunTruth:
    """Write ``out_dir/rank{r}_kineto.json[.gz]`` for every rank of ``spec``; returns the schedule."""
    out = Path(out_dir)
    truth, ranks = _simulate(spec)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for st in ranks:
        path = out / (RANK_FILE.format(rank=st.rank) + (".gz" if compress else ""))
        # ": " as torch.profiler writes it: HTA finds a file's rank by the pattern '"rank":\s+(\d+)', and
        # without the space reads every file as rank 0 and keeps only one of them (+0.2% gzipped)
        data = json.dumps(_kineto_doc(spec, st, path.name), separators=(",", ": ")).encode()
        path.write_bytes(gzip.compress(data, compresslevel=6, mtime=0) if compress else data)
        files.append(path)
    return dataclasses.replace(truth, files=tuple(files))
