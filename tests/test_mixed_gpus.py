"""A job whose ranks ran on different GPUs (an A100 among H100s): import and analyze say which rank ran on
which, and replacing the slow GPU (a GPU slowdown below 1) replays the run its peers' speed gives."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shlex
import shutil
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from skewlens.analysis import analyze_run
from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.records import CauseKind
from skewlens.analysis.render import mixed_gpus_note, print_report, report, what_if_notes
from skewlens.cli import main as skewlens_main
from skewlens.profiler.importers import import_traces
from skewlens.profiler.manifest import Manifest, read_manifest, write_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.parquet import export_run
from skewlens.profiler.store.schema import META_TABLE, META_VERSION, RankRecord, read_table, write_table
from skewlens.profiler.synth_gpu import GpuRunSpec, simulate_gpu_run, write_gpu_run
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

H100 = "NVIDIA H100 80GB HBM3 (132 SMs, 79.2 GiB)"
A100_PROPS = {"name": "NVIDIA A100-SXM4-80GB", "numSms": 108, "totalGlobalMem": 85899345920}
A100 = "NVIDIA A100-SXM4-80GB (108 SMs, 80.0 GiB)"
#: Rank 2 ran on an A100 whose kernels took 1.6 times an H100's (no jitter: the truth is exact).
SPEC = GpuRunSpec(
    world_size=4,
    steps=3,
    layers=4,
    slow_ranks={2: 1.6},
    device_properties={2: A100_PROPS},
    kernel_jitter=0.0,
    seed=0,
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("mixed")
    write_gpu_run(SPEC, tmp / "kineto")
    import_traces([tmp / "kineto"], None, tmp / "run")
    return tmp / "run"


def test_import_keeps_each_ranks_gpu_as_its_traces_device_properties_describe_it(run_dir: Path) -> None:
    # deviceProperties was not read: the manifest said cuda:2 of every rank, whatever GPU it was
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["gpus"] == {"0": H100, "1": H100, "2": A100, "3": H100}
    assert Manifest.from_json(manifest).gpus == {0: H100, 1: H100, 2: A100, 3: H100}


def test_a_manifest_whose_traces_name_no_gpu_is_written_without_the_key() -> None:
    m = Manifest(world_size=1, ranks=(0,), devices={0: "cpu"})
    assert "gpus" not in m.to_json()
    assert Manifest.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_analyze_says_which_ranks_ran_on_which_gpu_where_it_compares_their_kernels(run_dir: Path) -> None:
    # before, rank 2 read "compute grew: sm90_xmma_gemm... +1.3 ms" against H100 peers, the A100 unsaid
    result = analyze_run(load_run(run_dir))
    assert result.stragglers[0].rank == 2 and result.stragglers[0].cause.startswith("compute grew")
    buf = io.StringIO()
    print_report(Console(file=buf, width=400), report(result))
    text = " ".join(buf.getvalue().split())
    assert f"the ranks ran on 2 kinds of GPU: ranks 0-1, 3 on {H100}; rank 2 on {A100}." in text
    assert "compare each rank's kernels with its peers' on other GPUs" in text


def _report_text(run_dir: Path) -> tuple[AnalysisResult, str]:
    """``run_dir``'s analysis and its printed report, 400 wide, its whitespace folded."""
    result = analyze_run(load_run(run_dir))
    buf = io.StringIO()
    print_report(Console(file=buf, width=400), report(result))
    return result, " ".join(buf.getvalue().split())


def _first_grown(result: AnalysisResult, rank: int) -> set[tuple[str, bool]]:
    """The first-named op, and whether it is GPU work, of each compute cause of an event blamed on
    ``rank`` that made its peers wait."""
    return {
        (e.cause.ops[0][0], e.cause.op_on_gpu)
        for e in result.skew.events
        if e.blamed_rank == rank and e.cause.kind is CauseKind.COMPUTE and e.total_exposed_wait_ns > 0
    }


