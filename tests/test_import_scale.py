"""``skewlens import`` at scale: the fast JSON path, the direct node encoding, parallel ranks in a budget."""

from __future__ import annotations

import gzip
import json
import random
import re
import tarfile
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.chakra_io import TraceNode, encode_message, to_proto
from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.importers import run as run_mod
from skewlens.profiler.importers.convert import _Intervals
from skewlens.profiler.importers.encode import NodeEncoder, id_and_time_fields
from skewlens.profiler.importers.kineto import ARGS_READ, KEvent, load_kineto, parse_kineto
from skewlens.profiler.importers.sources import TraceFile, text_size_estimate
from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run
from skewlens.profiler.vocab import Attr, NodeType

SPEC = GpuRunSpec(world_size=4, layers=4, steps=2)


def _import(inputs: list[Path], out: Path, **kw: Any) -> dict[str, bytes]:
    """Import and return every file of the run directory (the manifest parsed, the .et files as bytes)."""
    run_mod.import_traces(inputs, None, out, **kw)
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    files["manifest.json"] = json.dumps(json.loads(files["manifest.json"]), sort_keys=True).encode()
    return files


def _spy_workers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record how many workers each conversion pass was planned with (machines of 8 cores)."""
    seen: list[int] = []
    real = run_mod._run_all

    def spy(fn: Any, jobs: Any, workers: int, advance: Any) -> Any:
        seen.append(workers)
        return real(fn, jobs, workers, advance)

    monkeypatch.setattr(run_mod, "_run_all", spy)
    monkeypatch.setattr(run_mod, "usable_cores", lambda: 8)
    return seen


def test_the_node_encoder_writes_the_bytes_protobuf_writes() -> None:
    rng = random.Random(7)
    values: list[Any] = [0, 1, -1, 127, 128, 2**14, 2**62, -(2**63), 2**63 - 1, True, False, "", "ü€", [3, 1],
                         [], [-5], 0.25, ["a", "b"]]  # fmt: skip
    enc = NodeEncoder()
    for _ in range(3000):
        keys = ["a", Attr.STREAM, Attr.LAUNCH_NS, Attr.SEQ, Attr.STEP, "ä", Attr.COMM_SRC, Attr.COMM_TAG]
        node = TraceNode(
            node_id=rng.choice([0, 1, 300, 2**40]),
            name=rng.choice(["", "aten::mm", "ncclDevKernel_AllReduce", "ß"]),
            node_type=rng.choice(list(NodeType)),
            start_ns=rng.choice([0, 999, 1000, -5, 1_700_000_000_000_000_000 + rng.randint(0, 10**9)]),
            dur_ns=rng.choice([0, 5, 1234, 10**12]),
            ctrl_deps=tuple(rng.randint(0, 10**6) for _ in range(rng.randint(0, 3))),
            data_deps=tuple(rng.randint(0, 10**3) for _ in range(rng.randint(0, 2))),
            attrs={rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 5))},
        )
        mine = enc.encode(
            node_id=node.node_id,
            name=node.name,
            node_type=node.node_type,
            start_ns=node.start_ns,
            dur_ns=node.dur_ns,
            ctrl_deps=node.ctrl_deps,
            data_deps=node.data_deps,
            attrs=node.attrs,
        )
        assert mine == encode_message(to_proto(node)), node


def test_the_id_and_time_fields_of_a_whole_rank_are_the_bytes_of_the_node_by_node_encoding() -> None:
    rng = random.Random(3)
    times = [0, 1, 999, 1000, 1001, -1, -(2**63), 2**63 - 1, 2**40, 1_700_000_000_123_456_789]
    n = 500
    ids = [rng.choice([0, 1, 127, 128, 2**14, 2**40]) for _ in range(n)]
    start = [rng.choice(times) + rng.randint(0, 3) * (rng.random() < 0.5) for _ in range(n)]
    start = [min(t, 2**63 - 1) for t in start]
    dur = [rng.choice([0, 5, 999, 1000, 123_456, 2**50]) for _ in range(n)]
    fields = id_and_time_fields(ids, start, dur)
    assert fields is not None
    enc = NodeEncoder()
    for k in range(n):
        kw: dict[str, Any] = {"node_id": ids[k], "start_ns": start[k], "dur_ns": dur[k], "ctrl_deps": (k,)}
        kw |= {"name": "aten::mm", "node_type": NodeType.COMP, "data_deps": (), "attrs": {Attr.STREAM: 7}}
        assert enc.encode(**kw, fields=fields[k]) == enc.encode(**kw)
    assert id_and_time_fields([1], [2**63], [0]) is None  # beyond int64: encoded (and refused) node by node
    assert id_and_time_fields([-1], [0], [0]) is None  # a negative id: likewise


@pytest.mark.parametrize(
    ("node_id", "ctrl_deps", "data_deps"), [(-1, (), ()), (1, (-3,), ()), (1, (), (-2,)), (1, (2**64,), ())]
)
def test_a_node_id_or_dependency_outside_uint64_is_refused_as_protobuf_refuses_it(
    node_id: int, ctrl_deps: tuple[int, ...], data_deps: tuple[int, ...]
) -> None:
    # a negative one was written as the varint of another id (-1: 16383), a dependency on another node
    kw: dict[str, Any] = {"name": "x", "node_type": NodeType.COMP, "start_ns": 0, "dur_ns": 0, "attrs": {}}
    node = TraceNode(node_id=node_id, ctrl_deps=ctrl_deps, data_deps=data_deps, **kw)
    with pytest.raises(ValueError, match=r"out of range") as protobuf:
        encode_message(to_proto(node))
    with pytest.raises(ValueError, match=re.escape(str(protobuf.value))):
        NodeEncoder().encode(node_id=node_id, ctrl_deps=ctrl_deps, data_deps=data_deps, **kw)


@pytest.mark.parametrize("key", ["a", Attr.RF_ID])  # a cached attribute, and a per-node one encoded inline
def test_an_int_attribute_beyond_int64_is_refused_as_protobuf_refuses_it(key: str) -> None:
    with pytest.raises(ValueError, match=r"out of range"):
        NodeEncoder().encode(node_id=1, name="x", node_type=NodeType.COMP, start_ns=0, dur_ns=0, ctrl_deps=(),
                             data_deps=(), attrs={key: 2**63})  # fmt: skip


def test_the_events_enclosing_many_times_at_once_are_those_found_one_by_one() -> None:
    rng = random.Random(7)
    events = []
    for i in range(400):  # nested, overlapping, touching and zero-length intervals on one thread
        start = rng.randrange(0, 2_000)
        events.append(
            KEvent(
                index=i,
                name="op",
                cat="cpu_op",
                pid=1,
                tid=1,
                start_ns=start,
                dur_ns=rng.choice([0, 3, 40, 900]),
                args={},
            )
        )
    iv = _Intervals(events)
    times = (
        [rng.randrange(-10, 3_000) for _ in range(2_000)]
        + [e.start_ns for e in events]
        + [e.end_ns for e in events]
    )
    found = iv.enclosing_all(times)
    assert found == [iv.enclosing(t) for t in times]
    assert sum(e is None for e in found) > 0 and sum(e is not None for e in found) > 0
    assert iv.enclosing_all([]) == []


def test_the_fast_path_keeps_the_events_the_standard_parser_keeps(shared_traces: Path) -> None:
    for name in ("nccl_2gpu_rank0_kineto.json.gz", "cuda_event_sync_multistream_kineto.json.gz"):
        data = gzip.decompress((shared_traces / name).read_bytes())
        fast = load_kineto(data, Path(name), rank=0, max_bytes=len(data))
        slow = parse_kineto(json.loads(data), Path(name), rank=0)
        assert fast == slow
        assert len(fast.cpu_ops) + len(fast.gpu) > 0


def test_every_args_key_the_conversion_reads_is_decoded() -> None:
    import re

    import skewlens.profiler.importers as pkg

    read: set[str] = set()
    for f in Path(pkg.__file__).parent.glob("*.py"):
        code = f.read_text()
        read |= set(re.findall(r"args\.get\(\s*\"([^\"]+)\"", code))
        read |= set(re.findall(r"_arg\(\w+, \"([^\"]+)\"\)", code))
    assert {"correlation", "Input Dims", "wait_on_stream"} <= read  # the patterns find the reads
    assert read <= set(ARGS_READ)


def test_args_that_are_no_object_are_reported_by_the_standard_path(tmp_path: Path) -> None:
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1,
                            "dur": 2, "args": [1]}], "distributedInfo": {"rank": 0}}  # fmt: skip
    data = json.dumps(doc).encode()
    # it said 'has a malformed ts/dur/name', its ts, dur and name fine
    with pytest.raises(
        TraceImportError, match=r"k\.json: traceEvents\[0\] \(cpu_op\) has args that are not an"
    ):
        load_kineto(data, Path("k.json"), max_bytes=len(data))
    nan = data.replace(b'"ts": 1', b'"ts": NaN')
    with pytest.raises(TraceImportError, match=r"k\.json: not standard JSON \(contains NaN\)"):
        load_kineto(nan, Path("k.json"), max_bytes=len(nan))


def test_workers_are_planned_within_the_memory_budget_and_the_cores() -> None:
    mib = 1 << 20
    one = run_mod.worker_estimate(40 * mib)
    assert one == run_mod.WORKER_BASE_BYTES + 40 * mib * run_mod.WORKER_BYTES_PER_TEXT_BYTE
    assert run_mod.worker_estimate(40 * mib, 10 * mib) == one + 10 * mib * run_mod.HOST_BYTES_PER_TEXT_BYTE
    assert run_mod.plan_workers([one] * 32, budget_bytes=one * 3, cores=16) == 3
    assert run_mod.plan_workers([one] * 32, budget_bytes=one * 3, cores=2) == 2
    assert run_mod.plan_workers([one] * 2, budget_bytes=one * 30, cores=16) == 2
    # the largest job decides; one that alone exceeds the budget still runs, alone
    assert run_mod.plan_workers([mib, one], budget_bytes=one * 2 - 1, cores=16) == 1
    assert run_mod.plan_workers([100 * one], budget_bytes=one, cores=16) == 1


def test_the_text_size_of_a_gzip_file_is_read_from_its_trailer(tmp_path: Path) -> None:
    text = b'{"traceEvents": []}' * 1000
    (tmp_path / "a.json.gz").write_bytes(gzip.compress(text))
    (tmp_path / "a.json").write_bytes(text)
    assert text_size_estimate(tmp_path / "a.json.gz") == len(text)
    assert text_size_estimate(tmp_path / "a.json") == len(text)


def test_a_small_budget_converts_the_ranks_one_at_a_time_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_gpu_run(SPEC, tmp_path / "in")
    seen = _spy_workers(monkeypatch)
    m = run_mod.import_traces(
        [tmp_path / "in"], None, tmp_path / "run", workers=4, memory_budget_bytes=1 << 20
    )
    assert seen == [1]
    assert m.ranks == (0, 1, 2, 3)


def test_a_worker_that_died_is_an_error_naming_its_trace() -> None:
    fut: Future[Any] = Future()
    fut.set_exception(BrokenProcessPool("gone"))
    job = run_mod._Job(
        kineto=TraceFile(path=Path("/x/r3.json"), label=Path("in/r3.json")),
        host=None,
        rank=None,
        nodes_path=Path("/x/3.nodes"),
    )
    with pytest.raises(TraceImportError, match=r"in/r3\.json: the worker converting this trace .* died"):
        run_mod._result(fut, job)


@pytest.mark.parametrize(
    ("limit", "says"),
    [(3 << 30, " (the address space is limited to 3,072 MiB (ulimit -v))"), (None, "")],
    ids=["ulimit-v", "unlimited"],
)
def test_a_worker_out_of_memory_under_an_address_space_limit_says_the_limit(
    monkeypatch: pytest.MonkeyPatch, limit: int | None, says: str
) -> None:
    # a worker's MemoryError said only "out of memory" where ``ulimit -v`` was the reason; the conversion
    # in this process (one worker) said the limit, through the CLI's out_of_memory. Without one: nothing more
    import resource

    soft = resource.RLIM_INFINITY if limit is None else limit
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (soft, resource.RLIM_INFINITY))
    fut: Future[Any] = Future()
    fut.set_exception(MemoryError())
    job = run_mod._Job(
        kineto=TraceFile(path=Path("/x/r2.json"), label=Path("in/r2.json")),
        host=None,
        rank=None,
        nodes_path=Path("/x/2.nodes"),
    )
    with pytest.raises(TraceImportError) as e:
        run_mod._result(fut, job)
    assert str(e.value) == f"in/r2.json: out of memory while converting this trace{says}"


@pytest.mark.slow
def test_a_parallel_import_writes_the_same_run_as_a_serial_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "in"
    write_gpu_run(SPEC, src)
    budget = run_mod.worker_estimate(max(text_size_estimate(p) for p in src.iterdir())) * 2 + 1
    # every input form: a .json, .json.gz files and a tar archive, through the workers
    (src / "rank1_kineto.json").write_bytes(gzip.decompress((src / "rank1_kineto.json.gz").read_bytes()))
    (src / "rank1_kineto.json.gz").unlink()
    with tarfile.open(tmp_path / "r3.tar.gz", "w:gz") as tf:
        tf.add(src / "rank3_kineto.json.gz", arcname="traces/rank3_kineto.json.gz")
    (src / "rank3_kineto.json.gz").unlink()
    inputs = [src, tmp_path / "r3.tar.gz"]
    seen = _spy_workers(monkeypatch)
    serial = _import(inputs, tmp_path / "serial", workers=1)
    parallel = _import(inputs, tmp_path / "parallel", workers=4, memory_budget_bytes=budget)
    assert seen == [1, 2]  # the budget holds two workers, not four
    assert sorted(parallel) == ["manifest.json", "rank-0.et", "rank-1.et", "rank-2.et", "rank-3.et"]
    assert parallel == serial


@pytest.mark.slow
def test_errors_in_workers_name_the_file_and_rank_and_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "in"
    write_gpu_run(SPEC, src)
    _spy_workers(monkeypatch)
    good = (src / "rank2_kineto.json.gz").read_bytes()
    doc = json.loads(gzip.decompress(good))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
            e["args"]["In msg nelems"] = 2**61  # x 4 bytes: beyond Chakra's int64 fields
    (src / "rank2_kineto.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(
        TraceImportError, match=r"rank2_kineto\.json\.gz: rank 2: .* has size \d+ out of range"
    ):
        run_mod.import_traces([src], None, tmp_path / "run", workers=2)
    (src / "rank2_kineto.json.gz").write_bytes(good)
    (src / "rank1_kineto.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [1, 2'))
    with pytest.raises(TraceImportError, match=r"rank1_kineto\.json\.gz: not JSON"):
        run_mod.import_traces([src], None, tmp_path / "run", workers=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no run directory, no temporary sibling


def test_the_import_command_passes_its_worker_cap_and_memory_budget_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skewlens.cli import import_traces as cli

    write_gpu_run(SPEC, tmp_path / "in")
    calls: list[tuple[int | None, int | None]] = []
    real = run_mod.import_traces

    def spy(*a: Any, workers: int | None = None, memory_budget_bytes: int | None = None, **kw: Any) -> Any:
        calls.append((workers, memory_budget_bytes))
        return real(*a, workers=workers, memory_budget_bytes=memory_budget_bytes, **kw)

    monkeypatch.setattr(cli, "import_traces", spy)
    argv = ["--kineto", str(tmp_path / "in"), "--quiet", "--workers", "3", "--memory-budget-mib", "64"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 0
    assert cli.main(["--kineto", str(tmp_path / "in"), "--quiet", "--out", str(tmp_path / "run2")]) == 0
    assert calls == [(3, 64 << 20), (None, None)]
    assert (tmp_path / "run" / "rank-3.et").read_bytes() == (tmp_path / "run2" / "rank-3.et").read_bytes()


@pytest.mark.parametrize("flag", ["--workers", "--memory-budget-mib"])
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_worker_cap_or_budget_below_one_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    from skewlens.cli import import_traces as cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["--kineto", str(tmp_path), "--out", str(tmp_path / "run"), flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_worker_processes_ignore_ctrl_c_and_leave_it_to_the_parent() -> None:
    # the terminal sends Ctrl-C to every process of the group: a worker that died of it while the pool handed
    # it a job left `skewlens import` waiting forever (seen once in twenty interrupts)
    import os
    import signal

    from skewlens.profiler.threads import process_pool

    with process_pool(1, "skewlens.profiler.threads") as pool:
        pid = pool.submit(os.getpid).result(timeout=60)
        assert pool.submit(signal.raise_signal, signal.SIGINT).result(timeout=60) is None
        assert pool.submit(os.getpid).result(timeout=60) == pid  # the same worker, alive


def test_both_parsers_read_times_correlations_and_pids_alike_on_the_edge_values() -> None:
    # kineto.py: ts/dur are µs read as ns (x 1000, negative dur read as 0 long and counted); cpu_pids are the
    # cpu_op events' pids; a launch is filed by its correlation, whatever the int (0 included)
    x = {"ph": "X", "pid": 1, "tid": 2}
    doc = {"traceEvents": [
        {**x, "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 0, "args": {}},
        {**x, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2, "dur": 0.5,
         "args": {"correlation": 0}},
        {**x, "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 3, "dur": 40.5,
         "args": {"correlation": 0, "stream": 7, "device": 0}},
        {**x, "cat": "cpu_op", "name": "aten::add", "ts": 50, "dur": -1, "args": {}},
    ], "distributedInfo": {"rank": 0}}  # fmt: skip
    data = json.dumps(doc).encode()
    fast = load_kineto(data, Path("k.json"), max_bytes=len(data))
    slow = parse_kineto(doc, Path("k.json"))
    assert fast == slow
    assert [(e.name, e.dur_ns) for e in fast.cpu_ops] == [("aten::mm", 0), ("aten::add", 0)]
    assert (fast.launches[0].dur_ns, fast.gpu[0].dur_ns) == (500, 40_500)
    assert (fast.cpu_pids, fast.negative_durations) == ({1}, 1)
