"""The synthetic GPU run generator (profiler/synth_gpu.py): real Kineto shapes and a schedule that holds.

Every timing check reads the written files back (``baseTimeNanoseconds`` + ``ts`` x 1000, as the
importer does) and recomputes what it asserts from them; the generator's own numbers are only the thing
compared against. Key shapes are compared with the real traces in ../shared/traces.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import gzip
import itertools
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.synth_gpu import (
    COMPUTE_STREAM,
    NCCL_KERNEL,
    NCCL_STREAM,
    GpuRunSpec,
    GpuRunTruth,
    simulate_gpu_run,
    write_gpu_run,
)
from skewlens.profiler.vocab import CommType

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
SLOW_RANK, FACTOR = 5, 1.3
SPEC = GpuRunSpec(world_size=32, steps=5, layers=8, slow_ranks={SLOW_RANK: FACTOR}, seed=0)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@functools.cache
def _load_real(name: str) -> dict[str, Any]:
    with gzip.open(SHARED / name) as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def _real(name: str) -> dict[str, Any]:
    """A real trace from ../shared/traces (read once; callers must not modify it)."""
    if not (SHARED / name).is_file():
        pytest.skip(f"real GPU trace {SHARED / name} not found (see shared/traces/README.md)")
    return _load_real(name)


@dataclass
class Rank:
    """One written rank file, read back: complete events with times in integer ns."""

    doc: dict[str, Any]
    events: list[dict[str, Any]]
    """Complete (``X``) events, each with ``start`` / ``end`` ns added."""
    calls: dict[int, dict[str, Any]]
    """Runtime calls by correlation id."""
    steps: list[dict[str, Any]]
    """``ProfilerStep#N`` annotations, in time order."""

    def of(self, cat: str, name: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["cat"] == cat and (name is None or e["name"] == name)]

    @property
    def gpu(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["cat"] in GPU_CATS]

    def step_of(self, gpu_event: dict[str, Any]) -> int:
        """Index of the ProfilerStep whose span holds the launch of ``gpu_event``."""
        t = self.calls[gpu_event["args"]["correlation"]]["start"]
        k = bisect.bisect_right([s["start"] for s in self.steps], t) - 1
        assert k >= 0 and t <= self.steps[k]["end"]
        return k

    def nccl(self) -> list[dict[str, Any]]:
        return sorted(
            (e for e in self.of("kernel") if e["name"].startswith("nccl")), key=lambda e: e["start"]
        )


