"""The library used from Python, as a notebook does: in-memory tables, no global side effects."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from skewlens.analysis import analyze_run, tables, write_tables
from skewlens.analysis.errors import AnalysisError
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.store.schema import META_TABLE, read_table
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.config import (
    DimensionConfig,
    RealConfig,
    ReplayConfig,
    ScaleConfig,
    SlowdownConfig,
    SlowdownItemConfig,
    TopologyConfig,
)
from skewlens.replay.driver import replay_run
from skewlens.replay.errors import ConfigError, ReplayError
from skewlens.replay.network.topology import Dimension
from skewlens.replay.outputs import timeline_table
from skewlens.replay.simulate import SimResult, Simulator, simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel
from skewlens.replay.summary import summarize

MS = 1_000_000
ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def pickle_round_trip(obj: T) -> T:
    """``obj`` as a worker process (joblib, multiprocessing) receives it."""
    back: T = pickle.loads(pickle.dumps(obj))
    return back


def same(a: object, b: object) -> bool:
    """Whether two field values are equal: arrays by dtype and values, dicts item by item."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def fields_that_differ(a: object, b: object) -> list[str]:
    """The slots of two dataclass instances whose values are not :func:`same`."""
    slots: tuple[str, ...] = type(a).__slots__  # type: ignore[attr-defined]
    return [f for f in slots if not same(getattr(a, f, "<unset>"), getattr(b, f, "<unset>"))]


def straggler_run(tmp_path: Path) -> Path:
    """Two ranks, three steps; rank 1 computes 3 ms where rank 0 computes 1 ms and waits for it."""
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        for s in range(3):
            rb.step(s)
            rb.compute("aten::mm", dur_ns=(3 if r else 1) * MS)
            rb.collective(
                CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=(MS // 5) if r else 2 * MS + MS // 5
            )
    return b.write(tmp_path / "run")


def test_the_analysis_tables_in_memory_are_the_ones_write_tables_writes(tmp_path: Path) -> None:
    res = analyze_run(load_validated(straggler_run(tmp_path)))
    got = tables(res)
    assert sorted(got) == ["blame", "blame_steps", "collective_skew", "critical_path", "step_breakdown"]
    written = write_tables(res, tmp_path / "out")
    assert sorted(p.name for p in written) == sorted(f"{n}.parquet" for n in got)
    for name, table in got.items():
        assert table.schema.metadata[META_TABLE] == name.encode()
        assert table.equals(read_table(tmp_path / "out" / f"{name}.parquet"))
    blame = got["blame"].to_pylist()
    assert blame[0]["rank"] == 1 and blame[0]["straggler_cost_ns"] == 6 * MS


def _global_state() -> tuple[object, ...]:
    root = logging.getLogger()
    sigs = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)]
    host = (list(root.handlers), root.level, list(warnings.filters), os.getcwd(), dict(os.environ), sigs)
    threads = sorted(t.name for t in threading.enumerate())
    hooks = (sys.excepthook, threading.excepthook, list(sys.path), threads)
    numpy = (np.geterr(), np.get_printoptions())
    return (*host, *hooks, *numpy, multiprocessing.get_start_method(allow_none=True))


def test_loading_analysing_and_simulating_print_nothing_and_leave_the_process_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = straggler_run(tmp_path)
    before = _global_state()
    run: RunTrace = load_validated(run_dir)
    write_tables(analyze_run(run), tmp_path / "out")
    slow = SlowdownModel([Slowdown(kind="jitter", sigma=0.3, seed=7)])
    first, again = simulate(run, effects=slow), simulate(run, effects=slow)
    assert _global_state() == before
    assert capsys.readouterr() == ("", "")
    # results are the same for the same input
    assert first.makespan_ns == again.makespan_ns


def _open_files() -> list[str]:
    """What this process holds open (``/proc/self/fd``)."""
    fds = Path("/proc/self/fd")
    return sorted(os.readlink(fds / f) for f in os.listdir(fds) if (fds / f).exists())


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd (Linux)")
def test_a_service_analysing_runs_again_and_again_holds_no_file_open_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a long-lived process (a dashboard) loading, analysing and replaying runs, some of them bad: measured on
    # a 2-rank gloo capture, 50 rounds kept RSS at 92.8-95.1 MiB and 6 descriptors, every table the same
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    good = straggler_run(tmp_path)
    bad = straggler_run(tmp_path / "bad")
    (bad / "rank-1.et").unlink()

    def one_round() -> tuple[dict[str, Any], list[Any]]:
        run = load_validated(good)
        with pytest.raises(SkewlensError, match="rank 1 is listed but its trace file is missing"):
            load_validated(bad)
        return tables(analyze_run(run)), summarize(run, simulate(run))

    first = one_round()
    files = _open_files()
    for _ in range(5):
        got = one_round()
        assert got[1] == first[1]
        assert all(got[0][k].equals(first[0][k], check_metadata=True) for k in first[0])
        assert _open_files() == files
    assert list(temp.iterdir()) == []


