"""benchmarks/e2e.py: progress-bar frames read as stages; its smoke run writes the figures it prints."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "e2e.py"
HIDE, SHOW = "\x1b[?25l", "\x1b[?25h"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def _frame(label: str, done: int, total: int) -> str:
    """One redraw of a bar as rich writes it to a terminal."""
    return f"\r\x1b[2K{label} \x1b[90m{'━' * 40}\x1b[0m \x1b[32m{done}/{total}\x1b[0m \x1b[33m0:00:01\x1b[0m"


def test_a_replays_progress_bar_reads_as_its_stages_adding_up_to_the_wall_time() -> None:
    e2e = _bench()
    frames = [
        (0.5, HIDE + _frame("loading /runs/x", 0, 3)),
        (1.0, _frame("loading /runs/x", 0, 3)),
        (1.5, _frame("simulating", 1, 3)),
        (1.7, _frame("simulating", 1, 3)),
        (2.0, _frame("writing outputs", 2, 3)),
        (2.4, _frame("writing outputs", 3, 3) + "\n" + SHOW),
    ]
    stages = e2e.stages_from_frames(frames, 3.0, e2e.REPLAY_STAGES)
    assert list(stages) == ["start-up", "load + validate", "simulate", "write outputs", "report + exit"]
    assert list(stages.values()) == pytest.approx([0.5, 1.0, 0.5, 0.4, 0.6])
    # the same bytes cut anywhere (inside an escape sequence, inside the bar) read the same
    text = "".join(t for _, t in frames)
    cuts = [3, 70, 71, 150, 200, 260, 300, len(text) - 4, len(text)]
    times = [0.5, 0.5, 0.5, 1.0, 1.5, 1.5, 2.0, 2.4, 2.4]
    pieces = [(t, text[a:b]) for t, a, b in zip(times, [0, *cuts[:-1]], cuts, strict=True)]
    seen = [s.label for s in e2e.bar_segments(pieces)]
    assert seen == ["loading /runs/x", "simulating", "writing outputs"]


def test_an_imports_labels_name_the_work_that_led_to_them() -> None:
    """``read b.json`` is set once b is scanned: the time it is shown is the first rank's conversion."""
    e2e = _bench()
    frames = [
        (0.4, _frame("importing", 0, 5)),
        (0.6, _frame("read a.json", 1, 5)),
        (0.9, _frame("read b.json", 2, 5)),
        (1.2, _frame("converted a.json", 3, 5)),
        (1.5, _frame("converted b.json", 4, 5)),
        (1.8, _frame("converted b.json", 4, 5) + SHOW),
    ]
    stages = e2e.stages_from_frames(frames, 2.0, e2e.IMPORT_STAGES)
    assert list(stages) == ["start-up", "read traces", "read + convert", "write run", "summary + exit"]
    assert list(stages.values()) == pytest.approx([0.4, 0.5, 0.6, 0.3, 0.2])


def test_time_between_two_bars_is_named_and_a_bar_not_redrawn_is_still_up() -> None:
    e2e = _bench()
    frames = [
        (0.3, _frame("loading ranks", 0, 2)),
        (0.4, _frame("loading rank-0.et", 0, 2)),
        (0.9, _frame("loading rank-1.et", 1, 2) + SHOW),  # the bar stops
        (1.0, HIDE + _frame("checking dependencies: rank 0", 0, 2)),
        (1.19, _frame("checking dependencies: rank 1", 1, 2) + SHOW),  # 0.01 s to the next bar: no stage
        (1.2, HIDE + _frame("analyses: index", 0, 4)),
        (1.3, _frame("analyses: skew", 1, 4)),
        (1.5, _frame("blame baseline: lowering", 0, 3)),
        (1.7, _frame("blame baseline: simulating", 2, 3)),
        (2.0, _frame("what-if blame", 0, 3)),
        (3.5, _frame("what-if blame", 2, 3)),  # 1.5 s without a redraw: the GIL was held
        (4.0, _frame("what-if blame", 3, 3) + SHOW),
    ]
    stages = e2e.stages_from_frames(frames, 5.0, e2e.ANALYZE_STAGES)
    assert stages == pytest.approx(
        {
            "start-up": 0.3,
            "load": 0.6,
            "match communication": 0.1,
            "validate": 0.2,
            "skew + breakdown + GPU idle + critical path": 0.3,
            "blame baseline": 0.5,
            "what-if blame": 2.0,
            "blame records + tables + pictures + report": 1.0,
        }
    )


def test_frames_without_a_bar_give_no_stages() -> None:
    e2e = _bench()
    assert e2e.stages_from_frames([(0.1, "warning: something\n")], 1.0, e2e.REPLAY_STAGES) == {}


@pytest.mark.slow
def test_the_quick_smoke_run_writes_the_figures_of_each_size(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    args = ["--quick", "--reps", "1", "--cases", "compute", "--json", str(out), "--cache", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["quick"] is True and doc["reps"] == 1
    case, warm = doc["cases"]
    assert (case["column_cache"], warm["column_cache"]) == ("cold", "warm")
    assert case["name"] == warm["name"] == "compute"
    assert case["anchor"]["wall_s"] == 15.3 and case["target"]["wall_s"] == 1.5
    assert len(warm["sizes"]) == 2 and all(r["wall_s"]["median"] > 0 for r in warm["sizes"])
    assert case["passed"] is None  # a smoke run is not judged against the full-size targets
    small, large = case["sizes"]
    assert (small["ranks"], small["count"], large["count"]) == (64, 1000, 2000)
    assert large["nodes"] == 2 * small["nodes"] == 128_000
    for row in (small, large):
        (run,) = row["runs"]
        (replay,) = run
        assert replay["command"] == "replay"
        assert row["wall_s"]["median"] == replay["wall_s"] > 0
        assert row["peak_rss_mib"]["median"] > 20  # a Python process with numpy and pyarrow loaded
        assert replay["out_mib"] > 0  # timeline.parquet, summary.parquet, timeline.json
        assert row["input_bytes"] > 0
        stages = replay["stages_s"]
        if stages:  # the bars are redrawn at 10 Hz: a very fast replay may show none
            assert sum(stages.values()) == pytest.approx(replay["wall_s"])
    ratio = statistics.median([r[0]["wall_s"] for r in large["runs"]]) / small["wall_s"]["median"]
    assert case["growth"]["wall_ratio"] == pytest.approx(ratio)
    assert case["growth"]["size_ratio"] == 2
    assert "compute" in proc.stdout and "SMOKE" in proc.stdout


@pytest.mark.slow
def test_the_benchmark_writes_fresh_bytecode_for_every_module_of_the_package_before_timing() -> None:
    """Where PYTHONDONTWRITEBYTECODE is set, an edited module of an editable install would be compiled by
    every timed command; the benchmark compiles them all first, symlinked subpackages included."""
    import importlib.util as iu

    import skewlens

    e2e = _bench()
    n = e2e.compile_package(str(Path(sys.executable).with_name("skewlens")))
    root = Path(skewlens.__file__).parent
    sources = [Path(d) / f for d, _, fs in os.walk(root, followlinks=True) for f in fs]
    sources = [p for p in sources if p.suffix == ".py"]
    assert n == len(sources) > 100
    assert any(p.parent.is_symlink() or p.parent.parent.is_symlink() for p in sources)
    for src in sources:
        header = Path(iu.cache_from_source(str(src))).read_bytes()[:16]
        st = src.stat()
        assert int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF, src
        assert int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF, src