def _read(path: Path) -> Rank:
    with gzip.open(path) as fh:
        doc = json.load(fh)
    base = doc["baseTimeNanoseconds"]
    events = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            start = base + round(e["ts"] * 1000)
            events.append(e | {"start": start, "end": start + round(e["dur"] * 1000)})
    calls = {e["args"]["correlation"]: e for e in events if e["cat"] == "cuda_runtime"}
    steps = [e for e in events if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    return Rank(doc=doc, events=events, calls=calls, steps=sorted(steps, key=lambda e: e["start"]))


@dataclass
class Written:
    truth: GpuRunTruth
    ranks: list[Rank]


def _write(spec: GpuRunSpec, out: Path) -> Written:
    truth = write_gpu_run(spec, out)
    return Written(truth=truth, ranks=[_read(p) for p in truth.files])


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return _write(SPEC, tmp_path_factory.mktemp("slow"))


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return _write(SPEC.without_slow_ranks(), tmp_path_factory.mktemp("fast"))


def _both(slow: Written, fast: Written) -> Iterator[Written]:
    yield slow
    yield fast


def _keys_by_kind(events: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for e in events:
        out[e.get("cat", ""), e["ph"]] |= set(e)
    return out


def _device_step_ends(w: Written) -> list[int]:
    """Per step: the latest end over the ranks of a device activity launched inside that step."""
    ends = [0] * len(w.ranks[0].steps)
    for rank in w.ranks:
        for e in rank.gpu:
            k = rank.step_of(e)
            ends[k] = max(ends[k], e["end"])
    return ends


# --- shapes -------------------------------------------------------------------------------------------


def test_each_file_says_its_rank_as_hta_looks_for_it(slow: Written) -> None:
    # HolisticTraceAnalysis reads a file's rank with this pattern on its text (hta/common/trace_file.py);
    # compact JSON ('"rank":3') matched nothing, so HTA read all 32 files as rank 0 and analysed one
    for r, path in enumerate(slow.truth.files):
        text = gzip.decompress(path.read_bytes()).decode()
        m = re.search(r'"rank":\s+(\d+)', text)
        assert m is not None and int(m.group(1)) == r


def test_top_level_and_distributed_info_have_the_keys_of_a_recent_nccl_trace(slow: Written) -> None:
    real = _real("nccl_2gpu_rank0_kineto.json.gz")
    ours = slow.ranks[3].doc
    assert {"schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds"} <= set(ours)
    assert ours["schemaVersion"] == real["schemaVersion"] == 1
    assert set(ours["distributedInfo"]) == set(real["distributedInfo"])
    assert set(ours["distributedInfo"]["pg_config"][0]) == set(real["distributedInfo"]["pg_config"][0])
    assert set(ours["deviceProperties"][0]) == set(real["deviceProperties"][0])
    dist = ours["distributedInfo"]
    assert (dist["backend"], dist["rank"], dist["world_size"]) == ("nccl", 3, 32)
    assert dist["pg_config"][0]["ranks"] == list(range(32))


def test_events_have_the_categories_and_keys_of_the_real_files(slow: Written) -> None:
    real = _real("nccl_2gpu_rank0_kineto.json.gz")
    sync = _real("cuda_event_sync_multistream_kineto.json.gz")
    ours = slow.ranks[0].doc["traceEvents"]
    real_keys = _keys_by_kind(real["traceEvents"] + sync["traceEvents"])
    ours_keys = _keys_by_kind(ours)
    cats = {e.get("cat") for e in ours if e["ph"] == "X"}
    assert cats == {"user_annotation", "cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "cuda_sync"}
    for kind, keys in ours_keys.items():
        assert keys == real_keys[kind], kind


def _args_keys(events: list[dict[str, Any]], pick: Any) -> set[frozenset[str]]:
    return {frozenset(e["args"]) for e in events if e.get("ph") == "X" and pick(e)}


def test_comm_and_kernel_args_have_the_keys_of_the_real_two_gpu_trace(slow: Written) -> None:
    real = _real("nccl_2gpu_rank0_kineto.json.gz")["traceEvents"]
    ours = slow.ranks[0].doc["traceEvents"]

    def rpc(e: dict[str, Any]) -> bool:
        return bool(e["name"] == "record_param_comms" and "Collective name" in e["args"])

    def nccl(e: dict[str, Any]) -> bool:
        return bool(e.get("cat") == "kernel" and e["name"].startswith("nccl"))

    def compute(e: dict[str, Any]) -> bool:
        return bool(e.get("cat") == "kernel" and not e["name"].startswith("nccl"))

    for pick in (rpc, nccl, compute):
        (keys,) = _args_keys(ours, pick)
        assert keys in _args_keys(real, pick), pick.__name__
    launch = [e for e in ours if e.get("name") == "cudaLaunchKernel"]
    assert {e["args"]["cbid"] for e in launch} == {211}
    ar = [e for e in ours if nccl(e)]
    assert {e["name"] for e in ar} == {
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    }
    assert {e["args"]["Process Group Ranks"] for e in ar} == {str(list(range(32)))}


def test_cuda_sync_events_have_the_shapes_of_the_sync_traces(slow: Written) -> None:
    real = [
        *_real("cuda_event_sync_kineto.json.gz")["traceEvents"],
        *_real("cuda_event_sync_multistream_kineto.json.gz")["traceEvents"],
    ]
    rank = slow.ranks[9]
    ours = rank.doc["traceEvents"]
    for kind in ("Stream Wait Event", "Stream Sync"):
        (keys,) = _args_keys(ours, lambda e, k=kind: e["name"] == k)
        assert {keys} == _args_keys(real, lambda e, k=kind: e["name"] == k), kind
    calls = rank.calls
    records = {e["args"]["correlation"]: e for e in rank.of("cuda_runtime", "cudaEventRecord")}
    waits = rank.of("cuda_sync", "Stream Wait Event")
    assert len(waits) == SPEC.steps * (SPEC.buckets + 1)
    for w in waits:
        a = w["args"]
        assert (w["pid"], w["tid"]) == (a["device"], a["stream"]) == (9 % 8, a["stream"])
        assert calls[a["correlation"]]["name"] == "cudaStreamWaitEvent"
        assert a["wait_on_cuda_event_record_corr_id"] in records
        assert {a["stream"], a["wait_on_stream"]} == {COMPUTE_STREAM, NCCL_STREAM}
    syncs = rank.of("cuda_sync", "Stream Sync")
    assert len(syncs) == SPEC.steps
    for s in syncs:
        call = calls[s["args"]["correlation"]]
        assert call["name"] == "cudaStreamSynchronize"
        assert (s["tid"], s["args"]["stream"]) == (COMPUTE_STREAM, COMPUTE_STREAM)
        assert call["start"] <= s["start"] <= s["end"] == call["end"]


def test_every_launch_and_its_gpu_activity_are_joined_by_an_ac2g_flow(slow: Written) -> None:
    rank = slow.ranks[1]
    flows = [e for e in rank.doc["traceEvents"] if e.get("cat") == "ac2g"]
    starts = {f["id"]: f for f in flows if f["ph"] == "s"}
    ends = {f["id"]: f for f in flows if f["ph"] == "f"}
    assert len(starts) == len(ends) == len(flows) / 2
    for e in rank.gpu:
        corr = e["args"]["correlation"]
        call = rank.calls[corr]
        assert call["name"] in ("cudaLaunchKernel", "cudaMemcpyAsync")
        s, f = starts[corr], ends[corr]
        assert (s["pid"], s["tid"], s["ts"]) == (call["pid"], call["tid"], call["ts"])
        assert (f["pid"], f["tid"], f["ts"], f["bp"]) == (e["pid"], e["tid"], e["ts"], "e")


def test_layers_and_buckets_give_the_kernel_and_all_reduce_counts(slow: Written) -> None:
    rank = slow.ranks[0]
    compute = [e for e in rank.of("kernel") if e["tid"] == COMPUTE_STREAM]
    per_step = 2 * SPEC.layers + SPEC.optimizer_kernels
    assert len(compute) == SPEC.steps * per_step
    assert len(rank.nccl()) == SPEC.steps * SPEC.buckets == 20
    assert [e["name"] for e in rank.steps] == [f"ProfilerStep#{k}" for k in range(SPEC.steps)]
    sizes = [e["args"]["In msg nelems"] * 4 for e in rank.nccl()[: SPEC.buckets]]
    assert sizes == [SPEC.bucket_layers * SPEC.layer_param_bytes] * SPEC.buckets
    for rpc in rank.of("cpu_op", "record_param_comms"):
        outer = [e for e in rank.of("cpu_op", "c10d::allreduce_") if e["start"] <= rpc["start"] < e["end"]]
        ann = [
            e
            for e in rank.of("user_annotation", "nccl:all_reduce")
            if rpc["start"] <= e["start"] < rpc["end"]
        ]
        assert len(outer) == len(ann) == 1
        inside = [c["name"] for c in rank.of("cuda_runtime") if ann[0]["start"] <= c["start"] < ann[0]["end"]]
        assert inside == ["cudaEventRecord", "cudaStreamWaitEvent", "cudaLaunchKernel"]


# --- the schedule, checked in the files --------------------------------------------------------------


def test_each_all_reduce_transfer_starts_when_the_last_member_kernel_started(slow: Written) -> None:
    per_rank = [r.nccl() for r in slow.ranks]
    assert len({len(k) for k in per_rank}) == 1
    n = SPEC.world_size
    for i, members in enumerate(zip(*per_rank, strict=True)):
        size = members[0]["args"]["In msg nelems"] * 4
        transfer = SPEC.nccl_latency_ns + math.ceil(2 * (n - 1) * size / (n * SPEC.bus_bandwidth_gbps))
        last_start = max(e["start"] for e in members)
        assert {e["end"] for e in members} == {last_start + transfer}, i
        truth = slow.truth.collectives[i]
        assert (truth.transfer_start_ns, truth.end_ns) == (last_start, last_start + transfer)
        assert truth.start_ns == tuple(e["start"] for e in members)
    # the slow rank is the last to start every all_reduce (it finishes its backward kernels last)
    assert {c.last_rank for c in slow.truth.collectives} == {SLOW_RANK}


def test_no_device_activity_starts_before_its_launch(slow: Written) -> None:
    for rank in slow.ranks:
        calls = rank.calls
        for e in rank.gpu:
            assert e["start"] >= calls[e["args"]["correlation"]]["start"] + SPEC.launch_latency_ns


def test_each_stream_runs_its_work_in_launch_order_without_overlap(slow: Written) -> None:
    for rank in slow.ranks:
        by_stream: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in rank.gpu:
            by_stream[e["args"]["stream"]].append(e)
        assert set(by_stream) == {COMPUTE_STREAM, NCCL_STREAM}
        for work in by_stream.values():
            work.sort(key=lambda e: e["args"]["correlation"])
            for a, b in itertools.pairwise(work):
                assert b["start"] >= a["end"]


def test_an_all_reduce_starts_after_the_compute_kernels_before_its_event_record(slow: Written) -> None:
    for rank in slow.ranks:
        compute = [e for e in rank.gpu if e["tid"] == COMPUTE_STREAM]
        records = rank.of("cuda_runtime", "cudaEventRecord")
        for kernel in rank.nccl():
            corr = kernel["args"]["correlation"]
            record = max((r for r in records if r["args"]["correlation"] < corr), key=lambda r: r["start"])
            before = [e for e in compute if e["args"]["correlation"] < record["args"]["correlation"]]
            assert kernel["start"] >= max(e["end"] for e in before)


def test_the_optimizer_starts_after_the_steps_last_all_reduce_on_every_rank(slow: Written) -> None:
    for rank in slow.ranks:
        for k in range(SPEC.steps):
            opt = [e for e in rank.of("kernel") if e["name"].startswith("void") and rank.step_of(e) == k]
            last_ar = [e for e in rank.nccl() if rank.step_of(e) == k][-1]
            assert len(opt) == SPEC.optimizer_kernels
            assert min(e["start"] for e in opt) >= last_ar["end"]


def test_the_cpu_runs_ahead_of_the_gpu_and_waits_only_at_the_step_end(slow: Written) -> None:
    for rank in slow.ranks:
        steps = rank.steps
        for k, step in enumerate(steps):
            mine = [e for e in rank.gpu if rank.step_of(e) == k]
            launches = [rank.calls[e["args"]["correlation"]] for e in mine]
            forward_end = sorted(e["end"] for e in mine if e["tid"] == COMPUTE_STREAM)[SPEC.layers - 1]
            assert max(c["start"] for c in launches) < forward_end  # every launch done before forward is
            assert min(e["start"] for e in mine) > step["start"]
            sync = next(
                c for c in rank.of("cuda_runtime", "cudaStreamSynchronize") if c["start"] > step["start"]
            )
            assert sync["end"] == max(e["end"] for e in mine) + SPEC.sync_return_ns
            if k + 1 < len(steps):
                assert steps[k + 1]["start"] >= sync["end"] + SPEC.step_gap_ns


def test_ranks_start_their_steps_at_seeded_different_times(slow: Written) -> None:
    starts = [{r.steps[k]["start"] for r in slow.ranks} for k in range(SPEC.steps)]
    assert all(len(s) > SPEC.world_size // 2 for s in starts)
    assert all(max(s) - min(s) <= SPEC.start_skew_ns for s in starts[:1])


# --- the truth --------------------------------------------------------------------------------------


def test_step_periods_recomputed_from_the_files_are_the_truth(slow: Written, fast: Written) -> None:
    for w in _both(slow, fast):
        ends = _device_step_ends(w)
        run_start = min(r.steps[0]["start"] for r in w.ranks)
        periods = [e - p for e, p in zip(ends, [run_start, *ends[:-1]], strict=True)]
        assert tuple(periods) == w.truth.step_period_ns
        assert (run_start, tuple(ends)) == (w.truth.run_start_ns, w.truth.step_end_ns)
        for r, rank in enumerate(w.ranks):
            mine = [max(e["end"] for e in rank.gpu if rank.step_of(e) == k) for k in range(SPEC.steps)]
            assert tuple(mine) == w.truth.rank_step_end_ns[r]


def test_a_slow_rank_costs_what_the_files_say_and_no_more_than_its_added_kernel_time(
    slow: Written, fast: Written
) -> None:
    run_start = [min(r.steps[0]["start"] for r in w.ranks) for w in (slow, fast)]
    assert run_start[0] == run_start[1]  # same seed: the same start
    extra = _device_step_ends(slow)[-1] - _device_step_ends(fast)[-1]
    assert extra == slow.truth.total_ns - fast.truth.total_ns
    per_step = [a - b for a, b in zip(slow.truth.step_period_ns, fast.truth.step_period_ns, strict=True)]
    assert all(d > 0 for d in per_step)

    def compute(w: Written) -> list[int]:
        rank = w.ranks[SLOW_RANK]
        return [e["end"] - e["start"] for e in rank.of("kernel") if e["tid"] == COMPUTE_STREAM]

    added = [a - b for a, b in zip(compute(slow), compute(fast), strict=True)]
    # the same kernels, FACTOR times longer (to the rounding of each duration to ns)
    assert all(abs(a - (FACTOR - 1) * b) <= 2 for a, b in zip(added, compute(fast), strict=True))
    # a longest-path schedule: lengthening work by X delays nothing by more than X
    assert 0 < extra <= sum(added)
    for other in (0, 31):  # the other ranks' own kernels do not change
        assert [e["dur"] for e in slow.ranks[other].of("kernel") if e["tid"] == COMPUTE_STREAM] == [
            e["dur"] for e in fast.ranks[other].of("kernel") if e["tid"] == COMPUTE_STREAM
        ]


def test_the_baseline_truth_needs_no_files(fast: Written) -> None:
    assert simulate_gpu_run(SPEC.without_slow_ranks()) == dataclasses.replace(fast.truth, files=())


def test_without_sync_events_the_runtime_calls_stay_and_cuda_sync_events_go(
    slow: Written, tmp_path: Path
) -> None:
    small = dataclasses.replace(SPEC, world_size=4, slow_ranks={1: FACTOR})
    plain = write_gpu_run(dataclasses.replace(small, sync_events=False), tmp_path / "plain")
    synced = write_gpu_run(small, tmp_path / "synced")
    for p, s in zip(plain.files, synced.files, strict=True):
        a, b = _read(p), _read(s)
        assert not a.of("cuda_sync") and len(b.of("cuda_sync")) == SPEC.steps * (SPEC.buckets + 2)
        calls = [(e["name"], e["ts"], e["dur"], e["args"]["correlation"]) for e in a.of("cuda_runtime")]
        assert calls == [
            (e["name"], e["ts"], e["dur"], e["args"]["correlation"]) for e in b.of("cuda_runtime")
        ]
        assert [e for e in a.events if e["cat"] != "cuda_sync"] == [
            e for e in b.events if e["cat"] != "cuda_sync"
        ]
    assert plain.step_period_ns == synced.step_period_ns


def test_the_same_spec_writes_the_same_bytes_and_another_seed_other_times(tmp_path: Path) -> None:
    spec = dataclasses.replace(SPEC, world_size=2, steps=2, slow_ranks={1: FACTOR})
    one, two = write_gpu_run(spec, tmp_path / "a"), write_gpu_run(spec, tmp_path / "b")
    assert [p.read_bytes() for p in one.files] == [p.read_bytes() for p in two.files]
    other = simulate_gpu_run(dataclasses.replace(spec, seed=1))
    assert other.step_period_ns != one.step_period_ns


def test_a_32_rank_5_step_run_is_small_gzip(slow: Written) -> None:
    sizes = [p.stat().st_size for p in slow.truth.files]
    assert [p.name for p in slow.truth.files] == [f"rank{r}_kineto.json.gz" for r in range(32)]
    assert max(sizes) < 64 * 1024


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"world_size": 0}, "world_size"),
        ({"slow_ranks": {32: 1.3}}, "slow_ranks"),
        ({"slow_ranks": {1: 0.0}}, "slow_ranks"),
        ({"layer_param_bytes": 6}, "layer_param_bytes"),
        ({"kernel_jitter": 1.5}, "kernel_jitter"),
        ({"op_cpu_ns": 1_000}, "op_cpu_ns"),
        ({"bus_bandwidth_gbps": 0.0}, "bus_bandwidth_gbps"),
    ],
)
def test_a_bad_setting_is_refused_by_name(change: dict[str, Any], setting: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"GpuRunSpec.{setting}")):
        dataclasses.replace(SPEC, **change)