def _grown_ops(result: AnalysisResult, rank: int) -> dict[str, int]:
    """Each op named by a compute cause of an event blamed on ``rank`` that made its peers wait, and the
    most it grew by in one."""
    out: dict[str, int] = {}
    for e in result.skew.events:
        if e.blamed_rank == rank and e.cause.kind is CauseKind.COMPUTE and e.total_exposed_wait_ns > 0:
            for name, grew in e.cause.ops:
                out[name] = max(out.get(name, 0), grew)
    return out


def test_analyze_names_the_gpu_replacement_not_an_op_replay_deleting_a_kernel_of_the_rank_on_another_gpu(
    run_dir: Path,
) -> None:
    # before: "rank 2 made its peers wait for its scope sm90_xmma_gemm_..._cublas, which the median member did
    # not run", an op replay at factor 0 deleting the kernel (no 'void ' before a cuBLAS kernel's name): a
    # slower GPU is slow_gpu's, the note on the GPUs
    result, text = _report_text(run_dir)
    assert what_if_notes(result, [2]) == []
    assert "its scope" not in text and "kind:op" not in text
    assert (
        f"skewlens replay trace={run_dir} out=OUT slowdown=slow_gpu slowdown.rank=R slowdown.factor=F" in text
    )
    # the kernels that grew most, GPU work by the stream they ran on, each by 0.6 times its time on an
    # H100 (the 1.6 ms cuBLAS kernels 0.96 ms, the 0.8 ms ones 0.48) at every step: at step 0 the windows
    # began at the first all_reduce's end, which the H100 ranks' threads had run past (their wait there
    # hidden under compute), and the cuBLAS kernel read +1.28 ms
    assert {g for _, g in _first_grown(result, 2)} == {True}
    grown = _grown_ops(result, 2)
    for t, ms in (("nt", 0.96), ("tn", 0.48)):
        assert grown[f"sm90_xmma_gemm_f32f32_tf32f32_f32_{t}_n_tilesize128x128x32_cublas"] == pytest.approx(
            ms * 1e6, abs=1e3
        )


def test_analyze_names_no_op_replay_for_a_kernel_without_void_that_grew_on_a_slower_gpu_of_its_peers_model(
    tmp_path: Path,
) -> None:
    # rank 2's kernels take 1.6 times its peers' on the same H100s: a slower GPU (the what-if cost says
    # what it cost), not a scope; before, "its scope sm90_xmma_gemm_..._cublas" with an op replay deleting it
    write_gpu_run(dataclasses.replace(SPEC, device_properties={}), tmp_path / "kineto")
    import_traces([tmp_path / "kineto"], None, tmp_path / "run")
    result, text = _report_text(tmp_path / "run")
    assert result.stragglers[0].rank == 2
    assert what_if_notes(result, [0, 1, 2, 3]) == []
    assert "its scope" not in text and "kind:op" not in text
    kernel = "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_cublas"
    assert {g for _, g in _first_grown(result, 2)} == {True}
    assert kernel in _grown_ops(result, 2)
    # what a row is: the kernels ran on a GPU stream, the operators that launched them on the host
    ix = result.index
    gpu = {n for n, g in zip(ix.names, ix.gpu_names.tolist(), strict=True) if g}
    assert "ampere_sgemm_128x64_nt" in gpu and "Memcpy DtoH (Device -> Pageable)" in gpu
    assert "aten::mm" not in gpu and "Optimizer.step#SGD.step" not in gpu


