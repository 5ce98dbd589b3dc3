"""GPU idle time by what each stream waited for (``skewlens.analysis.gpu_idle``): a hand-made Kineto trace
whose every idle stretch is known, the real 2-GPU trace, the table and its Parquet file."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from picture_helpers import assert_read_without_colour_names, drawn_figures
from rich.console import Console

from skewlens.analysis.api import analyze_run
from skewlens.analysis.gpu_idle import StreamMeans, compute_streams, most_idle
from skewlens.analysis.plots import gpu_idle_bars, gpu_idle_bars_data
from skewlens.analysis.render import breakdown_table, gpu_idle_table
from skewlens.cli import main
from skewlens.console import report_console
from skewlens.profiler.importers import import_traces
from skewlens.profiler.store import load_run
from skewlens.profiler.store.schema import read_table
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, names_gpu_memory_op
from skewlens.replay.driver import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
US = 1000


def _write_trace(path: Path, step_us: int = 1000) -> Path:
    """One rank, one step of ``step_us`` (1,000) us (times in us):

    - stream 7: ``gemm`` 20-120 (launched at 12); ``relu`` 310-360 (launched at 305); ``mul`` 555-655,
      launched at 347 but waiting (an event) for ``add`` on stream 8, which ends at 550; ``div`` 810-860,
      launched at 672 but waiting for the NCCL kernel on stream 20, which ends at 800;
    - stream 8: ``add`` 50-550 (launched at 42);
    - stream 20: an NCCL kernel 600-800 whose launch is before the trace (nothing says what it waited for).
    """
    evs: list[dict[str, Any]] = []
    ext = iter(range(1, 100))

    def x(cat: str, name: str, ts: int, dur: int, **args: Any) -> None:
        pid, tid = (0, args["stream"]) if cat in ("kernel", "cuda_sync") else (1, 1)
        evs.append(
            {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    def op(name: str, ts: int, dur: int) -> None:
        x("cpu_op", name, ts, dur, **{"External id": next(ext)})

    def call(name: str, ts: int, corr: int) -> None:
        x("cuda_runtime", name, ts, 2, correlation=corr)

    def kernel(name: str, stream: int, ts: int, dur: int, corr: int) -> None:
        x("kernel", name, ts, dur, device=0, stream=stream, correlation=corr)

    def stream_wait(ts: int, corr: int, stream: int, on: int, record: int) -> None:
        kind = "Stream Wait Event"
        args = {"wait_on_stream": on, "wait_on_cuda_event_record_corr_id": record}
        x("cuda_sync", kind, ts, 1, cuda_sync_kind=kind, device=0, stream=stream, correlation=corr, **args)

    x("user_annotation", "ProfilerStep#1", 0, step_us)
    op("aten::mm", 10, 20), call("cudaLaunchKernel", 12, 1), kernel("gemm", 7, 20, 100, 1)
    op("aten::add", 40, 10), call("cudaLaunchKernel", 42, 3), kernel("add", 8, 50, 500, 3)
    op("aten::relu", 300, 20), call("cudaLaunchKernel", 305, 2), kernel("relu", 7, 310, 50, 2)
    op("aten::record", 330, 10), call("cudaEventRecord", 331, 4), call("cudaStreamWaitEvent", 333, 5)
    stream_wait(333, 5, stream=7, on=8, record=4)
    op("aten::mul", 345, 10), call("cudaLaunchKernel", 347, 6), kernel("mul", 7, 555, 100, 6)
    kernel("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", 20, 600, 200, 99)
    op("aten::record", 658, 10), call("cudaEventRecord", 660, 7), call("cudaStreamWaitEvent", 662, 8)
    stream_wait(662, 8, stream=7, on=20, record=7)
    op("aten::div", 670, 10), call("cudaLaunchKernel", 672, 9), kernel("div", 7, 810, 50, 9)
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": evs}
    path.write_text(json.dumps(doc))
    return path


def test_each_idle_stretch_of_a_stream_goes_to_what_its_next_op_waited_for(tmp_path: Path) -> None:
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    res = analyze_run(load_trace(tmp_path / "run"), blame=False)
    got = {g.stream: g for g in res.gpu_idle}
    assert sorted(got) == [7, 8, 20] and {g.step for g in res.gpu_idle} == {1}
    s7 = got[7]
    assert (s7.step_ns, s7.busy_ns, s7.compute_ns, s7.idle_ns, s7.ops) == (
        1000 * US,
        300 * US,
        300 * US,
        700 * US,
        4,
    )
    # launch: 0-12 (gemm's launch) and 120-305 (relu's); stream: 360-550 (add on stream 8); comm: 655-800
    # (the NCCL kernel); other: the latencies after each was met (12-20, 305-310, 550-555, 800-810) and the
    # tail 860-1000
    assert s7.launch_wait_ns == (12 + 185) * US
    assert s7.stream_wait_ns == 190 * US
    assert s7.comm_wait_ns == 145 * US
    assert s7.other_ns == (8 + 5 + 5 + 10 + 140) * US
    # of other, the GPU ran nothing while the next op was queued: 550-555 (mul, launched at 347) and
    # 800-810 (div, launched at 672); not the latencies after a launch (12-20, 305-310), nor the tail
    assert s7.queued_idle_ns == (5 + 10) * US
    s8 = got[8]
    assert (s8.busy_ns, s8.launch_wait_ns, s8.other_ns, s8.comm_wait_ns + s8.stream_wait_ns) == (
        500 * US, 42 * US, (8 + 450) * US, 0
    )  # fmt: skip
    assert s8.queued_idle_ns == 0
    # the NCCL kernel's launch is not in the trace: nothing says what its stream waited for
    s20 = got[20]
    assert (s20.busy_ns, s20.compute_ns, s20.other_ns, s20.idle_ns) == (200 * US, 0, 800 * US, 800 * US)
    assert s20.queued_idle_ns == 0  # its launch is not in the trace: not known to be queued


def test_a_stream_waiting_for_a_launch_no_operator_holds_waits_for_its_host(tmp_path: Path) -> None:
    # one rank, one step of 1,000 us: gemm 20-120 on stream 7, launched at 12 inside aten::mm; then a
    # kernel launched at 300 by a call inside no operator (an extension's kernel, the 128-GPU sample's fused
    # optimizer), run 310-360: the stream waited 120-300 for the host to launch it, not for nothing
    def x(cat: str, name: str, ts: int, dur: int, tid: int = 1, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 0 if cat == "kernel" else 1, "tid": tid, "ts": ts,
                "dur": dur, "args": args}  # fmt: skip

    evs = [x("user_annotation", "ProfilerStep#1", 0, 1000), x("cpu_op", "aten::mm", 10, 20)]
    for corr, (name, call, ts, dur) in enumerate((("gemm", 12, 20, 100), ("fused_adam", 300, 310, 50))):
        evs.append(x("cuda_runtime", "cudaLaunchKernel", call, 2, correlation=corr))
        evs.append(x("kernel", name, ts, dur, tid=7, device=0, stream=7, correlation=corr))
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": evs}
    (tmp_path / "trace.json").write_text(json.dumps(doc))
    import_traces([tmp_path / "trace.json"], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    (g,) = analyze_run(run, blame=False).gpu_idle
    assert (g.busy_ns, g.idle_ns) == (150 * US, 850 * US)
    # launch: 0-12 and 120-300; other: the latencies 12-20 and 300-310, and the tail 360-1000 (it read
    # launch 12 us, other 838: 120-310 was other, as if the trace said nothing)
    assert (g.launch_wait_ns, g.comm_wait_ns, g.stream_wait_ns) == ((12 + 180) * US, 0, 0)
    assert g.other_ns == (8 + 10 + 640) * US
    assert g.queued_idle_ns == 0  # launched after the stream went idle: nothing was queued
    from skewlens.replay.simulate import simulate
    from skewlens.replay.summary import summarize

    (s,) = summarize(run, simulate(run))  # the replay's summary reads its times by the same rule
    assert (s.gpu_launch_wait_ns, s.gpu_other_ns) == (g.launch_wait_ns, g.other_ns)
    from skewlens.replay.slowdown import Slowdown, SlowdownModel

    # the GPU twice as slow: gemm ends at 220, fused_adam keeps its gap (410-510), its launch met 10 us
    # before it (400) as recorded, not at the recorded call (300)
    slow = SlowdownModel([Slowdown(kind="compute", factor=2.0, device="gpu")])
    (s2,) = summarize(run, simulate(run, effects=slow))
    assert s2.gpu_launch_wait_ns == (12 + 180) * US
    from skewlens.replay.outputs import write_perfetto

    # and the replay's timeline draws it so (µs from aten::mm's start at 10)
    doc = json.loads(write_perfetto(run, simulate(run), tmp_path / "t.json", idle_streams={0: 7}).read_text())
    pieces = [
        (e["name"], round(e["ts"]), round(e["dur"])) for e in doc["traceEvents"] if e.get("cat") == "gpu_idle"
    ]
    assert sorted(pieces, key=lambda p: p[1]) == [
        ("idle: launch wait", 0, 2),
        ("idle: other", 2, 8),
        ("idle: launch wait", 110, 180),
        ("idle: other", 290, 10),
    ]
    # and under the GPU twice as slow: gemm 20-220, fused_adam's launch met 400 (not the recorded call's 300)
    doc = json.loads(
        write_perfetto(run, simulate(run, effects=slow), tmp_path / "s.json", idle_streams={0: 7}).read_text()
    )
    pieces = [
        (e["name"], round(e["ts"]), round(e["dur"])) for e in doc["traceEvents"] if e.get("cat") == "gpu_idle"
    ]
    assert sorted(pieces, key=lambda p: p[1]) == [
        ("idle: launch wait", 0, 2),
        ("idle: other", 2, 8),
        ("idle: launch wait", 210, 180),
        ("idle: other", 390, 10),
    ]


def test_a_launch_no_operator_holds_gives_way_to_a_dependency_met_later_or_at_once(tmp_path: Path) -> None:
    # kernel b on stream 7, launched at 100 us by a call inside no operator, waits for kernel a on stream 8
    # (10-200): stream 7 waited for stream 8 until 200, not for the launch (0-100, then other); a launch at
    # 200 itself, met when a ends, leaves that wait the stream's too
    for launch_us in (100, 200):
        b = RunBuilder(world_size=1)
        rb = b.rank(0).step(0)
        f = rb.compute("fwd", dur_ns=50 * US, start_ns=0)
        a = rb.compute("a", dur_ns=190 * US, start_ns=10 * US, stream=8, deps=(f,), launch_ns=5 * US)
        rb.compute("b", dur_ns=50 * US, start_ns=210 * US, stream=7, deps=(a,), launch_ns=launch_us * US)
        rb.compute("tail", dur_ns=300 * US, start_ns=60 * US)
        res = analyze_run(load_run(b.write(tmp_path / f"run{launch_us}")), blame=False)
        (g,) = (g for g in res.gpu_idle if g.stream == 7)
        # idle 0-210 and after b (260-360): stream wait 0-200, other 200-210 and 260-360
        assert (g.launch_wait_ns, g.stream_wait_ns, g.other_ns) == (0, 200 * US, 110 * US), launch_us


def test_the_report_shows_each_ranks_compute_stream_and_the_shares_of_its_idle_time(tmp_path: Path) -> None:
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    res = analyze_run(load_trace(tmp_path / "run"), blame=False)
    table = gpu_idle_table(res)
    assert table is not None
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    # stream 8 ran the most compute kernels' time (500 us against stream 7's 300): the compute stream; its
    # idle: launch 42 us (8%), other 458 (92%)
    row = next(line for line in text.splitlines() if line.strip().startswith("│    0"))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:6] == ["0", "8", "1", "1.000", "0.500", "0.500"]
    assert cells[6:] == ["0.042 (8%)", "0.000 (0%)", "0.000 (0%)", "0.458 (92%)"]
    assert (
        "the compute streams idled 50% of their steps, mostly waiting for what the traces do not say; "
        "of that idle time: launch wait 8%, comm wait 0%, stream wait 0%, other 92%"
    ) in " ".join(text.split())


def test_the_picture_stacks_each_ranks_compute_stream_busy_time_on_its_idle_parts(tmp_path: Path) -> None:
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    res = analyze_run(load_trace(tmp_path / "run"), blame=False)
    data = gpu_idle_bars_data(res)
    assert data is not None and (data.ranks, data.streams, data.left_out) == ([0], [8], 0)
    # stream 8: busy 500 us, then launch 42, comm 0, stream 0, other 458 (ms per step)
    assert data.ms.tolist() == [[0.5, 0.042, 0.0, 0.0, 0.458]]
    png = gpu_idle_bars(res, tmp_path / "gpu_idle.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cpu_run_has_no_gpu_idle_rows_table_or_picture(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
    res = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    assert res.gpu_idle == [] and gpu_idle_table(res) is None
    assert gpu_idle_bars(res, tmp_path / "gpu_idle.png") is None and not (tmp_path / "gpu_idle.png").exists()


def test_the_2_gpu_trace_is_host_bound_and_its_table_round_trips_through_parquet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = TRACES / "nccl_2gpu_rank0_kineto.json.gz"
    if not trace.is_file():
        pytest.skip(f"{trace} is absent (../shared/traces)")
    import_traces([trace], None, tmp_path / "run")
    assert main(["analyze", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--no-blame"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU idle per rank, compute stream" in out
    assert "mostly waiting for their hosts' launches" in out
    assert (tmp_path / "out" / "gpu_idle.png").is_file()
    rows = read_table(tmp_path / "out" / "gpu_idle.parquet").to_pylist()
    res = analyze_run(load_trace(tmp_path / "run"), blame=False)
    assert rows == [dataclasses.asdict(g) for g in res.gpu_idle]
    for g in res.gpu_idle:
        assert (
            g.launch_wait_ns + g.comm_wait_ns + g.stream_wait_ns + g.other_ns
            == g.idle_ns
            == g.step_ns - g.busy_ns
        )
    compute = [g for g in res.gpu_idle if g.stream == 7]
    assert len(compute) == 3
    idle = sum(g.idle_ns for g in compute)
    # the host launches late: the GPU waits for it most of the step (HTA: idle 78% of the window)
    assert sum(g.launch_wait_ns for g in compute) > 0.9 * idle
    assert idle > 0.75 * sum(g.step_ns for g in compute)


def test_of_many_ranks_the_table_and_picture_keep_those_whose_compute_stream_idled_the_most() -> None:
    def means(rank: int, idle_ms: float) -> StreamMeans:
        ns = idle_ms * 1e6
        return StreamMeans(
            rank=rank, stream=7, steps=1, step_ns=1e9, busy_ns=1e9 - ns, compute_ns=1e9 - ns, idle_ns=ns,
            parts_ns=(ns, 0.0, 0.0, 0.0),
        )  # fmt: skip

    streams = [means(r, idle) for r, idle in enumerate([5.0, 9.0, 1.0, 7.0])]
    assert [s.rank for s in most_idle(streams, 2)] == [1, 3]  # by rank, of the two that idled most
    assert [s.rank for s in most_idle(streams, 0)] == [0, 1, 2, 3]


def test_the_documented_duckdb_query_ranks_the_streams_by_their_share_of_launch_wait(tmp_path: Path) -> None:
    import re

    import duckdb

    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    assert main(["analyze", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--no-blame"]) == 0
    doc = (Path(__file__).resolve().parents[1] / "docs" / "analysis.md").read_text()
    query = re.search(r"```sql\n(SELECT rank, stream, sum\(busy_ns\).*?)```", doc, re.S)
    assert query is not None
    rows = duckdb.sql(query.group(1).replace("OUT/", f"{tmp_path / 'out'}/")).fetchall()
    # stream 7: launch 197 of 700 us idle; stream 8: 42 of 500; stream 20: none of 800
    assert [(r, s, round(b, 3), round(i, 3), round(x, 4)) for r, s, b, i, x in rows] == [
        (0, 7, 0.3, 0.7, round(197 / 700, 4)),
        (0, 8, 0.5, 0.5, round(42 / 500, 4)),
        (0, 20, 0.2, 0.8, 0.0),
    ]


def test_the_replay_times_the_compute_streams_idle_by_the_analyses_rule_unmodified_and_under_a_what_if(
    tmp_path: Path,
) -> None:
    from skewlens.replay.render import gpu_idle_table as replay_gpu_table
    from skewlens.replay.simulate import simulate
    from skewlens.replay.slowdown import Slowdown, SlowdownModel
    from skewlens.replay.summary import summarize

    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    (rec,) = (g for g in analyze_run(run, blame=False).gpu_idle if g.stream == 8)  # the compute stream
    (s,) = summarize(run, simulate(run))
    assert (s.gpu_stream, s.gpu_busy_ns, s.gpu_idle_ns) == (8, rec.busy_ns, rec.idle_ns)
    assert (s.gpu_launch_wait_ns, s.gpu_comm_wait_ns, s.gpu_stream_wait_ns, s.gpu_other_ns) == (
        rec.launch_wait_ns, rec.comm_wait_ns, rec.stream_wait_ns, rec.other_ns
    )  # fmt: skip
    # every op twice as long: aten::mm 10-50, the recorded 10 us gap, aten::add 60-80 launching at 64 (its
    # call 2 us into its recorded 10, 4 into its doubled 20), the kernel 8 us later for 1,000 us: launch
    # wait 64 us, busy 1,000, and the rest of the 1,387 us step other: it ends with div's kernel, the host's
    # 140 us after it as recorded long over
    (w,) = summarize(
        run, simulate(run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(0,), factor=2.0)]))
    )
    assert (w.step_time_ns, w.gpu_busy_ns, w.gpu_launch_wait_ns) == (1387 * US, 1000 * US, 64 * US)
    assert w.gpu_launch_wait_ns + w.gpu_comm_wait_ns + w.gpu_stream_wait_ns + w.gpu_other_ns == w.gpu_idle_ns
    assert w.gpu_idle_ns == w.step_time_ns - w.gpu_busy_ns
    assert replay_gpu_table([s]) is not None


def test_a_host_bound_steps_end_after_its_last_kernel_is_host_time_that_a_slower_gpu_runs_over(
    tmp_path: Path,
) -> None:
    from skewlens.replay.simulate import simulate
    from skewlens.replay.slowdown import Slowdown, SlowdownModel
    from skewlens.replay.summary import summarize

    # ProfilerStep#1 ends at 1,000 us, 140 us after the last kernel (div, 810-860) and 320 after the host's
    # last op: host time. Kernels x2 end div at 1,365 us, and the step with it; the end mark moved with the
    # kernel that ended last before it, so the host's tail came after the GPU's end: 1,505 us (the 8-GPU
    # DLRM trace at 0.1 GB/s: 58.323 ms where its last kernel ended at 58.206, the host at 18.713)
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    steps = []
    for factor in (1.0, 2.0, 4.0):
        gpu = SlowdownModel([Slowdown(kind="compute", ranks=(0,), factor=factor, device="gpu")])
        res = simulate(run, effects=gpu)
        (s,) = summarize(run, res)
        last = int(res.end_ns[0][res.timed[0] & ~run.ranks[0].is_cpu].max()) - run.manifest.steps[0].start_ns
        steps.append((s.step_time_ns // US, last // US))
    assert steps == [(1000, 860), (1365, 1365), (2665, 2665)]


def test_a_step_marked_to_end_with_its_last_kernel_ends_with_that_kernel_when_the_gpu_runs_faster(
    tmp_path: Path,
) -> None:
    from skewlens.replay.simulate import simulate
    from skewlens.replay.slowdown import Slowdown, SlowdownModel
    from skewlens.replay.summary import summarize

    # ProfilerStep#1 ends at 860 us, as div's kernel does: no host time after the GPU's end, so with the
    # kernels at half their length the step ends when div's kernel now does (not at 860 us, where the host's
    # last op, ended at 680 us, would put it)
    import_traces([_write_trace(tmp_path / "trace.json", step_us=860)], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    got = []
    for factor in (1.0, 0.5):
        gpu = SlowdownModel([Slowdown(kind="compute", ranks=(0,), factor=factor, device="gpu")])
        res = simulate(run, effects=gpu)
        (s,) = summarize(run, res)
        last = int(res.end_ns[0][res.timed[0] & ~run.ranks[0].is_cpu].max()) - run.manifest.steps[0].start_ns
        got.append((s.step_time_ns, last))
    assert got[0] == (860 * US, 860 * US)
    assert got[1][0] == got[1][1] < 860 * US


def test_the_replays_gpu_table_says_what_bounds_the_slowest_ranks_step() -> None:
    from skewlens.replay.render import bound_note
    from skewlens.replay.render import gpu_idle_table as replay_gpu_table
    from skewlens.replay.summary import SummaryRecord

    def row(
        rank: int, step_ms: float, busy: float, launch: float, comm: float, other: float
    ) -> SummaryRecord:
        ms = 1_000_000
        return SummaryRecord(
            rank=rank, source_rank=rank, step=1, step_time_ns=round(step_ms * ms), recorded_step_ns=0,
            compute_ns=0, comm_ns=0, wait_ns=0, exposed_wait_ns=0, exposed_transfer_ns=0, gpu_stream=7,
            gpu_busy_ns=round(busy * ms), gpu_idle_ns=round((step_ms - busy) * ms),
            gpu_launch_wait_ns=round(launch * ms), gpu_comm_wait_ns=round(comm * ms),
            gpu_other_ns=round(other * ms),
        )  # fmt: skip

    # the 8-GPU DLRM trace's rank 3: a bandwidth sweep's step did not move, and nothing said why
    host = [row(0, 12.5, 1.0, 9.2, 0.8, 1.5), row(3, 18.712, 1.020, 9.569, 6.554, 1.569)]
    assert replay_gpu_table(host).caption == (  # type: ignore[union-attr]
        "rank 3, the rank with the longest mean step (18.712 ms): its stream ran 1.020 ms and waited "
        "9.569 ms for launches, 6.554 ms for communication: host-bound (GPU work, communication included, "
        "lengthens the step only where it outlasts the host's launches)"
    )
    assert bound_note([row(3, 58.206, 1.020, 9.009, 46.725, 1.452)]) == (
        "rank 3, the rank with the longest mean step (58.206 ms): its stream ran 1.020 ms and waited "
        "46.725 ms for communication, 9.009 ms for launches: bound by communication (transfers, and waits "
        "for peers)"
    )
    assert str(bound_note([row(0, 10, 9, 0.5, 0.2, 0.3)])).endswith(": GPU-bound (its kernels set the step)")
    # idle mostly for nothing known: the figures, no verdict
    assert str(bound_note([row(0, 10, 1, 2, 0, 7)])).endswith("waited 2.000 ms for launches")
    # of three waits, the two largest are named; the stream wait (the rest) decides the verdict
    streams = row(0, 10, 1, 1, 2, 0)
    streams = dataclasses.replace(streams, gpu_stream_wait_ns=6 * 1_000_000)
    assert bound_note([streams]) == (
        "rank 0, the rank with the longest mean step (10.000 ms): its stream ran 1.000 ms and waited "
        "6.000 ms for other streams, 2.000 ms for communication: bound by work on other streams"
    )
    # more ranks than shown: both notes, the count first
    assert replay_gpu_table(host, max_ranks=1).caption == (  # type: ignore[union-attr]
        "2 GPU ranks: the 1 whose stream idled the most; rank 3, the rank with the longest mean step "
        "(18.712 ms): its stream ran 1.020 ms and waited 9.569 ms for launches, 6.554 ms for communication: "
        "host-bound (GPU work, communication included, lengthens the step only where it outlasts the host's "
        "launches)"
    )


def test_a_cpu_replay_has_no_gpu_columns_nor_table(tmp_path: Path) -> None:
    from skewlens.replay.render import gpu_idle_table as replay_gpu_table
    from skewlens.replay.simulate import simulate
    from skewlens.replay.summary import summarize

    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
    run = load_run(b.write(tmp_path / "run"))
    rows = summarize(run, simulate(run))
    assert {(r.gpu_stream, r.gpu_busy_ns, r.gpu_idle_ns) for r in rows} == {(-1, 0, 0)}
    assert replay_gpu_table(rows) is None


def test_a_replay_summary_written_before_the_gpu_columns_reads_with_them_null(tmp_path: Path) -> None:
    from skewlens.profiler.store.schema import META_TABLE, META_VERSION, table_from_records, write_table
    from skewlens.replay.summary import SummaryRecord

    row = SummaryRecord(
        rank=0, source_rank=0, step=1, step_time_ns=10, recorded_step_ns=10, compute_ns=5, comm_ns=0,
        wait_ns=0, exposed_wait_ns=0, exposed_transfer_ns=0, gpu_stream=7, gpu_busy_ns=4, gpu_idle_ns=6,
    )  # fmt: skip
    gpu = [f for f in dataclasses.asdict(row) if f.startswith("gpu_")]
    old = table_from_records(SummaryRecord, [row], "summary").drop_columns(gpu)
    f = write_table(
        old.replace_schema_metadata({META_VERSION: b"5", META_TABLE: b"summary"}), tmp_path / "v5.parquet"
    )
    got = read_table(f, SummaryRecord).to_pylist()
    assert got == [{**dataclasses.asdict(row), **dict.fromkeys(gpu)}]


def test_a_step_breakdown_written_before_the_gpu_busy_column_reads_with_it_null(tmp_path: Path) -> None:
    from skewlens.analysis.records import StepBreakdownRecord
    from skewlens.profiler.store.schema import META_TABLE, META_VERSION, table_from_records, write_table

    row = StepBreakdownRecord(
        rank=0, step=1, start_ns=0, end_ns=10, step_ns=10, compute_ns=5, exposed_wait_ns=0,
        exposed_transfer_ns=0, overlapped_comm_ns=0, gpu_compute_ns=4, idle_ns=5, gpu_comm_ns=2,
        gpu_comm_overlap_ns=1, gpu_busy_ns=6,
    )  # fmt: skip
    current = table_from_records(StepBreakdownRecord, [row], "step_breakdown")
    assert read_table(write_table(current, tmp_path / "v9.parquet"), StepBreakdownRecord).to_pylist() == [
        dataclasses.asdict(row)
    ]
    old = current.drop_columns(["gpu_busy_ns"])
    meta = {META_VERSION: b"8", META_TABLE: b"step_breakdown"}
    f = write_table(old.replace_schema_metadata(meta), tmp_path / "v8.parquet")
    got = read_table(f, StepBreakdownRecord).to_pylist()
    assert got == [{**dataclasses.asdict(row), "gpu_busy_ns": None}]
    picked = read_table(f, StepBreakdownRecord, columns=["step", "gpu_busy_ns"])
    assert picked.to_pylist() == [{"step": 1, "gpu_busy_ns": None}]


@pytest.mark.parametrize(("device", "host_x", "gpu_x"), [("gpu", 1, 2), ("host", 2, 1), ("any", 2, 2)])
def test_a_slowdown_on_the_gpu_or_the_host_scales_only_that_sides_ops(
    tmp_path: Path, device: str, host_x: int, gpu_x: int
) -> None:
    from skewlens.replay.execution import compute_rows, execution_model
    from skewlens.replay.simulate import simulate
    from skewlens.replay.slowdown import Slowdown, SlowdownModel

    # one slow GPU: its kernels take twice as long while its host's Python runs as recorded (before, a
    # compute slowdown of a GPU rank slowed both)
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    rt = run.ranks[0]
    res = simulate(
        run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(0,), factor=2.0, device=device)])
    )
    dur = res.end_ns[0] - res.start_ns[0]
    comp = compute_rows(rt, execution_model(run).ranks[0])
    for side, x in ((rt.is_cpu, host_x), (~rt.is_cpu, gpu_x)):
        rows = comp & side & (rt.dur_ns > 0)
        assert rows.any() and (dur[rows] == x * rt.dur_ns[rows]).all()


def test_a_slow_gpu_on_a_cpu_run_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
    run_dir = b.write(tmp_path / "run")
    out = tmp_path / "out"
    assert main(["replay", f"trace={run_dir}", f"out={out}", "slowdown=slow_gpu", "slowdown.rank=1"]) == 2
    err = capsys.readouterr().err
    assert "slowdown.entries[0].device: rank 1 has no compute GPU ops" in err and "would slow nothing" in err
    # on every rank: it read "any rank has no compute GPU ops"
    every = "slowdown.entries=[{kind:compute,factor:2,device:gpu}]"
    args = ["replay", f"trace={run_dir}", f"out={out}", every]
    assert main(args) == 2
    assert "slowdown.entries[0].device: no rank has compute GPU ops (a CPU trace?)" in capsys.readouterr().err


def test_the_slow_gpu_preset_says_what_it_slowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    out = tmp_path / "out"
    argv = ["replay", f"trace={tmp_path / 'run'}", f"out={out}", "slowdown=slow_gpu", "slowdown.rank=0"]
    assert main([*argv, "slowdown.factor=2"]) == 0
    text = capsys.readouterr().out
    assert "slowdown slow_gpu: compute x2 (GPU ops) on rank 0" in text
    (row,) = read_table(out / "summary.parquet").to_pylist()
    assert row["gpu_busy_ns"] == 1000 * US  # the compute stream's one kernel, 500 us recorded


def test_the_gpu_kernels_table_sums_each_ops_time_and_count_by_kind(tmp_path: Path) -> None:
    from skewlens.analysis.render import gpu_kernels_table

    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    assert main(["analyze", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--no-blame"]) == 0
    rows = read_table(tmp_path / "out" / "gpu_kernels.parquet").to_pylist()
    got = {(r["name"][:4], r["kind"]): (r["kernels"], r["total_ns"], r["steps"]) for r in rows}
    assert got == {
        ("add", "compute"): (1, 500 * US, 1),
        ("nccl", "communication"): (1, 200 * US, 1),
        ("gemm", "compute"): (1, 100 * US, 1),
        ("mul", "compute"): (1, 100 * US, 1),
        ("relu", "compute"): (1, 50 * US, 1),
        ("div", "compute"): (1, 50 * US, 1),
    }
    assert rows[0]["name"] == "add"  # the most time first
    table = gpu_kernels_table(analyze_run(load_trace(tmp_path / "run"), blame=False), top=2)
    assert table is not None and table.row_count == 2
    console = Console(width=200, record=True)
    console.print(table)
    lines = [
        " ".join(c.strip() for c in line.strip("│ ").split("│"))
        for line in console.export_text().splitlines()
    ]
    assert [c.header for c in table.columns] == [
        "kernel",
        "kind",
        "ranks",
        "ms / step",
        "count / step",
        "%",
    ]
    # add: 0.50 ms a step of 1.00 ms of GPU ops in all (50%); the NCCL kernel 0.20 ms (20%)
    assert "add compute 1 0.500 1.0 50.0" in lines
    assert any(
        line.startswith("ncclDevKernel_SendRecv") and line.endswith("communication 1 0.200 1.0 20.0")
        for line in lines
    )


def test_the_gpu_kernels_table_counts_only_the_kernels_of_the_recorded_steps(tmp_path: Path) -> None:
    # after ProfilerStep#1 (0-1000 us) an op at 1100 us launches kernel "zero" (stream 7): in no step
    path = _write_trace(tmp_path / "trace.json")
    doc = json.loads(path.read_text())

    def x(cat: str, name: str, tid: int, ts: int, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": int(cat == "kernel"), "tid": tid, "ts": ts,
                "dur": 20, "args": args}  # fmt: skip

    doc["traceEvents"] += [
        x("cpu_op", "aten::zero_", 1, 1100, **{"External id": 200}),
        x("cuda_runtime", "cudaLaunchKernel", 1, 1102, correlation=50),
        x("kernel", "zero", 7, 1110, device=0, stream=7, correlation=50),
    ]
    path.write_text(json.dumps(doc))
    import_traces([path], None, tmp_path / "run")
    got = {g.name[:4] for g in analyze_run(load_trace(tmp_path / "run"), blame=False).gpu_kernels}
    assert got == {"gemm", "add", "relu", "mul", "nccl", "div"}


def test_the_top_kernels_are_ranked_by_time_summed_over_ranks_with_a_steps_time_the_mean_over_ranks() -> None:
    from skewlens.analysis.gpu_kernels import top_kernels
    from skewlens.analysis.records import GpuKernelRecord

    def rec(rank: int, name: str, kernels: int, total_us: int, steps: int) -> GpuKernelRecord:
        return GpuKernelRecord(rank=rank, name=name, kind="compute", kernels=kernels, total_ns=total_us * US,
                               steps=steps)  # fmt: skip

    # gemm: 400 us over rank 0's 2 steps (200 a step) and 600 us over rank 1's 2 (300 a step): 1,000 us in
    # all, 250 us a step on a rank that ran it (the mean), (4/2 + 3/2) / 2 = 1.75 kernels a step;
    # add: 1,200 us over rank 0's 6 steps (200 a step, less than gemm's 500 summed over ranks): first
    records = [rec(0, "gemm", 4, 400, 2), rec(1, "gemm", 3, 600, 2), rec(0, "add", 6, 1_200, 6)]
    add, gemm = top_kernels(records, 2)
    assert (add.name, add.ranks, add.per_step_ns, add.kernels_per_step) == ("add", 1, 200 * US, 1.0)
    assert (gemm.name, gemm.ranks, gemm.per_step_ns, gemm.kernels_per_step) == ("gemm", 2, 250 * US, 1.75)
    assert (add.share, gemm.share) == (1_200 / 2_200, 1_000 / 2_200)


def test_the_breakdown_gives_the_gpus_communication_and_the_part_of_it_under_compute_kernels(
    tmp_path: Path,
) -> None:
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    (b,) = analyze_run(load_trace(tmp_path / "run"), blame=False).breakdown
    # the NCCL kernel 600-800 us; compute kernels then: mul 555-655 (add ended at 550, div starts at 810)
    assert (b.gpu_comm_ns, b.gpu_comm_overlap_ns) == (200 * US, 55 * US)
    assert b.gpu_compute_ns == (530 + 100 + 50) * US  # 20-550 (gemm, add, relu inside it), mul, div


def test_the_breakdown_gives_the_time_any_stream_of_the_gpu_ran_an_op_copies_and_memsets_included(
    tmp_path: Path,
) -> None:
    path = _write_trace(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    evs = doc["traceEvents"]

    def host(name: str, ts: int, dur: int, **args: Any) -> None:
        evs.append({"ph": "X", "cat": args.pop("cat"), "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                    "args": args})  # fmt: skip

    def gpu(cat: str, name: str, stream: int, ts: int, dur: int, corr: int) -> None:
        args = {"device": 0, "stream": stream, "correlation": corr}
        evs.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                    "args": args})  # fmt: skip

    # a copy on stream 9 at 545-560 (over add's end at 550 and mul's start at 555: the GPU's gap 550-555 is
    # filled) and a memset on stream 7 at 900-920, after every other op
    host("aten::copy_", 500, 10, cat="cpu_op", **{"External id": 200})
    host("cudaMemcpyAsync", 502, 2, cat="cuda_runtime", correlation=200)
    gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 9, 545, 15, 200)
    host("aten::zero_", 690, 10, cat="cpu_op", **{"External id": 201})
    host("cudaMemsetAsync", 692, 2, cat="cuda_runtime", correlation=201)
    gpu("gpu_memset", "Memset (Device)", 7, 900, 20, 201)
    path.write_text(json.dumps(doc))
    import_traces([path], None, tmp_path / "run")
    res = analyze_run(load_trace(tmp_path / "run"), blame=False)
    (b,) = res.breakdown
    # the ops of streams 7, 8, 9 and 20 (NCCL) cover 20-800 (gemm 20-120, add 50-550, copy 545-560, mul
    # 555-655, the NCCL kernel 600-800), div 810-860 and the memset 900-920; the GPU ran nothing 0-20,
    # 800-810, 860-900 and 920-1000
    assert b.gpu_busy_ns == (780 + 50 + 20) * US
    assert b.step_ns - b.gpu_busy_ns == (20 + 10 + 40 + 80) * US
    assert b.gpu_compute_ns == (530 + 100 + 50) * US  # copies and memsets are not compute
    # no stream alone was that busy: the busy time is the union over streams, not any stream's
    assert max(g.busy_ns for g in res.gpu_idle) < b.gpu_busy_ns
    # the report gives the GPU's idle time per step (ms), as HTA's temporal breakdown counts idle; on a
    # terminal of 100 columns with every header whole (it took 117: 'compu…', 'trans…', 'kerne…' at 100),
    # the one step in the title, the share of GPU comm under compute kernels beside it
    console = Console(width=100, record=True)
    console.print(breakdown_table(res))
    text = console.export_text()
    assert "…" not in text and max(len(line.rstrip()) for line in text.splitlines()) <= 100
    assert text.startswith("Step breakdown per rank (mean ms per step over 1 step)")
    header = next(line for line in text.splitlines() if "GPU idle" in line)
    names = [c.strip() for c in header.strip().strip("┃").split("┃")]
    assert names == [
        "rank", "step", "compute", "wait", "xfer", "overlap", "idle", "GPU kernels", "GPU comm", "GPU idle"
    ]  # fmt: skip
    row = next(line for line in text.splitlines() if line.strip().startswith("│    0"))
    cells = dict(zip(names, row.strip().strip("│").split("│"), strict=True))
    assert {k: cells[k].strip() for k in ("GPU kernels", "GPU comm", "GPU idle")} == {
        "GPU kernels": "0.680",
        "GPU comm": "0.200 (28%)",  # of the NCCL kernel's 600-800, mul's 555-655 covers 55
        "GPU idle": "0.150",
    }
    caption = " ".join(text.split())
    for said in ("wait, xfer: communication not under compute", "overlap: communication under compute"):
        assert said in caption
    # on a narrower terminal the GPU comm cell's share goes under its figure, which stays whole as every
    # other figure does (kept on one line, the cell took the room the others' figures then folded in); a
    # GPU that ran no communication reads 0.000 as the other times do
    narrow = Console(width=72, record=True)
    narrow.print(breakdown_table(res))
    narrow_text = narrow.export_text()
    row = next(ln for ln in narrow_text.splitlines() if ln.startswith("│    0"))
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "0", "1.000", "0.745", "0.000", "0.115", "0.085", "0.140", "0.680", "0.200", "0.150"
    ]  # fmt: skip
    assert "(28%)" in narrow_text
    res.breakdown = [dataclasses.replace(b, gpu_comm_ns=0, gpu_comm_overlap_ns=0)]
    console = Console(width=100, record=True)
    console.print(breakdown_table(res))
    row = next(line for line in console.export_text().splitlines() if line.strip().startswith("│    0"))
    cells = dict(zip(names, row.strip().strip("│").split("│"), strict=True))
    assert cells["GPU comm"].strip() == "0.000"
    # a rank left out of the table (max_ranks) with other steps: no one number of steps for the title
    res.breakdown = [b, dataclasses.replace(b, rank=1), dataclasses.replace(b, rank=1, step=1)]
    t = breakdown_table(res, max_ranks=1)
    assert t.title == "Step breakdown per rank (mean ms per step)" and str(t.columns[1].header) == "steps"


@pytest.mark.parametrize(
    ("memcpy", "memset"),
    [
        (("gpu_memcpy", "Memcpy DtoD (Device -> Device)"), ("gpu_memset", "Memset (Device)")),
        # ROCm runs them as ROCclr's blit kernels, which its Kineto records as kernels (a ".kd" at times)
        (("kernel", "__amd_rocclr_copyBuffer"), ("kernel", "__amd_rocclr_fillBufferAligned.kd")),
    ],
)
def test_a_rocm_copy_or_memset_run_as_a_blit_kernel_is_memory_work_as_cudas_are_not_compute(
    tmp_path: Path, memcpy: tuple[str, str], memset: tuple[str, str]
) -> None:
    # a copy on stream 9 at 545-560 and a memset on stream 7 at 900-920; ROCm's blit kernels were compute:
    # 0.705 ms of GPU kernels where CUDA's copy and memset leave 0.680 (the copy's 5 us between add and mul,
    # the memset's 20)
    path = _write_trace(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    for (cat, name), call, op, stream, ts, dur, corr in (
        (memcpy, "hipMemcpyAsync", "aten::copy_", 9, 545, 15, 200),
        (memset, "hipMemsetAsync", "aten::zero_", 7, 900, 20, 201),
    ):
        doc["traceEvents"] += [
            {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": ts - 45, "dur": 10,
             "args": {"External id": corr}},
            {"ph": "X", "cat": "cuda_runtime", "name": call, "pid": 1, "tid": 1, "ts": ts - 43, "dur": 2,
             "args": {"correlation": corr}},
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
             "args": {"device": 0, "stream": stream, "correlation": corr}},
        ]  # fmt: skip
    path.write_text(json.dumps(doc))
    import_traces([path], None, tmp_path / "run")
    res = analyze_run(load_trace(tmp_path / "run"), blame=False)
    (b,) = res.breakdown
    assert (b.gpu_compute_ns, b.gpu_busy_ns) == ((530 + 100 + 50) * US, (780 + 50 + 20) * US)
    kinds = {g.name: g.kind for g in res.gpu_kernels}
    assert (kinds[memcpy[1]], kinds[memset[1]]) == ("memory", "memory")


#: ROCclr's blit kernels (BlitName in its blit manager), at times with a ".kd": those that copy or fill, and
#: those that do neither (stream memory operations, the device scheduler, GWS and heap set-up).
ROCCLR_MEMORY = [
    "copyBuffer",
    "copyBufferAligned.kd",
    "copyBufferRect",
    "copyBufferRectAligned",
    "copyBufferToImage",
    "copyImage",
    "copyImage1DA",
    "copyImageToBuffer",
    "fillBufferAligned",
    "fillBufferAligned.kd",
    "fillBufferAligned2D",
    "fillImage",
]
ROCCLR_OTHER = ["streamOpsWrite", "streamOpsWait", "scheduler", "gwsInit", "initHeap"]


@pytest.mark.parametrize(
    ("kernel", "memory"),
    [(f"__amd_rocclr_{k}", True) for k in ROCCLR_MEMORY]
    + [(f"__amd_rocclr_{k}", False) for k in ROCCLR_OTHER]
    + [("Cijk_Alik_Bljk_SB_MT64x16x32", False)],
)
def test_rocclrs_copy_and_fill_blit_kernels_are_memory_work_and_its_other_blit_kernels_are_not(
    kernel: str, memory: bool
) -> None:
    # a narrower table left hipMemset2DAsync's fillBufferAligned2D and the image copies compute; a broader
    # one ("__amd_rocclr_") made hipStreamWaitValue's streamOpsWait memory work
    assert names_gpu_memory_op(kernel) is memory


def test_a_cpu_runs_breakdown_has_no_gpu_communication(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=1024, dur_ns=100_000)
    rows = analyze_run(load_run(b.write(tmp_path / "run")), blame=False).breakdown
    assert {(x.gpu_comm_ns, x.gpu_comm_overlap_ns) for x in rows} == {(0, 0)}


def test_the_replay_timeline_draws_the_compute_streams_idle_pieces_by_what_each_waited_for(
    tmp_path: Path,
) -> None:
    from skewlens.replay.outputs import write_perfetto
    from skewlens.replay.simulate import simulate

    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    doc = json.loads(write_perfetto(run, simulate(run), tmp_path / "t.json", idle_streams={0: 7}).read_text())
    (track,) = (
        e["tid"] for e in doc["traceEvents"] if e["ph"] == "M" and "idle" in e["args"].get("name", "")
    )
    pieces = [
        (e["name"], round(e["ts"]), round(e["dur"]))
        for e in doc["traceEvents"]
        if e.get("cat") == "gpu_idle" and e["tid"] == track
    ]
    # stream 7 as the analysis splits it (µs from the rank's first start, aten::mm at 10): the launch of
    # gemm (10-12), then relu's (120-305); the add on stream 8 (360-550); the NCCL kernel (655-800); and
    # after each, other (the latency to the kernel's start); nothing after the last op
    assert sorted(pieces, key=lambda p: p[1]) == [
        ("idle: launch wait", 0, 2),
        ("idle: other", 2, 8),
        ("idle: launch wait", 110, 185),
        ("idle: other", 295, 5),
        ("idle: stream wait", 350, 190),
        ("idle: other", 540, 5),
        ("idle: comm wait", 645, 145),
        ("idle: other", 790, 10),
    ]


@pytest.mark.parametrize(("cap", "idle_named"), [(1, False), (3, True)])  # 1: aten::mm alone is kept
def test_a_capped_replay_timeline_names_the_idle_track_only_where_a_piece_of_it_is_kept(
    tmp_path: Path, cap: int, idle_named: bool
) -> None:
    from skewlens.replay.outputs import write_perfetto
    from skewlens.replay.simulate import simulate

    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    path = write_perfetto(run, simulate(run), tmp_path / "t.json", idle_streams={0: 7}, max_events=cap)
    ev = json.loads(path.read_text())["traceEvents"]
    named = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(named) == {e["tid"] for e in ev if e["ph"] == "X"}
    assert ("GPU stream 7: idle, by what it waited for" in named.values()) == idle_named


def test_a_replay_of_a_gpu_run_draws_its_compute_streams_idle_on_a_track_of_its_own(tmp_path: Path) -> None:
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    assert main(["replay", f"trace={tmp_path / 'run'}", f"out={tmp_path / 'out'}", "progress=false"]) == 0
    doc = json.loads((tmp_path / "out" / "timeline.json").read_text())
    names = {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["name"] == "thread_name" and e["pid"] == 0
    }
    (track,) = (t for t, n in names.items() if n == "GPU stream 8: idle, by what it waited for")
    # a tid of its own: no stream's track shares it
    named = [e["tid"] for e in doc["traceEvents"] if e["name"] == "thread_name" and e["pid"] == 0]
    assert named.count(track) == 1
    on_8 = {e["args"]["node_id"] for e in doc["traceEvents"] if e.get("tid") == 8 and e["ph"] == "X"}
    idle = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_idle"]
    assert idle and all(e["tid"] == track and e["args"]["node_id"] in on_8 for e in idle)


def test_a_gpu_idle_table_written_before_schema_7_reads_with_queued_idle_null(tmp_path: Path) -> None:
    from skewlens.analysis.records import GpuIdleRecord
    from skewlens.profiler.store.schema import META_TABLE, META_VERSION, table_from_records, write_table

    row = GpuIdleRecord(
        rank=0, step=1, stream=7, step_ns=10, busy_ns=4, compute_ns=4, idle_ns=6, ops=1, launch_wait_ns=1,
        comm_wait_ns=2, stream_wait_ns=0, other_ns=3, queued_idle_ns=2,
    )  # fmt: skip
    old = table_from_records(GpuIdleRecord, [row], "gpu_idle").drop_columns(["queued_idle_ns"])
    f = write_table(
        old.replace_schema_metadata({META_VERSION: b"6", META_TABLE: b"gpu_idle"}), tmp_path / "v6.parquet"
    )
    assert read_table(f, GpuIdleRecord).to_pylist() == [{**dataclasses.asdict(row), "queued_idle_ns": None}]
    (means,) = compute_streams([dataclasses.replace(row, queued_idle_ns=None)])
    assert means.queued_ns == 0


def test_the_verdict_says_how_much_of_the_other_time_the_gpu_ran_nothing_with_work_queued() -> None:
    from skewlens.analysis.gpu_idle import verdict

    stream = StreamMeans(
        rank=0, stream=7, steps=1, step_ns=100.0, busy_ns=20.0, compute_ns=20.0, idle_ns=80.0,
        parts_ns=(10.0, 10.0, 0.0, 60.0), queued_ns=45.0,
    )  # fmt: skip
    line = verdict([stream])
    assert line is not None and "of the other, 75% their whole GPU ran nothing" in line
    assert "of the other" not in (verdict([dataclasses.replace(stream, queued_ns=0.0)]) or "")


def test_the_gpu_kernels_table_on_an_80_column_terminal_cuts_the_names_and_keeps_the_figures(
    tmp_path: Path,
) -> None:
    # every column no_wrap: rich cut them all alike, `ranks` and `%` to nothing and `ms / step` to `0…`
    from skewlens.analysis.render import gpu_kernels_table

    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    table = gpu_kernels_table(analyze_run(load_trace(tmp_path / "run"), blame=False), top=2)
    assert table is not None
    console = Console(width=80, record=True)
    console.print(table)
    rows = [line for line in console.export_text().splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in row.split("│")[1:-1]] for row in rows]
    assert [c[1:] for c in cells] == [
        ["compute", "1", "0.500", "1.0", "50.0"],
        ["communication", "1", "0.200", "1.0", "20.0"],
    ]
    assert cells[1][0] == "ncclDevKernel_Sen…"
    assert all(len(row) <= 80 for row in rows)


@pytest.mark.parametrize("columns", [50, 60])
def test_the_gpu_kernels_table_on_a_narrow_terminal_keeps_its_kernel_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    # with the figures no_wrap, the name column was the only one rich narrowed, to nothing: at 60 columns
    # the table had no `kernel` header and no kernel names, only kind, ranks, ms / step, count / step, %
    from skewlens.analysis.render import gpu_kernels_table

    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    table = gpu_kernels_table(analyze_run(load_trace(tmp_path / "run"), blame=False), top=2)
    assert table is not None
    monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    report_console().print(table)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= columns for line in lines)
    headers = [c.strip() for line in lines if line.startswith("┃") for c in line.split("┃")[1:-1]]
    assert any(h.startswith("kern") for h in headers)
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    names = [c[0] for c in cells if c[0]]
    assert names[0] == "add" and names[1].startswith("nccl") and len(names) == 2
    assert [c[-1] for c in cells if c[-1]] == ["50.0", "20.0"]  # at 50 columns it was `5…` and `2…`


def _gpu_idle_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """The analysis of :func:`_write_trace`'s run, and the figure of its ``gpu_idle.png``."""
    drawn = drawn_figures(monkeypatch)
    import_traces([_write_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    res = analyze_run(load_trace(tmp_path / "run"), blame=False)
    gpu_idle_bars(res, tmp_path / "g.png")
    return res, drawn[0]


def test_the_gpu_idle_picture_is_read_without_telling_its_colours_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # busy (seaborn's blue) and stream wait (its purple) were 3 apart to a protanope, launch wait's red and
    # comm wait's orange 21 to a deuteranope; the legend read top to bottom in the order drawn, bottom to top
    _res, fig = _gpu_idle_figure(tmp_path, monkeypatch)
    assert_read_without_colour_names(fig, ["busy", "launch wait", "comm wait", "stream wait", "other"])


def test_the_gpu_idle_picture_says_its_finding_in_words_under_the_axis_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the picture said only by the bars' colours what the streams waited for; a note under it, placed a
    # fixed 42 points below the axis, ran over the axis' label under the two-line `rank (stream)` ticks
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from skewlens.analysis.gpu_idle import verdict

    res, fig = _gpu_idle_figure(tmp_path, monkeypatch)
    said = verdict(compute_streams(res.gpu_idle))
    assert said is not None and said.startswith("the compute streams idled")
    ax = fig.axes[0]
    (note,) = [t for t in ax.texts if t.get_text() == said]
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    assert note.get_window_extent(renderer).y1 < ax.xaxis.label.get_window_extent(renderer).y0