# --- the importer takes the files -----------------------------------------------------------------


def test_skewlens_import_reads_32_ranks_and_matches_every_all_reduce(tmp_path: Path) -> None:
    from skewlens.profiler.importers import import_traces
    from skewlens.profiler.store import load_run

    spec = dataclasses.replace(SPEC, steps=2, layers=4)
    write_gpu_run(spec, tmp_path / "kineto")
    manifest = import_traces([tmp_path / "kineto"], None, tmp_path / "run")
    assert (manifest.world_size, manifest.ranks, manifest.missing_ranks) == (32, tuple(range(32)), ())
    run = load_run(tmp_path / "run")
    assert len(run.collectives) == spec.steps * spec.buckets
    assert [c.seq for c in run.collectives] == list(range(spec.steps * spec.buckets))
    for c in run.collectives:
        assert (c.comm_type, c.ranks) == (CommType.ALL_REDUCE, tuple(range(32)))
        assert set(c.comm_bytes) == {spec.bucket_layers * spec.layer_param_bytes}


#: What ROCm's torch records where the synthetic run's files say CUDA: HIP's runtime calls (filed under
#: ``cuda_runtime`` by ROCm's Kineto), RCCL's Generic kernel, a copy to the host that names no pageable
#: memory.
ROCM_NAMES = {
    "cudaLaunchKernel": "hipLaunchKernel",
    "cudaMemcpyAsync": "hipMemcpyAsync",
    "cudaEventRecord": "hipEventRecord",
    "cudaStreamWaitEvent": "hipStreamWaitEvent",
    "cudaStreamSynchronize": "hipStreamSynchronize",
    NCCL_KERNEL: "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)",
    "Memcpy DtoH (Device -> Pageable)": "Memcpy DtoH (Device -> Host)",
}