def test_the_gpu_replacement_analyze_prints_at_80_columns_is_one_line_that_runs_once_r_and_f_are_filled_in(
    run_dir: Path, tmp_path: Path
) -> None:
    # before, the note held "skewlens replay slowdown=slow_gpu slowdown.rank=R slowdown.factor=F", wrapped
    # with the note, without trace= or out=: pasted, the replay refused it for the missing keys
    buf = io.StringIO()
    print_report(Console(file=buf, width=80), report(analyze_run(load_run(run_dir))))
    (line,) = [x for x in buf.getvalue().splitlines() if x.startswith("skewlens replay ") and "slow_gpu" in x]
    said = "out=OUT slowdown=slow_gpu slowdown.rank=R slowdown.factor=F"
    assert line == f"skewlens replay trace={run_dir} {said}"
    filled = {"out=OUT": f"out={tmp_path / 'out'}", "slowdown.rank=R": "slowdown.rank=2"}
    args = [filled.get(w, w) for w in shlex.split(line)[2:]]
    assert skewlens_main(["replay", *args[:-1], "slowdown.factor=0.625", "progress=false"]) == 0
    # the truth of the same run without the slow rank (steps after the first, as below)
    rows = pq.read_table(tmp_path / "out" / "summary.parquet").to_pylist()
    times = {r["step"]: r["step_time_ns"] for r in rows if r["rank"] == 2}
    assert [times[k] for k in (1, 2)] == list(simulate_gpu_run(SPEC.without_slow_ranks()).step_period_ns[1:])


def test_analyze_says_nothing_of_gpus_where_every_rank_ran_on_one_kind(tmp_path: Path) -> None:
    write_gpu_run(dataclasses.replace(SPEC, device_properties={}), tmp_path / "kineto")
    import_traces([tmp_path / "kineto"], None, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert set(run.manifest.gpus.values()) == {H100}
    assert mixed_gpus_note(analyze_run(run, blame=False)) is None


def test_replacing_the_slow_gpu_replays_the_run_of_its_peers_speed_and_finishes_nothing_later(
    run_dir: Path,
) -> None:
    # a GPU slowdown of 1 / 1.6 on rank 2: the truth of the same run with no slow rank (steps after the
    # first: the first is timed from the first replayed node, the truth from the first step's annotation)
    run = load_run(run_dir)
    base = simulate(run)
    faster = simulate(
        run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(2,), factor=0.625, device="gpu")])
    )
    truth = simulate_gpu_run(SPEC.without_slow_ranks())
    times = faster.step_times()
    assert [times[k] for k in (1, 2)] == list(truth.step_period_ns[1:])
    for r in run.ranks:
        assert np.all(faster.end_ns[r] <= base.end_ns[r])


def test_the_what_if_of_a_rank_whose_gpu_alone_is_slow_costs_what_its_slowness_cost_the_run(
    tmp_path: Path,
) -> None:
    # short kernels (40-80 us) beside 20 us host operators: one ratio over an interval's host and GPU
    # work scaled rank 2's kernels by less than 1 / 1.6 (and its host by as much): 463,125 ns of 569,197
    spec = dataclasses.replace(
        SPEC, forward_kernel_ns=40_000, backward_kernel_ns=80_000, optimizer_kernel_ns=20_000
    )
    truth = write_gpu_run(spec, tmp_path / "kineto")
    import_traces([tmp_path / "kineto"], None, tmp_path / "run")
    top = analyze_run(load_run(tmp_path / "run")).stragglers[0]
    cost_ns = truth.total_ns - simulate_gpu_run(spec.without_slow_ranks()).total_ns
    assert top.rank == 2
    assert abs(top.straggler_cost_ns - cost_ns) <= 3  # the what-if's durations are rounded to the ns


@pytest.mark.parametrize(
    ("named", "world", "said"),
    [
        # 6 models, two ranks each: the 2 beyond four counted; ranks 12-13 unsaid
        (
            12,
            14,
            (
                "2 more models on the other ranks (manifest.json's gpus); "
                "no GPU said by the traces of ranks 12-13. "
            ),
        ),
        # exactly 4 models: all named, nothing counted ('0 more models' on a '>=' mutant); rank 8 unsaid
        (8, 9, "no GPU said by the trace of rank 8. "),
    ],
)
def test_the_gpu_note_names_four_models_counts_the_rest_and_names_the_ranks_no_trace_said_a_gpu_of(
    named: int, world: int, said: str
) -> None:
    gpus = {r: f"GPU {r // 2}" for r in range(named)}
    manifest = Manifest(world_size=world, ranks=tuple(range(world)), gpus=gpus)
    note = mixed_gpus_note(SimpleNamespace(run=SimpleNamespace(manifest=manifest)))  # type: ignore[arg-type]
    assert note is not None
    assert note.startswith(
        f"the ranks ran on {named // 2} kinds of GPU: ranks 0-1 on GPU 0; ranks 2-3 on GPU 1; ranks 4-5 on "
        f"GPU 2; ranks 6-7 on GPU 3; {said}"
    )