def test_runs_analysed_on_several_threads_at_once_give_what_one_at_a_time_gives(
    tmp_path: Path, run_dir: Path
) -> None:
    dirs = [straggler_run(tmp_path / "two"), run_dir]  # 2 ranks; conftest's 4
    shared = load_validated(dirs[1])

    def one(path: Path, run: RunTrace | None = None) -> tuple[dict[str, Any], list[Any]]:
        run = load_validated(path) if run is None else run
        slow = SlowdownModel([Slowdown(kind="compute", ranks=(1,), factor=1.5)])
        return tables(analyze_run(run)), summarize(run, simulate(run, effects=slow))

    alone = {d: one(d) for d in dirs}
    got: list[tuple[Path, tuple[dict[str, Any], list[Any]]]] = []
    jobs = [(d, None) for d in dirs * 2] + [(dirs[1], shared)] * 2  # a loaded run shared by two threads too
    threads = [threading.Thread(target=lambda d=d, r=r: got.append((d, one(d, r)))) for d, r in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(jobs)
    for d, (t, summary) in got:
        assert summary == alone[d][1]
        assert all(t[k].equals(alone[d][0][k], check_metadata=True) for k in alone[d][0])


def test_a_simulated_result_is_read_only_so_changing_it_cannot_change_the_run_or_another_result(
    tmp_path: Path,
) -> None:
    # its steps were the run's own array: `res.step[0][:] = 5` moved every node of the loaded run (and of
    # every other result) into step 5, and edited times left its cached step spans stale
    run = load_validated(straggler_run(tmp_path))
    res, other = simulate(run), simulate(run)
    arrays = [res.step[0], res.start_ns[0], res.end_ns[1], res.timed[0], res.coll_arrival_ns, res.coll_end_ns]
    for a in arrays:
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 5
    assert run.ranks[0].step.tolist() == [-1, 0, 0, 1, 1, 2, 2] == other.step[0].tolist()
    assert not run.ranks[0].step.flags.writeable  # the run's own array is read-only too (RankTrace.seal)
    assert res.step_time_ns(0) == other.step_time_ns(0) == 3 * MS + MS // 5


def test_drawing_a_picture_leaves_the_notebooks_matplotlib_backend_as_it_was(tmp_path: Path) -> None:
    # skewlens.pictures called matplotlib.use("Agg"): a notebook's inline backend became Agg, and its next
    # plt.show() showed nothing. In a fresh interpreter, as the backend is the process's.
    run_dir = straggler_run(tmp_path)
    code = f"""
import matplotlib
matplotlib.use("svg")  # the notebook's own backend
import matplotlib.pyplot as plt
from skewlens.analysis import analyze_run
from skewlens.analysis.plots import breakdown_bars
from skewlens.profiler.store.validate import load_validated
png = breakdown_bars(analyze_run(load_validated({str(run_dir)!r})), {str(tmp_path / "bars.png")!r})
print(matplotlib.get_backend(), open(png, "rb").read(8) == b"\\x89PNG\\r\\n\\x1a\\n")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["svg", "True"]


def test_a_replay_config_built_in_python_without_a_required_setting_names_it() -> None:
    # ReplayConfig(trace=..., out=...) was an AttributeError ('str' object has no attribute 'contention'),
    # a dimension without bandwidth_gbps a ValueError (could not convert string to float: '???')
    dim = DimensionConfig(bandwidth_gbps=1.0, latency_ns=1)
    topo = TopologyConfig(name="sw", dims=[dim])
    cases = [
        (lambda: ReplayConfig(trace="run", out="out"), "topology"),
        (lambda: ReplayConfig(out="out", topology=topo), "trace"),
        (lambda: ReplayConfig(trace="run", topology=topo), "out"),
        (lambda: TopologyConfig(dims=[dim]), "topology.name"),
        (
            lambda: TopologyConfig(name="sw", dims=[DimensionConfig(latency_ns=1)]),
            "topology.dims[0].bandwidth_gbps",
        ),
        (
            lambda: TopologyConfig(name="sw", dims=[DimensionConfig(bandwidth_gbps=1.0)]),
            "topology.dims[0].latency_ns",
        ),
    ]
    for build, key in cases:
        with pytest.raises(ConfigError) as e:
            build()
        assert str(e.value) == f"{key}: missing value (a required setting)"


def test_a_replays_loading_stage_counts_the_ranks_and_nodes_it_loads_on_bars_of_their_own(
    tmp_path: Path,
) -> None:
    # the first load of two 60 MB ranks held `loading RUN 0/3` for 20 s with nothing else moving: the
    # load's own bars were not passed on
    run_dir = straggler_run(tmp_path)
    run = load_validated(run_dir)
    tasks: list[tuple[str, int | None]] = []
    done: dict[str, int] = {}
    lock = threading.Lock()

    class Recording:
        @contextlib.contextmanager
        def task(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
            tasks.append((description, total))
            done[description] = 0

            def advance(n: int = 1, description_: str | None = None, **kw: str) -> None:
                with lock:
                    done[description] += n

            yield advance

    topo = TopologyConfig(name="sw", dims=[DimensionConfig(bandwidth_gbps=10.0, latency_ns=5_000)])
    cfg = ReplayConfig(trace=str(run_dir), out=str(tmp_path / "out"), topology=topo, perfetto=False)
    replay_run(cfg, progress=Recording())
    ranks = len(run.ranks)
    nodes = sum(len(rt) for rt in run.ranks.values())
    assert tasks[:4] == [
        (f"loading {run_dir}", 3),
        ("loading ranks", ranks),
        ("decoding nodes", None),
        ("checking dependencies", ranks),
    ]
    assert (done["loading ranks"], done["decoding nodes"], done["checking dependencies"]) == (
        ranks,
        nodes,
        ranks,
    )


def test_a_replay_from_python_takes_its_paths_as_strings_and_writes_into_the_configs_out_by_default(
    tmp_path: Path,
) -> None:
    # replay_run(cfg, "OUT") was a TypeError (unsupported operand type(s) for /: 'str' and 'str')
    topo = TopologyConfig(name="sw", dims=[DimensionConfig(bandwidth_gbps=10.0, latency_ns=5_000)])
    run_dir = str(straggler_run(tmp_path))
    cfg = ReplayConfig(trace=run_dir, out=str(tmp_path / "a"), topology=topo, perfetto=False)
    given = replay_run(cfg, str(tmp_path / "b"))
    default = replay_run(cfg)
    assert (given.out_dir, default.out_dir) == (tmp_path / "b", tmp_path / "a")
    for out in ("a", "b"):
        assert sorted(p.name for p in (tmp_path / out).iterdir()) == ["summary.parquet", "timeline.parquet"]
    assert given.sim.makespan_ns == default.sim.makespan_ns == 3 * (3 * MS + MS // 5)


def test_a_negative_max_simulations_is_refused_not_taken_as_no_simulation(tmp_path: Path) -> None:
    # analyze_run(run, max_simulations=-1) gave every rank a straggler cost of 0; the CLI refused it
    run = load_validated(straggler_run(tmp_path))
    with pytest.raises(AnalysisError) as e:
        analyze_run(run, max_simulations=-1)
    assert str(e.value) == "max_simulations: expected >= 0 (None: no limit), got -1"
    assert analyze_run(run, max_simulations=None).stragglers[0].straggler_cost_ns == 6 * MS


def test_a_simulated_results_send_and_recv_times_are_read_only_too(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    b.rank(0).step(0).send(1, comm_bytes=1024, dur_ns=MS, start_ns=0)
    b.rank(1).step(0).recv(0, comm_bytes=1024, dur_ns=MS, start_ns=0)
    res = simulate(load_validated(b.write(tmp_path / "run")))
    assert (res.p2p_arrival_ns.tolist(), res.p2p_end_ns.tolist()) == ([0], [MS])
    for a in (res.p2p_arrival_ns, res.p2p_end_ns):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 5


def test_max_simulations_zero_is_taken_as_no_what_if_simulation_not_refused(tmp_path: Path) -> None:
    # 0 is what the CLI's --max-simulations 0 asks for: the stragglers are named without a cost
    run = load_validated(straggler_run(tmp_path))
    assert [(s.rank, s.straggler_cost_ns) for s in analyze_run(run, max_simulations=0).stragglers] == [
        (1, 0),
        (0, 0),
    ]
    assert analyze_run(run, max_simulations=1).stragglers[0].straggler_cost_ns == 6 * MS


def test_a_real_replay_from_python_into_an_out_given_as_a_string_is_staged_inside_it_then_moved_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as skewlens replay does (it runs its replays through replay_run): the simulated files and the real
    # replay's are staged in a directory inside out, handed to the real replay as a Path, not dropped
    from skewlens.replay.real import api as real_api

    seen: dict[str, Any] = {}

    def real(**kw: Any) -> None:
        seen.update(kw, staged=sorted(p.name for p in kw["stage_dir"].iterdir()))

    monkeypatch.setattr(real_api, "preflight", lambda *a, **k: None)
    monkeypatch.setattr(real_api, "real_replay", real)
    topo = TopologyConfig(name="sw", dims=[DimensionConfig(bandwidth_gbps=10.0, latency_ns=5_000)])
    run_dir = str(straggler_run(tmp_path))
    cfg = ReplayConfig(trace=run_dir, out="unused", topology=topo, perfetto=False, mode="real")
    (tmp_path / "a").mkdir()
    replay_run(cfg, str(tmp_path / "a"))
    assert seen["out_dir"] == tmp_path / "a"
    assert (seen["stage_dir"].parent, seen["stage_dir"].name[:3]) == ((tmp_path / "a").absolute(), ".a.")
    assert seen["staged"] == ["summary.parquet", "timeline.parquet"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["summary.parquet", "timeline.parquet"]


def test_a_loaded_runs_columns_are_read_only_so_an_edit_cannot_leave_its_cached_execution_model_stale(
    tmp_path: Path,
) -> None:
    # the execution model is cached per RunTrace, and a loaded run's arrays were writable: doubling rank 1's
    # durations in place after one simulate replayed the edited run in 588.7 ms where a fresh load with the
    # same edit replayed in 436.7 ms (a 2-rank capture of examples/train.py): the answer depended on
    # whether the run had been simulated before the edit
    run = load_validated(straggler_run(tmp_path))
    before = simulate(run).makespan_ns
    for rt in run.ranks.values():
        for name, value in ((f, getattr(rt, f)) for f in rt.__slots__):
            if isinstance(value, np.ndarray):
                assert not value.flags.writeable, f"rank {rt.rank}: {name} is writable"
    with pytest.raises(ValueError, match="read-only"):
        run.ranks[1].dur_ns[:] = run.ranks[1].dur_ns * 2
    assert simulate(run).makespan_ns == before == 3 * (3 * MS + MS // 5)


def test_editing_the_step_spans_a_result_returned_leaves_its_step_times_as_they_were(tmp_path: Path) -> None:
    # step_spans() returned the result's own cache: dropping step 0 from the dict it returned (a notebook
    # leaving out a warm-up step) changed what step_times() said of step 1 afterwards
    res = simulate(load_validated(straggler_run(tmp_path)))
    times = res.step_times()
    spans = res.step_spans()
    for key in [k for k in spans if k[1] == 0]:
        del spans[key]
    assert res.step_times() == times == {0: 3 * MS + MS // 5, 1: 3 * MS + MS // 5, 2: 3 * MS + MS // 5}
    assert sorted({s for _r, s in res.step_spans()}) == [0, 1, 2]


def test_sorting_the_stragglers_list_leaves_the_result_and_its_blame_table_in_cost_order(
    tmp_path: Path,
) -> None:
    # res.stragglers was the blame's own list: sorting it by rank made res.stragglers[0] rank 0 and wrote
    # the blame table in rank order (a 2-rank capture: rank 1 costs 129.0 ms, rank 0 0.2 ms)
    res = analyze_run(load_validated(straggler_run(tmp_path)))
    res.stragglers.sort(key=lambda b: b.rank)
    assert [b.rank for b in res.stragglers] == [1, 0]
    assert tables(res)["blame"].column("rank").to_pylist() == [1, 0]


def test_write_tables_into_an_earlier_analysis_directory_leaves_no_table_of_the_earlier_one(
    tmp_path: Path,
) -> None:
    # write_tables(res_b_without_blame, OUT) after write_tables(res_a, OUT) left run a's blame.parquet and
    # blame_steps.parquet beside run b's tables: one directory, two runs' answers (skewlens analyze itself
    # replaces the whole set)
    a = analyze_run(load_validated(straggler_run(tmp_path / "a")))
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=MS)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=64, dur_ns=MS)
    run_b = load_validated(b.write(tmp_path / "b" / "run"))
    out = tmp_path / "out"
    write_tables(a, out)
    written = write_tables(analyze_run(run_b, blame=False), out)
    tables_of_b = ["collective_skew.parquet", "critical_path.parquet", "step_breakdown.parquet"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written) == tables_of_b
    for p in out.iterdir():
        assert read_table(p).schema.metadata[b"skewlens.source"] == str(tmp_path / "b" / "run").encode()


def test_a_slowdown_given_its_ranks_as_one_int_is_refused_naming_ranks() -> None:
    # Slowdown(kind="compute", ranks=1) was taken, and simulate then failed with "TypeError: Value after *
    # must be an iterable, not int" from inside the target check; a list was taken but left the item
    # unhashable
    with pytest.raises(ConfigError) as e:
        Slowdown(kind="compute", ranks=1, factor=2.0)  # type: ignore[arg-type]
    assert str(e.value) == "slowdown item (kind=compute): ranks must be a sequence of ranks, got 1"
    listed = Slowdown(kind="compute", ranks=[1], factor=2.0)  # type: ignore[arg-type]
    assert listed.ranks == (1,) and hash(listed) == hash(Slowdown(kind="compute", ranks=(1,), factor=2.0))


def test_a_replay_given_with_another_run_is_refused_naming_the_run_and_what_differs(tmp_path: Path) -> None:
    # side by side in a notebook, summarize(run_b, sim_a) was "IndexError: index 396 is out of bounds for
    # axis 0 with size 396" and timeline_table(run_b, sim_a, ...) pyarrow's "ArrowInvalid: Column 23 named
    # replay_start_ns expected length 815 but got length 5931" (two 2-rank captures)
    run_a = load_validated(straggler_run(tmp_path / "a"))
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=64, dur_ns=MS)
    run_b = load_validated(b.write(tmp_path / "b" / "run"))
    sim_a = simulate(run_a)
    refused = (
        f"{run_b.run_dir}: the SimResult given is not a replay of this run "
        "(rank 0: 7 rows replayed, 2 in the run)"
    )
    for called, use in (  # each message names the function called, as simulate's and analyze_run's do
        ("summarize", lambda: summarize(run_b, sim_a)),
        ("timeline_table", lambda: timeline_table(run_b, sim_a, [0, 1])),
        ("SimResult.rooted_awaited_ns", lambda: sim_a.rooted_awaited_ns(run_b)),
    ):
        with pytest.raises(ReplayError) as e:
            use()
        assert str(e.value) == f"{called}: {refused}"
    assert [s.step for s in summarize(run_a, sim_a) if s.rank == 0] == [0, 1, 2]


def test_a_slowdown_number_given_as_a_string_is_refused_naming_its_field() -> None:
    # Slowdown(kind="compute", factor="2") (a value read from a widget or a CSV) raised a bare "TypeError:
    # must be real number, not str" from math.isfinite, naming neither the item nor the field
    for kw, field in (
        ({"kind": "compute", "factor": "2"}, "factor"),
        ({"kind": "stall", "delay_ns": "5"}, "delay_ns"),
    ):
        with pytest.raises(ConfigError) as e:
            Slowdown(**kw)  # type: ignore[arg-type]
        value = kw[field]
        assert str(e.value) == f"slowdown item (kind={kw['kind']}): {field} must be a number, got {value!r}"
    assert Slowdown(kind="compute", factor=2).factor == 2


def test_a_config_number_given_as_a_string_is_refused_naming_its_setting_as_the_command_line_does() -> None:
    # DimensionConfig(bandwidth_gbps="fast") in a ReplayConfig was "ValueError: could not convert string to
    # float: 'fast'", size="8" "TypeError: '<' not supported between instances of 'str' and 'int'", and
    # bandwidth_gbps="25" or size=2.5 were taken; the command line refuses each (topology.dims.0.size=2.5:
    # "Value '2.5' of type 'float' could not be converted to Integer")
    for kw, problem in (
        ({"bandwidth_gbps": "fast"}, "bandwidth_gbps: must be a number, got 'fast'"),
        ({"bandwidth_gbps": "25"}, "bandwidth_gbps: must be a number, got '25'"),
        ({"latency_ns": "5us"}, "latency_ns: must be a number, got '5us'"),
        ({"size": "8"}, "size: must be an integer, got '8'"),
        ({"size": 2.5}, "size: must be an integer, got 2.5"),
        ({"links_per_node": True}, "links_per_node: must be an integer, got True"),
    ):
        given: dict[str, Any] = {"size": 0, "bandwidth_gbps": 25.0, "latency_ns": 1000, **kw}
        with pytest.raises(ConfigError) as e:
            TopologyConfig(name="sw", dims=[DimensionConfig(**given)]).to_topology()
        assert str(e.value) == f"topology.dims[0].{problem}"
        with pytest.raises(ConfigError) as e:
            Dimension(kind="switch", **given)
        assert str(e.value) == problem
    # the replay config's other numbers likewise: float("fast") a ValueError, nproc="4" a TypeError
    topology = TopologyConfig(name="sw", dims=[DimensionConfig(bandwidth_gbps=25.0, latency_ns=1000)])
    for build, message in (
        (
            lambda: SlowdownConfig(entries=[SlowdownItemConfig(kind="compute", ranks=[1], factor="fast")]),
            "slowdown.entries[0].factor: must be a number, got 'fast' (kind=compute)",
        ),
        (
            lambda: SlowdownConfig(entries=[SlowdownItemConfig(kind="stall", delay_ms="5")]),
            "slowdown.entries[0].delay_ms: must be a number, got '5' (kind=stall)",
        ),
        (
            lambda: ReplayConfig(trace="run", out="out", topology=topology, real=RealConfig(nproc="4")),
            "real.nproc: must be an integer, got '4'",
        ),
        (
            lambda: ReplayConfig(trace="run", out="out", topology=topology, scale=ScaleConfig(dp="4")),
            "scale.dp: must be an integer, got '4'",
        ),
        (
            lambda: ReplayConfig(trace="run", out="out", topology=topology, perfetto_max_events="all"),
            "perfetto_max_events: must be an integer, got 'all'",
        ),
    ):
        with pytest.raises(ConfigError) as e:
            build()
        assert str(e.value) == message
    # numbers of either kind where they are whole or may be fractions, as before
    topo = TopologyConfig(
        name="sw", dims=[DimensionConfig(bandwidth_gbps=25, latency_ns=1000.0)]
    ).to_topology()
    assert (topo.dims[0].bandwidth_gbps, topo.dims[0].latency_ns) == (25.0, 1000)


def test_the_time_of_a_step_the_replay_lacks_is_a_skewlens_error_naming_the_steps_it_has(
    tmp_path: Path,
) -> None:
    # the README promises a SkewlensError for a step the run lacks; step_time_ns(99) raised KeyError('step 99
    # has no nodes'), which a notebook's `except SkewlensError` let through
    res = simulate(load_validated(straggler_run(tmp_path)))
    with pytest.raises(SkewlensError, match=r"step 99 has no nodes in this replay \(its steps: 0, 1, 2\)"):
        res.step_time_ns(99)


def _one_step_run(path: Path, ranks: int, last: str) -> RunTrace:
    """Each rank: step 0, an all_reduce, then ``last``: ``compute``, ``all_reduce`` or ``p2p`` (rank 0
    sends to rank 1)."""
    b = RunBuilder(world_size=ranks)
    for r in range(ranks):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=64, dur_ns=MS)
        if last == "compute":
            rb.compute("aten::mm", dur_ns=MS)
        elif last == "all_reduce":
            rb.collective(CommType.ALL_REDUCE, comm_bytes=64, dur_ns=MS)
        elif r == 0:
            rb.send(1, comm_bytes=64, dur_ns=MS)
        else:
            rb.recv(0, comm_bytes=64, dur_ns=MS)
    return load_validated(b.write(path / "run"))


@pytest.mark.parametrize(
    ("given", "run", "differs"),
    [
        ((3, "compute"), (2, "compute"), "its ranks [0, 1, 2], the run's [0, 1]"),
        ((2, "all_reduce"), (2, "compute"), "2 collectives replayed, 1 in the run"),
        ((2, "p2p"), (2, "compute"), "1 send/recv pairs replayed, 0 in the run"),
    ],
)
def test_a_replay_of_a_run_of_another_shape_with_as_many_rows_per_rank_is_refused_naming_what_differs(
    tmp_path: Path, given: tuple[int, str], run: tuple[int, str], differs: str
) -> None:
    res = simulate(_one_step_run(tmp_path / "given", *given))
    other = _one_step_run(tmp_path / "other", *run)
    with pytest.raises(ReplayError) as e:
        summarize(other, res)
    assert (
        str(e.value)
        == f"summarize: {other.run_dir}: the SimResult given is not a replay of this run ({differs})"
    )


def test_the_time_of_a_step_a_long_replay_lacks_names_its_first_eight_steps_and_how_many_more(
    tmp_path: Path,
) -> None:
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    for s in range(10):
        rb.step(s).compute("aten::mm", dur_ns=MS)
    res = simulate(load_validated(b.write(tmp_path / "run")))
    with pytest.raises(ReplayError) as e:
        res.step_time_ns(99)
    assert (
        str(e.value) == "step 99 has no nodes in this replay (its steps: 0, 1, 2, 3, 4, 5, 6, 7 and 2 more)"
    )


def test_a_slowdown_given_a_bool_for_a_number_or_a_rank_is_refused_naming_the_field() -> None:
    # True is an int to Python: factor=True was taken as a factor of 1, ranks=(True,) as rank 1
    with pytest.raises(ConfigError) as e:
        Slowdown(kind="compute", factor=True)
    assert str(e.value) == "slowdown item (kind=compute): factor must be a number, got True"
    with pytest.raises(ConfigError) as e:
        Slowdown(kind="compute", ranks=(True,), factor=2.0)
    assert str(e.value) == "slowdown item (kind=compute): ranks must be a sequence of ranks, got (True,)"
    # numpy's integers are taken, as Python's (a config written from the item is plain YAML)
    ranks = Slowdown(kind="compute", ranks=(np.int64(1),), factor=2.0).ranks
    nodes = Slowdown(kind="network", nodes=[np.int64(3)], factor=2.0).nodes  # type: ignore[arg-type]
    assert (ranks, nodes, type(ranks[0]), type(nodes[0])) == ((1,), (3,), int, int)


def test_write_tables_where_an_earlier_tables_name_is_a_directory_says_it_cannot_remove_it(
    tmp_path: Path,
) -> None:
    # a stale blame.parquet that unlink refuses (a directory of that name: IsADirectoryError) is a
    # SkewlensError naming it, not a traceback
    res = analyze_run(load_validated(straggler_run(tmp_path / "a")), blame=False)
    (tmp_path / "out" / "blame.parquet").mkdir(parents=True)
    with pytest.raises(SkewlensError) as e:
        write_tables(res, tmp_path / "out")
    assert str(e.value) == (
        f"cannot remove {tmp_path / 'out' / 'blame.parquet'} (an earlier analysis' table): Is a directory"
    )


def test_the_time_of_a_step_of_a_replay_without_nodes_says_it_has_no_steps(tmp_path: Path) -> None:
    b = RunBuilder(world_size=1)
    b.rank(0)
    res = simulate(load_validated(b.write(tmp_path / "run")))
    with pytest.raises(ReplayError) as e:
        res.step_time_ns(0)
    assert (res.steps(), str(e.value)) == ([], "step 0 has no nodes in this replay (its steps: none)")


@pytest.mark.parametrize("send", [pickle_round_trip, copy.deepcopy], ids=["pickle", "deepcopy"])
def test_a_run_sent_to_a_worker_or_deep_copied_keeps_its_columns_read_only_so_an_edit_cannot_go_stale(
    tmp_path: Path, send: Callable[[RunTrace], RunTrace]
) -> None:
    # numpy unpickles every array writable: a loaded run handed to joblib (or deep-copied) could be edited in
    # place after its first simulate, and was replayed against its cached execution model of the run as it
    # was (rank 7 of the 8-GPU DLRM trace, durations doubled: 20.81 ms, 22.59 ms if edited before a simulate)
    loaded = load_validated(straggler_run(tmp_path))
    run = send(loaded)
    assert {r: fields_that_differ(loaded.ranks[r], rt) for r, rt in run.ranks.items()} == {0: [], 1: []}
    assert simulate(run).makespan_ns == 3 * (3 * MS + MS // 5)
    with pytest.raises(ValueError, match="read-only"):
        run.ranks[1].dur_ns[:] = run.ranks[1].dur_ns * 2
    assert simulate(run).makespan_ns == 3 * (3 * MS + MS // 5)
    # a column its maker left writable (a what-if built with dataclasses.replace) stays writable
    rt = run.ranks[1]
    fields = {
        f: getattr(run, f) for f in ("run_dir", "manifest", "pg_names", "process_groups", "collectives")
    }
    what_if = RunTrace(**fields, ranks={0: run.ranks[0], 1: dataclasses.replace(rt, dur_ns=rt.dur_ns * 2)})
    sent = send(what_if)
    columns = {f: getattr(sent.ranks[1], f) for f in rt.__slots__}
    assert [f for f, a in columns.items() if isinstance(a, np.ndarray) and a.flags.writeable] == ["dur_ns"]
    assert simulate(sent).makespan_ns == simulate(what_if).makespan_ns == 3 * 6 * MS


@pytest.mark.parametrize("send", [pickle_round_trip, copy.deepcopy], ids=["pickle", "deepcopy"])
def test_a_simulated_result_sent_to_a_worker_or_deep_copied_is_read_only_too(
    tmp_path: Path, send: Callable[[SimResult], SimResult]
) -> None:
    res = simulate(load_validated(straggler_run(tmp_path)))
    times = res.step_times()  # cached spans travel with it
    got = send(res)
    arrays = [got.step[0], got.start_ns[0], got.end_ns[1], got.timed[0], got.coll_arrival_ns, got.p2p_end_ns]
    for a in arrays:
        with pytest.raises(ValueError, match="read-only"):
            a[:1] = 5
    assert got.step_times() == times == {0: 3 * MS + MS // 5, 1: 3 * MS + MS // 5, 2: 3 * MS + MS // 5}
    assert (fields_that_differ(res, got), got.makespan_ns) == ([], res.makespan_ns)


def test_a_path_given_where_a_loaded_run_is_meant_is_refused_saying_to_load_it(tmp_path: Path) -> None:
    # simulate("runs/x") was "TypeError: cannot create weak reference to 'str' object", analyze_run("runs/x")
    # "AttributeError: 'str' object has no attribute 'ranks'": neither said that the run must be loaded
    run_dir = straggler_run(tmp_path)
    load = f"load it first (skewlens.profiler.store.validate.load_validated({str(run_dir)!r}))"
    with pytest.raises(ReplayError) as e:
        simulate(str(run_dir))  # type: ignore[arg-type]
    assert str(e.value) == f"simulate: got the path {str(run_dir)!r}, not a loaded run: {load}"
    # Simulator (the blame's, re-timing what-ifs) made simulate's timing without its check: "TypeError:
    # cannot create weak reference to 'str' object"
    with pytest.raises(ReplayError) as e:
        Simulator(str(run_dir))  # type: ignore[arg-type]
    assert str(e.value) == f"Simulator: got the path {str(run_dir)!r}, not a loaded run: {load}"
    with pytest.raises(AnalysisError) as e:
        analyze_run(run_dir)  # type: ignore[arg-type]
    assert str(e.value) == f"analyze_run: got the path {str(run_dir)!r}, not a loaded run: {load}"
    # any os.PathLike is named by its path (an os.scandir entry's str() is "<DirEntry 'run'>")
    entry = next(e for e in os.scandir(tmp_path) if e.name == "run")
    with pytest.raises(AnalysisError) as e:
        analyze_run(entry)  # type: ignore[arg-type]
    assert str(e.value) == f"analyze_run: got the path {str(run_dir)!r}, not a loaded run: {load}"
    with pytest.raises(ReplayError) as e:
        simulate(analyze_run(load_validated(run_dir)))  # type: ignore[arg-type]
    assert (
        str(e.value)
        == "simulate: expected a loaded run (a RunTrace, from load_validated(path)), got AnalysisResult"
    )


def test_slowdown_items_or_config_classes_given_where_simulate_takes_its_models_are_refused_naming_them(
    tmp_path: Path,
) -> None:
    # simulate(run, effects=[Slowdown(...)]) (the README's SlowdownModel([...]) without its wrapper), a
    # SlowdownConfig, a TopologyConfig or a preset's name were AttributeErrors from inside the lowering
    # ("'list' object has no attribute 'compute_factor'", "'TopologyConfig' object has no attribute 'sized'")
    run = load_validated(straggler_run(tmp_path))
    item = Slowdown(kind="compute", ranks=(0,), factor=4.0)
    got = "expected a SlowdownModel, got"
    wrong: list[tuple[dict[str, Any], str]] = [
        ({"effects": [item]}, rf"^effects: {got} list \[Slowdown\(.*: wrap the items, "),
        ({"effects": item}, rf"^effects: {got} Slowdown .*: wrap the items, "),
        (
            {"effects": SlowdownConfig()},
            rf"^effects: {got} SlowdownConfig .*: pass SlowdownModel\(its \.to_items",
        ),
        ({"effects": None}, rf"^effects: {got} NoneType None \(none: leave effects out\)$"),
        ({"topology": "switch"}, r"^topology: expected a Topology, got str 'switch': build one, Topology\("),
    ]
    dims = [DimensionConfig(kind="switch", size=0, bandwidth_gbps=25.0, latency_ns=1)]
    cfg = TopologyConfig(name="sw", dims=dims)
    wrong.append(
        ({"topology": cfg}, r"^topology: expected a Topology, got TopologyConfig .*: pass its \.to_topology")
    )
    for kwargs, message in wrong:
        for replay in (simulate, Simulator):
            with pytest.raises(ConfigError, match=message):
                replay(run, comm_mode="model" if "topology" in kwargs else "as_recorded", **kwargs)
    dict_item = r"^items\[1\]: expected a Slowdown, got dict \{'kind': 'compute'\}$"
    with pytest.raises(ConfigError, match=dict_item):
        SlowdownModel([item, {"kind": "compute"}])  # type: ignore[list-item]
    # what they meant: rank 0's 1 ms of compute 4 ms, now the later of the two by 1 ms
    assert simulate(run).step_time_ns(1) == 3 * MS + MS // 5
    assert simulate(run, effects=SlowdownModel([item])).step_time_ns(1) == 4 * MS + MS // 5


def test_an_override_of_a_rank_the_run_lacks_is_refused_naming_it_not_replayed_as_if_not_given(
    tmp_path: Path,
) -> None:
    # simulate(run, dur_override={9: ...}) on 2 ranks (or a rank's key given as the string "1") read no value
    # of it and came back as recorded, as if no override had been given
    run = load_validated(straggler_run(tmp_path))
    none = np.zeros(len(run.ranks[1]), dtype=np.int64)
    with pytest.raises(ConfigError, match=r"^dur_override: rank 9 has no trace in the run \(traced: 0-1\)$"):
        simulate(run, dur_override={9: none})
    sim = Simulator(run)
    with pytest.raises(
        ConfigError, match=r"^gap_override: rank '1' has no trace in the run \(traced: 0-1\)$"
    ):
        sim.simulate(gap_override={"1": none})  # type: ignore[dict-item]
    # rank 1's nodes all taking no time: its 3 ms of compute gone, rank 0's 1 ms the later arrival
    assert simulate(run).step_time_ns(1) == 3 * MS + MS // 5
    assert simulate(run, dur_override={1: none}).step_time_ns(1) == MS + MS // 5
    assert sim.simulate(dur_override={1: none}).step_time_ns(1) == MS + MS // 5


def test_the_replays_tables_given_a_path_or_something_else_than_a_result_say_so(tmp_path: Path) -> None:
    # summarize("runs/x", res) and timeline_table("runs/x", res, [0]), the README's tables in memory, were
    # "AttributeError: 'str' object has no attribute 'run_dir'"
    from skewlens.replay.summary import summarize

    run_dir = straggler_run(tmp_path)
    run = load_validated(run_dir)
    res = simulate(run)
    load = f"load it first (skewlens.profiler.store.validate.load_validated({str(run_dir)!r}))"
    # each message names the function called, as simulate's and analyze_run's do (neither did)
    for called, call in (
        ("summarize", lambda: summarize(str(run_dir), res)),  # type: ignore[arg-type]
        ("timeline_table", lambda: timeline_table(str(run_dir), res, [0])),  # type: ignore[arg-type]
    ):
        with pytest.raises(ReplayError) as e:
            call()
        assert str(e.value) == f"{called}: got the path {str(run_dir)!r}, not a loaded run: {load}"
    for called, call in (
        ("summarize", lambda: summarize(run, run)),  # type: ignore[arg-type]
        ("timeline_table", lambda: timeline_table(run, run, [0])),  # type: ignore[arg-type]
    ):
        with pytest.raises(ReplayError) as e:
            call()
        assert str(e.value) == f"{called}: expected a SimResult (from simulate(run)), got RunTrace"
    assert len(summarize(run, res)) == len(res.step_spans())


def test_the_analysis_tables_given_a_run_or_a_path_instead_of_its_result_say_so(tmp_path: Path) -> None:
    # tables(run) and write_tables(run, OUT) (the analysis skipped) were "AttributeError: 'RunTrace' object
    # has no attribute 'run'", tables("runs/x") "'str' object has no attribute 'run'"
    run_dir = straggler_run(tmp_path)
    run = load_validated(run_dir)
    for call, got in (
        (lambda: tables(run), "tables: expected an AnalysisResult (from analyze_run(run)), got RunTrace"),
        (
            lambda: tables(str(run_dir)),
            "tables: expected an AnalysisResult (from analyze_run(run)), got a path",
        ),
        (
            lambda: write_tables(run, tmp_path / "out"),
            "write_tables: expected an AnalysisResult (from analyze_run(run)), got RunTrace",
        ),
    ):
        with pytest.raises(AnalysisError) as e:
            call()
        assert str(e.value) == got
    assert not (tmp_path / "out").exists()
    assert tables(analyze_run(run))["blame"].num_rows == 2


def test_max_simulations_given_as_a_string_or_a_bool_is_refused_naming_it(tmp_path: Path) -> None:
    # max_simulations="3" (a widget's value) was "TypeError: '<' not supported between instances of 'str'
    # and 'int'"; True was taken as 1
    run = load_validated(straggler_run(tmp_path))
    for given in ("3", True, 2.5):
        with pytest.raises(AnalysisError) as e:
            analyze_run(run, max_simulations=given)  # type: ignore[arg-type]
        assert str(e.value) == f"max_simulations: expected >= 0 (None: no limit), got {given!r}"
    assert analyze_run(run, max_simulations=np.int64(1)).stragglers[0].straggler_cost_ns == 6 * MS  # type: ignore[arg-type]


def test_a_replay_config_built_in_python_with_a_dict_for_a_nested_setting_names_the_setting() -> None:
    # a dict where a config class is meant (as YAML holds it) was an AttributeError on first use: "'dict'
    # object has no attribute 'contention'" (topology), "... 'to_items'" (slowdown), "... 'bandwidth_gbps'"
    dim = DimensionConfig(bandwidth_gbps=1.0, latency_ns=1)
    topo = TopologyConfig(name="sw", dims=[dim])
    replay = {"trace": "run", "out": "out", "topology": topo}
    cases = [
        (lambda: ReplayConfig(**{**replay, "topology": {"name": "sw"}}), "topology", "TopologyConfig"),
        (lambda: ReplayConfig(**replay, slowdown={"name": "none"}), "slowdown", "SlowdownConfig"),
        (lambda: ReplayConfig(**replay, real={"nproc": 2}), "real", "RealConfig"),
        (lambda: ReplayConfig(**replay, scale={"dp": 2}), "scale", "ScaleConfig"),
        (
            lambda: TopologyConfig(name="sw", dims=[dim, {"kind": "x"}]),
            "topology.dims[1]",
            "DimensionConfig",
        ),
        (lambda: SlowdownConfig(entries=[{"kind": "compute"}]), "slowdown.entries[0]", "SlowdownItemConfig"),
    ]
    for build, key, schema in cases:
        with pytest.raises(ConfigError) as e:
            build()
        assert str(e.value).startswith(f"{key}: expected a {schema}, got dict {{"), str(e.value)
    # a topology not given at all is said to be missing, not to be the wrong class (omegaconf's "???")
    with pytest.raises(ConfigError) as e:
        ReplayConfig(trace="run", out="out")
    assert str(e.value) == "topology: missing value (a required setting)"


def test_a_long_value_given_where_a_config_class_is_meant_is_cut_to_sixty_characters_in_the_error() -> None:
    # the error stays one short line whatever the dict holds; a repr of 60 characters is shown whole
    dim = DimensionConfig(bandwidth_gbps=1.0, latency_ns=1)
    replay = {"trace": "run", "out": "out", "topology": TopologyConfig(name="sw", dims=[dim])}
    given = {size: {"name": "x" * (size - len(repr({"name": ""})))} for size in (60, 61, 500)}
    shown = {}
    for size, value in given.items():
        with pytest.raises(ConfigError) as e:
            ReplayConfig(**replay, slowdown=value)  # type: ignore[arg-type]
        shown[size] = str(e.value).removeprefix("slowdown: expected a SlowdownConfig, got dict ")
    cut = "{'name': '" + "x" * 49 + "…"
    assert shown == {60: repr(given[60]), 61: cut, 500: cut}
    assert [len(repr(v)) for v in given.values()] == [60, 61, 500]


def test_worker_processes_keep_a_start_method_the_caller_chose_and_are_shut_down_after_an_error() -> None:
    # the pool's exit puts back an unchosen start method even when the work inside failed, shuts the workers
    # down, and leaves a start method the caller had chosen as it was (resetting it would drop the caller's
    # "spawn" for the platform's default at the next process start). In a fresh interpreter, as the start
    # method is the process's.
    code = """
import multiprocessing, os
from skewlens.profiler.threads import process_pool
try:
    with process_pool(1, "skewlens.profiler.threads") as pool:
        pool.submit(os.getpid).result(timeout=60)
        raise KeyError("a failed trace")
except KeyError:
    pass
print(multiprocessing.get_start_method(allow_none=True))
try:
    pool.submit(os.getpid)
except RuntimeError:
    print("shut down")
multiprocessing.set_start_method("spawn")
with process_pool(1, "skewlens.profiler.threads") as pool:
    print(pool.submit(os.getpid).result(timeout=60) != os.getpid())
print(multiprocessing.get_start_method(allow_none=True))
"""
    run = [sys.executable, "-c", code]
    out = subprocess.run(run, check=False, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (out.returncode, out.stdout.splitlines()) == (0, ["None", "shut down", "True", "spawn"]), (
        out.stderr
    )


def test_converting_in_worker_processes_leaves_the_callers_multiprocessing_start_method_unchosen() -> None:
    # import_traces / the export from Python with workers: the standard library fixed the start method as it
    # started the forkserver with skewlens to preload, and a notebook's multiprocessing.set_start_method
    # ("spawn") afterwards was "RuntimeError: context has already been set". In a fresh interpreter, as the
    # start method is the process's.
    code = """
import multiprocessing, os
from skewlens.profiler.threads import process_pool
with process_pool(1, "skewlens.profiler.threads") as pool:
    print(pool.submit(os.getpid).result(timeout=60) != os.getpid())
print(multiprocessing.get_start_method(allow_none=True))
multiprocessing.set_start_method("spawn")
print(multiprocessing.get_start_method())
"""
    run = [sys.executable, "-c", code]
    out = subprocess.run(run, check=False, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (out.returncode, out.stdout.split()) == (0, ["True", "None", "spawn"]), out.stderr


def test_progress_none_is_taken_as_no_progress_by_every_call_that_takes_progress(tmp_path: Path) -> None:
    # a tool builder passing progress=None (as for "no callback") got AttributeError: 'NoneType' object has
    # no attribute 'task' from inside the loader; None now draws nothing, as leaving it out does
    from skewlens.profiler.store.load import load_run
    from skewlens.profiler.store.parquet import export_run
    from skewlens.profiler.store.validate import validate_run
    from skewlens.replay.export_astra import export_astra_sim

    run_dir = straggler_run(tmp_path)
    run = load_validated(run_dir, progress=None)
    assert sorted(run.ranks) == [0, 1]
    assert sorted(load_run(run_dir, progress=None).ranks) == [0, 1]
    assert validate_run(run_dir, progress=None).ok
    res = analyze_run(run, progress=None)
    assert res.stragglers[0].rank == 1 and res.stragglers[0].straggler_cost_ns == 6 * MS
    quiet = export_run(run_dir, tmp_path / "pq", progress=None)
    assert quiet.rows == export_run(run_dir, tmp_path / "pq2").rows and quiet.rows["nodes"] == sum(
        len(rt) for rt in run.ranks.values()
    )
    astra = export_astra_sim(run_dir, tmp_path / "astra", progress=None)
    assert sorted(astra.traces) == [0, 1] and all(p.exists() for p in astra.traces.values())