def test_the_same_run_written_as_rocm_records_it_analyses_as_its_cuda_files_do(tmp_path: Path) -> None:
    # ROCm's Kineto has no cuda_sync events: both without. With HIP's names the waits were lost: rank 1's
    # slowness made no one wait (exposed wait 0 on every rank, 1.5 ms a step on the others with CUDA's)
    from skewlens.analysis.api import analyze_run
    from skewlens.profiler.importers import import_traces
    from skewlens.replay.driver import load_trace

    spec = dataclasses.replace(
        SPEC, world_size=4, steps=2, layers=4, slow_ranks={1: FACTOR}, sync_events=False
    )
    truth = write_gpu_run(spec, tmp_path / "cuda")
    (tmp_path / "rocm").mkdir()
    for path in truth.files:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        for e in doc["traceEvents"]:
            e["name"] = ROCM_NAMES.get(e["name"], e["name"])
        (tmp_path / "rocm" / path.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    for k in ("cuda", "rocm"):
        import_traces([tmp_path / k], None, tmp_path / f"run-{k}")
    cuda, rocm = (analyze_run(load_trace(tmp_path / f"run-{k}"), blame=False) for k in ("cuda", "rocm"))
    assert rocm.breakdown == cuda.breakdown
    assert rocm.gpu_idle == cuda.gpu_idle
    unnamed = [[dataclasses.replace(r, name="") for r in res.critical_path] for res in (cuda, rocm)]
    assert unnamed[0] == unnamed[1]  # the same nodes (the copy's and the NCCL kernel's names aside)
    assert [(k.kind, k.total_ns) for k in rocm.gpu_kernels] == [
        (k.kind, k.total_ns) for k in cuda.gpu_kernels
    ]
    waits = [b.exposed_wait_ns for b in rocm.breakdown if b.rank != 1]
    assert min(waits) > 1_000_000