def _gpu_query() -> str:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "parquet.md").read_text()
    (query,) = [q for q in re.findall(r"```sql\n(.*?)```", doc, flags=re.S) if "r.gpu" in q]
    return query


def test_the_exports_ranks_table_gives_each_ranks_gpu_and_the_documented_query_ranks_the_a100_first(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ranks.parquet had host and device (cuda:2) but no GPU: "which ranks on A100s were slow" had no column
    out = tmp_path / "pq"
    export_run(run_dir, out, workers=1)
    ranks = read_table(out / "ranks.parquet", RankRecord).to_pylist()
    assert [(r["rank"], r["device"], r["gpu"]) for r in ranks] == [
        (0, "cuda:0", H100),
        (1, "cuda:1", H100),
        (2, "cuda:2", A100),
        (3, "cuda:3", H100),
    ]
    assert (
        skewlens_main(["analyze", str(run_dir), "--out", str(out / "AN"), "--no-blame", "--no-pictures"]) == 0
    )
    monkeypatch.chdir(out)
    rows = duckdb.sql(_gpu_query()).fetchall()
    breakdown = pq.read_table(out / "AN" / "step_breakdown.parquet").to_pylist()
    mean = {r: round(np.mean([b["compute_ns"] for b in breakdown if b["rank"] == r])) for r in range(4)}
    assert [(gpu, rank) for gpu, rank, _ in rows] == [(A100, 2), (H100, 0), (H100, 1), (H100, 3)]
    assert [c for _, _, c in rows] == [mean[2], mean[0], mean[1], mean[3]]
    assert rows[0][2] > rows[1][2]


def test_a_ranks_file_of_schema_13_reads_with_a_null_gpu_as_does_a_rank_no_trace_names_a_gpu_of(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "pq"
    export_run(run_dir, out, workers=1)
    f = out / "ranks.parquet"
    v13 = pq.read_table(f).drop_columns(["gpu"])
    write_table(v13.replace_schema_metadata({META_VERSION: b"13", META_TABLE: b"ranks"}), f)
    tbl = read_table(f, RankRecord)
    assert tbl["gpu"].to_pylist() == [None] * 4 and tbl["device"].to_pylist() == [
        f"cuda:{r}" for r in range(4)
    ]
    # a run whose manifest says no GPU (a CPU capture, a trace without deviceProperties): null, not ''
    m = read_manifest(run_dir)
    plain = tmp_path / "plain"
    shutil.copytree(run_dir, plain)
    write_manifest(plain, dataclasses.replace(m, gpus={r: g for r, g in m.gpus.items() if r != 1}))
    export_run(plain, tmp_path / "pq2", workers=1)
    assert read_table(tmp_path / "pq2" / "ranks.parquet", RankRecord)["gpu"].to_pylist() == [
        H100,
        None,
        A100,
        H100,
    ]


def test_an_extrapolated_run_gives_each_copied_rank_the_gpu_of_the_rank_it_copies(run_dir: Path) -> None:
    from skewlens.replay.scale import scale_run

    run = load_run(run_dir)
    scaled = scale_run(run, 8)  # rank i copies rank i mod 4
    assert scaled.manifest.gpus == {r: A100 if r % 4 == 2 else H100 for r in range(8)}
    assert scaled.manifest.devices == {r: f"cuda:{r % 4}" for r in range(8)}
    assert scale_run(run, 6, source=2).manifest.gpus == dict.fromkeys(range(6), A100)
    seeded = scale_run(run, 16, seed=3)  # a seeded draw: each rank the GPU of the rank it drew
    drawn = {r: seeded.source_rank(r) for r in range(16)}
    assert seeded.manifest.gpus == {r: run.manifest.gpus[s] for r, s in drawn.items()}
    assert set(drawn.values()) == {0, 1, 2, 3}


def test_the_documented_gpu_replacement_that_keeps_host_device_copies_as_recorded_gives_the_documented_steps(
    dlrm_imported: Path, tmp_path: Path
) -> None:
    # slow_gpu scales copies too, which PCIe bounds: docs/replay.md says so on DLRM, with the override that
    # keeps them as recorded; these are its figures
    doc = (Path(__file__).resolve().parents[1] / "docs" / "replay.md").read_text()
    (entries,) = re.findall(r"`'(slowdown\.entries=\[\{kind:op,ranks:\[7\].*?\}\])'`", doc)
    runs = {
        "none": [],
        "slow_gpu": ["slowdown=slow_gpu", "slowdown.rank=7", "slowdown.factor=0.5"],
        "kept": [entries],
    }
    steps, durs = {}, {}
    for name, overrides in runs.items():
        out = tmp_path / name
        assert skewlens_main(["replay", f"trace={dlrm_imported}", f"out={out}", *overrides]) == 0, name
        rows = pq.read_table(out / "summary.parquet").to_pylist()
        steps[name] = ({r["rank"]: r["step_time_ns"] for r in rows}[7], max(r["step_time_ns"] for r in rows))
        timeline = pq.read_table(out / "timeline.parquet").to_pylist()
        durs[name] = {}  # each kind of copy's total on rank 7
        for t in timeline:
            if t["rank"] == 7 and not t["is_cpu_op"] and t["name"].startswith("Memcpy"):
                dur_ns = t["replay_end_ns"] - t["replay_start_ns"]
                durs[name][t["name"]] = durs[name].get(t["name"], 0) + dur_ns
    assert steps == {
        "none": (12_509_000, 18_711_000),
        "slow_gpu": (12_503_500, 18_707_500),
        "kept": (12_509_000, 18_711_000),
    }
    assert durs["none"] == {
        "Memcpy HtoD (Pageable -> Device)": 9_000,
        "Memcpy HtoD (Pinned -> Device)": 6_000,
        "Memcpy DtoD (Device -> Device)": 3_000,
        "Memcpy DtoH (Device -> Pageable)": 2_000,
    }
    assert durs["slow_gpu"] == {n: d // 2 for n, d in durs["none"].items()}
    assert durs["kept"] == {n: d // 2 if "DtoD" in n else d for n, d in durs["none"].items()}


def test_a_real_replays_run_names_the_gpu_each_rank_replayed_on_as_its_worker_said(
    run_dir: Path, tmp_path: Path
) -> None:
    # the replay's OUT/run said cuda:N of each rank and no GPU (a worker on CUDA now says its device's, as a
    # capture does: unverified on a device; here its result files are written by hand)
    from skewlens.replay.real.api import _replay_manifest
    from skewlens.replay.real.plan import RESULT_FILE

    for r in range(4):
        result = {"rank": r, "host": "h", "device": f"cuda:{r}", "clock_offset_ns": 0}
        if r != 3:  # rank 3's device could not say
            result["gpu"] = A100 if r == 2 else H100
        (tmp_path / RESULT_FILE.format(rank=r)).write_text(json.dumps(result))
    original = read_manifest(run_dir)
    m = _replay_manifest(work_dir=tmp_path, original=original, backend="nccl", cmd=["x"], source=run_dir)
    assert m.gpus == {0: H100, 1: H100, 2: A100}
    assert m.devices == {r: f"cuda:{r}" for r in range(4)}
