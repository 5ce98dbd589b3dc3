"""End-to-end benchmark: whole ``skewlens`` commands, run as a user runs them, at fleet scale.

    .venv/bin/python benchmarks/e2e.py                              # every case, 3 interleaved reps
    .venv/bin/python benchmarks/e2e.py --quick --reps 1             # smoke run: a tenth of the sizes
    .venv/bin/python benchmarks/e2e.py --cases compute,gpu --sizes 1,2 --json e2e.json

Each case runs the console script (``skewlens replay trace=... out=...``, ``skewlens import ...``,
``skewlens analyze ...``) as a separate process with its default outputs, at 1x and 2x its size (``--sizes``),
repeated ``--reps`` times, interleaved (every case and size once, then again), so that drifting load hits
all of them alike. Per case and size: wall time (median, min-max), peak RSS of the process tree (the sum over
the command and its children, sampled every 20 ms with psutil), CPU time of the tree (the larger of the
reaped children's rusage and the sampled per-process times: a lower bound), and the growth from 1x to 2x
(median over median, of wall and of CPU time; target: at most linear). Each is printed
beside the case's anchor (ASTRA-sim or HTA on the same input shape, measured earlier on the reference
machine) and its target; ``anchor / ours`` is the speed-up.

Per-stage times: the commands print no timings, but they draw progress bars on stderr (a label per stage).
The commands run with ``TTY_COMPATIBLE=1`` so that rich draws them into the pipe as it would on a terminal;
the label changes are timestamped as they arrive, so the stages are good to rich's refresh period (0.1 s);
the time before the first bar is start-up (interpreter, imports, Hydra), the time after the last is the
report and exit. Which label is which stage is a regex per command (:class:`StageRules`); a label none
matches is ignored, its time going to its neighbours. ``--no-stages`` runs the commands on a plain pipe
(no bars drawn, no stages).

Loads read a run's decoded columns from its column cache (``RUN/.skewlens-cache``, written by the first load
of a run; see :mod:`skewlens.profiler.store.colcache`). Each command that loads a generated input therefore
runs in two states, reported apart: ``cold`` (the cache removed just before: the command decodes every
``.et`` and writes the cache) and ``warm`` (the cache as the cold run left it), one after the other in every
repetition (``--column-cache`` picks). The GPU case is cold only: its ``analyze`` loads the run its
``import`` has just written.

Inputs are generated untimed, once, into ``--cache`` and reused by later runs (a ``meta.json`` written last
marks a finished one). The generators are the other benchmarks' (``sim_throughput.write_run``,
``analysis_throughput.generate``), :class:`skewlens.profiler.synth.RunBuilder` for the overlapped layers and
:func:`skewlens.profiler.synth_gpu.write_gpu_run` for the Kineto traces. Before the first command the
package's bytecode is written (:func:`compile_package`), as installing it would: the commands time an
installed skewlens, not the compiling of its modules.
"""

from __future__ import annotations

import argparse
import bisect
import codecs
import itertools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
from rich.console import Console
from rich.table import Table

MIB = 1 << 20
#: Interval of the RSS sampling of the command's process tree.
#: Bumped when a generator's output changes, so that cached inputs of an older shape are not reused.
GEN_VERSION = 1
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "skewlens-e2e"

# overlapped layers: per layer a backward op, then its gradients' all_reduce issued asynchronously on a
# communication stream, overlapping the next layer's op; each step ends waiting for its last all_reduce
OVERLAP_COMPUTE_NS = 200_000
OVERLAP_ALLREDUCE_NS = 150_000
OVERLAP_OPTIMIZER_NS = 100_000
OVERLAP_LAYERS_PER_STEP = 50
OVERLAP_COMM_STREAM = 1000
# GPU run: ~(16 x layers + 29) Kineto events per rank and step
GPU_LAYERS = 64
GPU_SLOW_RANK, GPU_SLOW_FACTOR = 5, 1.2
# analyze run: analysis_throughput's data-parallel shape
ANALYZE_STEPS, ANALYZE_STRAGGLER = 10, 3

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
#: What rich writes when a live display stops (it shows the cursor again).
CURSOR_SHOWN = "\x1b[?25h"
#: A rich progress bar's line as the CLIs draw it: label, bar, ``done/total``, elapsed.
BAR_LINE = re.compile(r"^(?P<label>.*?)\s+[━╸╺\-]{3,}\s+\d+/(?:\d+|\?)\s+(?:\d+:\d\d:\d\d|-:--:--)\s*$")


# ---------------------------------------------------------------------------------------------- stages


@dataclass(frozen=True, kw_only=True, slots=True)
class StageRules:
    """How one command's progress-bar labels read as stages."""

    labels: tuple[tuple[str, str], ...]
    """(regex on the label, stage), the first match wins; labels matching none are ignored."""
    closing: bool = False
    """A label names the work done while the label before it was shown (``read rank3...`` is set once rank
    3's file is read), not the work that follows it."""
    final: str = ""
    """With ``closing``: the stage of the time the last label is shown."""
    gaps: Mapping[str, str] = field(default_factory=dict)
    """Stage -> name of the time without a bar between it and the next bar."""
    tails: Mapping[str, str] = field(default_factory=dict)
    """Stage -> name of the time after it when it is the last bar (to the process's exit)."""

    def stage(self, label: str) -> str | None:
        return next((s for pat, s in self.labels if re.search(pat, label)), None)


REPLAY_STAGES = StageRules(
    labels=(
        ("^loading ", "load + validate"),
        ("^simulating", "simulate"),
        ("^writing outputs", "write outputs"),
    ),
    tails={"write outputs": "report + exit"},
)
IMPORT_STAGES = StageRules(
    labels=(
        ("^importing", "read + convert"),
        ("^read ", "read traces"),  # with host traces: the scan that pairs them
        ("^converted ", "read + convert"),  # a worker reads and converts one rank's trace
        ("^written", "write run"),
    ),
    closing=True,
    final="write run",
    tails={"write run": "summary + exit"},
)
ANALYZE_STAGES = StageRules(
    labels=(
        ("^loading", "load"),
        ("^checking dependencies", "validate"),
        ("^analyses", "skew + breakdown + GPU idle + critical path"),
        ("^blame baseline", "blame baseline"),
        ("^what-if blame", "what-if blame"),
        ("^writing outputs", "write outputs"),
    ),
    gaps={"load": "match communication", "what-if blame": "blame records"},
    tails={
        "write outputs": "report + exit",
        "load": "analyses + tables + pictures + report",
        "what-if blame": "blame records + tables + pictures + report",
    },
)


@dataclass(slots=True)
class BarSegment:
    """A run of progress-bar frames showing one label."""

    label: str
    first_s: float
    last_s: float
    closed: bool = False
    """A bar stopped after it (before the next label): the time to the next label had no bar."""


def bar_segments(frames: Sequence[tuple[float, str]]) -> list[BarSegment]:
    """The labels the frames show, in order. A bar's stop is rich showing the cursor again; frames of a bar
    that is up but not redrawn (the command held the GIL) do not end its segment. Escape sequences and lines
    may be split across frames: the text is scanned as one stream, a piece timed by its last character."""
    text = "".join(t for _, t in frames)
    ends = list(itertools.accumulate(len(t) for _, t in frames))
    segs: list[BarSegment] = []
    for m in re.finditer(f"[^\\r\\n]*?(?:{re.escape(CURSOR_SHOWN)}|(?=[\\r\\n])|$)", text):
        piece = m.group()
        if not piece:
            continue
        t = frames[min(bisect.bisect_left(ends, m.end()), len(frames) - 1)][0]
        bar = BAR_LINE.match(ANSI.sub("", piece))
        if bar:
            label = bar["label"].strip()
            if segs and segs[-1].label == label and not segs[-1].closed:
                segs[-1].last_s = t
            else:
                segs.append(BarSegment(label, t, t))
        if piece.endswith(CURSOR_SHOWN) and segs:
            segs[-1].closed = True
    return segs


#: A shorter time between one bar's end and the next bar's start is counted to the bar before (it is one
#: task handing over to the next, below the redraw period's resolution), not reported as a stage of its own.
GAP_MIN_S = 0.05


def stages_from_frames(
    frames: Sequence[tuple[float, str]], wall_s: float, rules: StageRules
) -> dict[str, float]:
    """Seconds per stage, in order, from the stderr ``frames`` (arrival time, text) of one command that ran
    ``wall_s``; they add up to ``wall_s``. Empty where no bar was seen."""
    segs = [(stage, seg) for seg in bar_segments(frames) if (stage := rules.stage(seg.label))]
    if not segs:
        return {}
    names = [s for s, _ in segs[1:]] + [rules.final] if rules.closing else [s for s, _ in segs]
    out: dict[str, float] = {}

    def add(name: str, secs: float) -> None:
        out[name] = out.get(name, 0.0) + max(0.0, secs)

    add("start-up", segs[0][1].first_s)
    for i, (name, (_, seg)) in enumerate(zip(names, segs, strict=True)):
        if i + 1 == len(segs):
            add(name, seg.last_s - seg.first_s)
            add(rules.tails.get(name, f"after {name} (no bar)"), wall_s - seg.last_s)
        elif seg.closed:
            add(name, seg.last_s - seg.first_s)
            gap = segs[i + 1][1].first_s - seg.last_s  # one bar closing and the next opening: the bar's
            add(rules.gaps.get(name, f"after {name} (no bar)") if gap >= GAP_MIN_S else name, gap)
        else:
            add(name, segs[i + 1][1].first_s - seg.first_s)
    return out


# ------------------------------------------------------------------------------------ one command


@dataclass(frozen=True, kw_only=True, slots=True)
class Command:
    """One command line of a case, and how its progress bars read."""

    name: str
    argv: tuple[str, ...]
    rules: StageRules
    out: Path
    """What it writes (removed after it ran; its size is reported)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandRun:
    name: str
    wall_s: float
    peak_rss_bytes: int
    cpu_s: float
    out_bytes: int
    stages_s: dict[str, float]


def _read_stderr(pipe: IO[bytes], t0: float, frames: list[tuple[float, str]]) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = pipe.fileno()
    while chunk := os.read(fd, 1 << 16):
        frames.append((time.perf_counter() - t0, decoder.decode(chunk)))


def dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_command(cmd: Command, *, cwd: Path, stages: bool) -> CommandRun:
    """Run ``cmd`` to completion, sampling its process tree; raises SystemExit naming it if it fails."""
    from proctree import SAMPLE_S, TreeSamples  # a sibling, imported when used (tests load this file by path)

    env = dict(os.environ)
    if stages:  # rich draws its bars into the pipe as on a terminal (what a user sees)
        env.update(TTY_COMPATIBLE="1", TERM="xterm-256color", COLUMNS="200", LINES="50")
    frames: list[tuple[float, str]] = []
    done = threading.Event()
    ended: list[float] = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile() as stdout:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE
        )
        assert proc.stderr is not None
        reader = threading.Thread(target=_read_stderr, args=(proc.stderr, t0, frames), daemon=True)
        reader.start()

        def wait() -> None:
            proc.wait()
            ended.append(time.perf_counter())
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        seen = TreeSamples()
        try:
            root: psutil.Process | None = psutil.Process(proc.pid)
        except psutil.Error:
            root = None
        while not done.is_set():
            if root is not None:
                seen.sample(root)
            done.wait(SAMPLE_S)
        reader.join()
        proc.stderr.close()
        wall = ended[0] - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            stdout.seek(0)
            text = stdout.read().decode(errors="replace")
            err = ANSI.sub("", "".join(t for _, t in frames))
            tail = "\n".join((text + err).strip().splitlines()[-15:])
            raise SystemExit(f"{' '.join(cmd.argv)}: exit code {proc.returncode}\n{tail}")
    # the reaped descendants' rusage misses workers the command did not wait for, the samples a process's
    # last 20 ms and processes shorter than that: the larger of the two, a lower bound
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    cpu = max(reaped, sum(seen.cpu_s.values()))
    out_bytes = dir_bytes(cmd.out) if cmd.out.exists() else 0
    return CommandRun(
        name=cmd.name,
        wall_s=wall,
        peak_rss_bytes=seen.peak_rss_bytes,
        cpu_s=cpu,
        out_bytes=out_bytes,
        stages_s=stages_from_frames(frames, wall, cmd.rules) if stages else {},
    )


# ------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One row of the benchmark: an input shape, the commands run on it, its anchor and target."""

    name: str
    title: str
    ranks: int
    count: int
    """Per rank: nodes, all_reduces, layers or Kineto steps (see ``unit``)."""
    unit: str
    scale: str
    """Which of ``ranks`` / ``count`` the size factors (and ``--quick``'s tenth) multiply."""
    generator: str
    anchor: str
    anchor_s: float | None
    anchor_rss_mib: float | None
    target_s: float
    target_rss_mib: float | None

    def shape(self, factor: float, quick: bool) -> tuple[int, int]:
        """(ranks, count) at size ``factor`` (a tenth of it with ``quick``)."""
        f = factor / 10 if quick else factor
        if self.scale == "ranks":
            return max(2, round(self.ranks * f)), self.count
        return self.ranks, max(1, round(self.count * f))


REPLAY_MODEL = ("comm_mode=model", "topology=ring")  # timed communication, as the ASTRA-sim anchors are
CASES = {
    c.name: c
    for c in (
        Case(
            name="compute", title="replay 64 × 10,000 chained compute nodes", ranks=64, count=10_000,
            unit="nodes", scale="count", generator="compute", anchor="ASTRA-sim analytical 15.3 s, 748 MiB",
            anchor_s=15.3, anchor_rss_mib=748, target_s=1.5, target_rss_mib=None,
        ),
        Case(
            name="fleet", title="replay 1,024 × 10,000 compute nodes (10 M)", ranks=1024, count=10_000,
            unit="nodes", scale="count", generator="compute", anchor="ASTRA-sim 208 s, 11.8 GiB",
            anchor_s=208, anchor_rss_mib=11.8 * 1024, target_s=20, target_rss_mib=2048,
        ),
        Case(
            name="allreduce", title="replay 64 × 1,000 ring all_reduces", ranks=64, count=1000,
            unit="all_reduces", scale="count", generator="allreduce", anchor="ASTRA-sim 38 s",
            anchor_s=38, anchor_rss_mib=None, target_s=3.8, target_rss_mib=None,
        ),
        Case(
            name="wide", title="replay 1,024 ranks × 4 all_reduces", ranks=1024, count=4,
            unit="all_reduces", scale="ranks", generator="allreduce", anchor="ASTRA-sim 86 s",
            anchor_s=86, anchor_rss_mib=None, target_s=8.6, target_rss_mib=None,
        ),
        Case(
            name="overlap", title="replay 64 × 500 overlapped layers (async all_reduces)", ranks=64,
            count=500, unit="layers", scale="count", generator="overlap", anchor="ASTRA-sim 64 s",
            anchor_s=64, anchor_rss_mib=None, target_s=6.4, target_rss_mib=None,
        ),
        Case(
            name="gpu", title="import + analyze 32 GPU ranks × ~200,000 Kineto events", ranks=32, count=190,
            unit="steps", scale="count", generator="gpu", anchor="HTA 217 s, 2.08 GB",
            anchor_s=217, anchor_rss_mib=2.08e9 / MIB, target_s=22, target_rss_mib=1024,
        ),
        Case(
            name="analyze", title="analyze (blame included) 1,024 × 10,000 nodes", ranks=1024,
            count=10_000, unit="nodes", scale="count", generator="dataparallel", anchor="—",
            anchor_s=None, anchor_rss_mib=None, target_s=60, target_rss_mib=4096,
        ),
    )
}  # fmt: skip


def write_overlap_run(run_dir: Path, world: int, layers: int) -> Path:
    """``world`` identical ranks of ``layers`` layers: each layer's op, then its all_reduce issued
    asynchronously on a communication stream while the next layer's op runs; every
    ``OVERLAP_LAYERS_PER_STEP`` layers a step ends with a wait for its last all_reduce and an optimizer op."""
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=world)
    for r in range(world):
        rb = b.rank(r)
        t = 0
        for step_first in range(0, layers, OVERLAP_LAYERS_PER_STEP):
            rb.step(step_first // OVERLAP_LAYERS_PER_STEP)
            ar = 0
            for _ in range(min(OVERLAP_LAYERS_PER_STEP, layers - step_first)):
                op = rb.compute("aten::mm", dur_ns=OVERLAP_COMPUTE_NS, start_ns=t)
                t += OVERLAP_COMPUTE_NS
                ar = rb.collective(
                    CommType.ALL_REDUCE,
                    comm_bytes=MIB,
                    dur_ns=OVERLAP_ALLREDUCE_NS,
                    start_ns=t,
                    stream=OVERLAP_COMM_STREAM,
                    deps=(op,),
                )
            done = t + OVERLAP_ALLREDUCE_NS  # the last all_reduce's end
            wait = rb.compute("c10d::wait", dur_ns=done - t + 1_000, start_ns=t, deps=(ar,))
            t = done + 1_000
            rb.compute("aten::_foreach_add_", dur_ns=OVERLAP_OPTIMIZER_NS, start_ns=t, deps=(wait,))
            t += OVERLAP_OPTIMIZER_NS
    return b.write(run_dir)


def generate(case: Case, ranks: int, count: int, path: Path) -> dict[str, Any]:
    """Write ``case``'s input of ``ranks`` x ``count`` into ``path``; returns what it holds."""
    if case.generator in ("compute", "allreduce"):
        import sim_throughput

        sim_throughput.write_run(path, case.generator, ranks, count)
        return {"nodes": ranks * count}
    if case.generator == "dataparallel":
        import analysis_throughput

        analysis_throughput.generate(path, ranks, count, ANALYZE_STEPS, ANALYZE_STRAGGLER)
        return {"nodes": ranks * count}
    if case.generator == "overlap":
        write_overlap_run(path, ranks, count)
        steps = -(-count // OVERLAP_LAYERS_PER_STEP)
        return {"nodes": ranks * (2 * count + 2 * steps)}
    if case.generator == "gpu":
        import gzip

        from skewlens.profiler.synth_gpu import RANK_FILE, GpuRunSpec, write_gpu_run

        spec = GpuRunSpec(
            world_size=ranks,
            steps=count,
            layers=GPU_LAYERS,
            slow_ranks={GPU_SLOW_RANK % ranks: GPU_SLOW_FACTOR},
        )
        write_gpu_run(spec, path)
        doc = json.loads(gzip.decompress((path / (RANK_FILE.format(rank=0) + ".gz")).read_bytes()))
        return {"events_per_rank": len(doc["traceEvents"]), "events": ranks * len(doc["traceEvents"])}
    raise ValueError(f"case {case.name}: unknown generator {case.generator!r}")


COLD, WARM = "cold", "warm"


def cache_states(case: Case, wanted: Sequence[str]) -> list[str]:
    """The column-cache states ``case`` runs in: the GPU case's ``analyze`` always loads a fresh run."""
    return [COLD] if case.generator == "gpu" else list(wanted)


def set_cache_state(inp: Path, state: str) -> None:
    """Remove ``inp``'s column cache (cold), or load every rank untimed (warm: a load fills what is missing
    and reads the rest)."""
    from skewlens.profiler.store.colcache import CACHE_DIRNAME
    from skewlens.profiler.store.load import decode, locate_run

    if state == COLD:
        shutil.rmtree(inp / CACHE_DIRNAME, ignore_errors=True)
    else:
        for f in locate_run(inp).files.values():
            decode(f)


#: Run by the Python of the console script: writes the bytecode of every module of the installed package.
_COMPILE = """
import os, py_compile, sys, skewlens
n = 0
for d, _, names in os.walk(os.path.dirname(skewlens.__file__), followlinks=True):
    for f in names:
        if f.endswith(".py"):
            py_compile.compile(os.path.join(d, f), doraise=True)
            n += 1
print(n)
"""


def compile_package(skewlens_script: str) -> int:
    """Write the bytecode of the package the console script runs, as installing a wheel does (pip compiles
    its modules); returns how many modules. An editable install writes it on each module's first import,
    but not where ``PYTHONDONTWRITEBYTECODE`` is set (it is on the reference machine): every command would
    then compile each module edited since its ``.pyc`` was written (27 modules, 0.1 s of start-up, after
    one day's commits), which no installed skewlens pays. ``os.walk`` follows the package's symlinked
    subpackages, which ``compileall`` skips."""
    python = Path(skewlens_script).with_name("python")
    out = subprocess.run([str(python), "-c", _COMPILE], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"compiling the package's bytecode failed:\n{out.stderr.strip()}")
    return int(out.stdout.strip() or 0)


def cached_input(
    case: Case, ranks: int, count: int, cache: Path, console: Console
) -> tuple[Path, dict[str, Any]]:
    """The case's input in ``cache``, generated (untimed) unless a finished one is there."""
    key = cache / f"{case.generator}-{ranks}x{count}-v{GEN_VERSION}"
    meta_file = key / "meta.json"
    if meta_file.is_file():
        return key / "input", json.loads(meta_file.read_text())
    shutil.rmtree(key, ignore_errors=True)
    key.mkdir(parents=True)
    t = time.perf_counter()
    with console.status(f"generating {key.name} (not timed)"):
        meta = generate(case, ranks, count, key / "input")
    meta |= {"generate_s": time.perf_counter() - t, "input_bytes": dir_bytes(key / "input")}
    meta_file.write_text(json.dumps(meta))
    console.print(
        f"generated {key.name}: {meta['input_bytes'] / MIB:,.1f} MiB "
        f"in {meta['generate_s']:.1f} s (not timed)"
    )
    return key / "input", meta


def commands(case: Case, inp: Path, scratch: Path, skewlens: str) -> list[Command]:
    """The command lines of one run of ``case`` on ``inp``, writing under ``scratch``."""
    if case.generator == "gpu":
        run, analysis = scratch / "run", scratch / "analysis"
        return [
            Command(
                name="import",
                argv=(skewlens, "import", "--kineto", str(inp), "--out", str(run)),
                rules=IMPORT_STAGES,
                out=run,
            ),
            Command(
                name="analyze",
                argv=(skewlens, "analyze", str(run), "--out", str(analysis)),
                rules=ANALYZE_STAGES,
                out=analysis,
            ),
        ]
    if case.generator == "dataparallel":
        out = scratch / "analysis"
        return [
            Command(
                name="analyze",
                argv=(skewlens, "analyze", str(inp), "--out", str(out)),
                rules=ANALYZE_STAGES,
                out=out,
            )
        ]
    out = scratch / "replay"
    extra = REPLAY_MODEL if case.generator in ("allreduce", "overlap") else ()
    return [
        Command(
            name="replay",
            argv=(skewlens, "replay", f"trace={inp}", f"out={out}", *extra),
            rules=REPLAY_STAGES,
            out=out,
        )
    ]


# -------------------------------------------------------------------------------------- reporting


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def median_stages(runs: Sequence[Sequence[CommandRun]]) -> dict[str, dict[str, float]]:
    """Command -> stage -> median seconds over the runs that saw that stage."""
    out: dict[str, dict[str, float]] = {}
    for cmd_runs in zip(*runs, strict=True):
        seen: dict[str, list[float]] = {}
        for r in cmd_runs:
            for stage, secs in r.stages_s.items():
                seen.setdefault(stage, []).append(secs)
        out[cmd_runs[0].name] = {s: statistics.median(v) for s, v in seen.items()}
    return out


def summarize(
    case: Case, sizes: Mapping[float, dict[str, Any]], quick: bool, cache_state: str
) -> dict[str, Any]:
    """The case's figures in one column-cache state: per size, then growth, anchor ratio and verdict
    (full sizes only)."""
    rows = []
    for factor, s in sorted(sizes.items()):
        runs: list[list[CommandRun]] = s["runs"]
        rows.append(
            {
                "factor": factor,
                "ranks": s["ranks"],
                "count": s["count"],
                **s["meta"],
                "wall_s": spread([sum(c.wall_s for c in run) for run in runs]),
                "peak_rss_mib": spread([max(c.peak_rss_bytes for c in run) / MIB for run in runs]),
                "cpu_s": spread([sum(c.cpu_s for c in run) for run in runs]),
                "out_mib": max(sum(c.out_bytes for c in run) for run in runs) / MIB,
                "stages_s": median_stages(runs),
                "runs": [
                    [
                        {
                            "command": c.name,
                            "wall_s": c.wall_s,
                            "peak_rss_mib": c.peak_rss_bytes / MIB,
                            "cpu_s": c.cpu_s,
                            "out_mib": c.out_bytes / MIB,
                            "stages_s": c.stages_s,
                        }
                        for c in run
                    ]
                    for run in runs
                ],
            }
        )
    growth = None
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        growth = {
            "size_ratio": hi["factor"] / lo["factor"],
            "wall_ratio": hi["wall_s"]["median"] / lo["wall_s"]["median"],
            "rss_ratio": hi["peak_rss_mib"]["median"] / lo["peak_rss_mib"]["median"],
            "cpu_ratio": hi["cpu_s"]["median"] / lo["cpu_s"]["median"],
        }
    one = next((r for r in rows if r["factor"] == 1), None)
    judged = one is not None and not quick
    speedup = rss_gain = passed = None
    if judged and one is not None:
        wall, rss = one["wall_s"]["median"], one["peak_rss_mib"]["median"]
        speedup = case.anchor_s / wall if case.anchor_s else None
        rss_gain = case.anchor_rss_mib / rss if case.anchor_rss_mib else None
        passed = (
            wall <= case.target_s
            and (case.target_rss_mib is None or rss <= case.target_rss_mib)
            and (growth is None or growth["wall_ratio"] <= growth["size_ratio"])
        )
    return {
        "name": case.name,
        "column_cache": cache_state,
        "title": case.title,
        "unit": case.unit,
        "anchor": {"text": case.anchor, "wall_s": case.anchor_s, "peak_rss_mib": case.anchor_rss_mib},
        "target": {"wall_s": case.target_s, "peak_rss_mib": case.target_rss_mib, "growth": "at most linear"},
        "sizes": rows,
        "growth": growth,
        "anchor_over_ours": {"wall": speedup, "peak_rss": rss_gain},
        "passed": passed,
    }


def _mib(v: float) -> str:
    return f"{v / 1024:.2f} GiB" if v >= 1024 else f"{v:,.0f} MiB"


def _target_text(res: Mapping[str, Any]) -> str:
    tgt = res["target"]
    return f"≤ {tgt['wall_s']:g} s" + (f", ≤ {_mib(tgt['peak_rss_mib'])}" if tgt["peak_rss_mib"] else "")


def _speedup_text(res: Mapping[str, Any]) -> str:
    sp = res["anchor_over_ours"]
    if sp["wall"] is None:
        return ""
    return f"{sp['wall']:.1f}×" + (f", RSS {sp['peak_rss']:.1f}×" if sp["peak_rss"] else "")


def _verdict(res: Mapping[str, Any]) -> str:
    return {None: "smoke", True: "PASS", False: "FAIL"}[res["passed"]]


def _stages_text(row: Mapping[str, Any]) -> str:
    parts = []
    for cmd, st in row["stages_s"].items():
        body = ", ".join(f"{s} {v:.2f}" for s, v in st.items()) if st else "(no bars seen)"
        parts.append(f"{cmd}: {body}")
    return "; ".join(parts)


def _label(res: Mapping[str, Any]) -> str:
    return f"{res['name']} ({res['column_cache']})"


def render(results: Sequence[dict[str, Any]], quick: bool) -> list[Table]:
    """Three tables: the figures per case and size, each case against its anchor and target, the stages."""
    smoke = " — SMOKE: --quick, a tenth of the sizes" if quick else ""
    figures = Table(title=f"skewlens end to end{smoke}")
    for col in ("case", "size", "wall s: median (min-max)", "peak RSS", "CPU s"):
        figures.add_column(col, justify="left" if col == "case" else "right")
    against = Table(
        title="against the anchors (1×)" + (": anchors and targets are for the full sizes" if quick else "")
    )
    for col in ("case", "growth: wall (CPU)", "anchor", "target", "anchor/ours", ""):
        against.add_column(col)
    stages = Table(title="stages (median s, read from the progress bars; resolution 0.1 s)")
    for col in ("case", "size", "stages"):
        stages.add_column(col)
    for res in results:
        for k, row in enumerate(res["sizes"]):
            w = row["wall_s"]
            name = _label(res) if k == 0 else ""
            figures.add_row(
                name,
                f"{row['ranks']:,} × {row['count']:,} {res['unit']} ({row['factor']:g}×)",
                f"{w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f})",
                _mib(row["peak_rss_mib"]["median"]),
                f"{row['cpu_s']['median']:.2f}",
            )
            stages.add_row(name, f"{row['factor']:g}×", _stages_text(row))
        g = res["growth"]
        against.add_row(
            _label(res),
            f"×{g['wall_ratio']:.2f} (×{g['cpu_ratio']:.2f}) for ×{g['size_ratio']:g}" if g else "",
            res["anchor"]["text"],
            _target_text(res),
            _speedup_text(res),
            _verdict(res),
        )
    return [figures, against, stages]


# ------------------------------------------------------------------------------------------- main


def parse_list(text: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown case(s) {', '.join(bad)}; known: {', '.join(allowed)}")
    return items


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--cases",
        type=lambda s: parse_list(s, list(CASES)),
        default=list(CASES),
        help=f"comma-separated, of {', '.join(CASES)} (default: all)",
    )
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every case and size, interleaved")
    ap.add_argument("--quick", action="store_true", help="a tenth of the sizes (a smoke run)")
    ap.add_argument(
        "--sizes",
        type=lambda s: [float(x) for x in parse_list(s)],
        default=[1.0, 2.0],
        help="size factors (default 1,2: the growth from the first to the last is reported)",
    )
    ap.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"generated inputs (default {DEFAULT_CACHE})"
    )
    ap.add_argument(
        "--column-cache",
        type=lambda s: parse_list(s, [COLD, WARM]),
        default=[COLD, WARM],
        help="states of the inputs' column caches to run in, each reported apart (default cold,warm)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--no-stages", action="store_true", help="plain pipes: no progress bars, no stage times")
    ap.add_argument(
        "--skewlens",
        default=str(Path(sys.executable).with_name("skewlens")),
        help="the console script to run (default: the one next to this Python)",
    )
    args = ap.parse_args(argv)
    console = console or Console()
    if args.reps < 1 or not args.sizes or min(args.sizes) <= 0:
        raise SystemExit("--reps must be >= 1 and --sizes positive")
    if not Path(args.skewlens).is_file():
        raise SystemExit(f"--skewlens {args.skewlens}: no such file (install the project into the venv)")
    cases = [CASES[c] for c in args.cases]
    sizes = sorted(set(args.sizes))
    inputs: dict[tuple[str, float], tuple[Path, dict[str, Any], int, int]] = {}
    for case in cases:
        for f in sizes:
            ranks, count = case.shape(f, args.quick)
            inp, meta = cached_input(case, ranks, count, args.cache, console)
            inputs[case.name, f] = (inp, meta, ranks, count)
    compiled = compile_package(args.skewlens)
    load_before = os.getloadavg()
    console.print(
        f"{len(cases)} case(s) × {len(sizes)} size(s) × {args.reps} rep(s), interleaved; "
        f"{psutil.cpu_count()} CPUs, load average {load_before[0]:.2f}; "
        f"bytecode of {compiled} modules written"
    )
    runs: dict[tuple[str, float, str], list[list[CommandRun]]] = {
        (c.name, f, st): [] for c in cases for f in sizes for st in cache_states(c, args.column_cache)
    }
    scratch_root = args.cache / "scratch"
    for rep in range(args.reps):
        for case in cases:
            for f in sizes:
                inp, _, ranks, count = inputs[case.name, f]
                for state in cache_states(case, args.column_cache):
                    set_cache_state(inp, state)
                    scratch = scratch_root / f"{case.name}-{f:g}-{rep}"
                    shutil.rmtree(scratch, ignore_errors=True)
                    scratch.mkdir(parents=True)
                    try:
                        done = [
                            run_command(c, cwd=scratch, stages=not args.no_stages)
                            for c in commands(case, inp, scratch, args.skewlens)
                        ]
                    finally:
                        shutil.rmtree(scratch, ignore_errors=True)  # replay outputs of 10 M nodes are GBs
                    runs[case.name, f, state].append(done)
                    console.print(
                        f"rep {rep + 1}/{args.reps} {case.name} {ranks}×{count} ({f:g}×) {state}: "
                        + ", ".join(
                            f"{c.name} {c.wall_s:.2f} s, {c.peak_rss_bytes / MIB:,.0f} MiB" for c in done
                        )
                    )
    results = [
        summarize(
            case,
            {
                f: {
                    "ranks": inputs[case.name, f][2],
                    "count": inputs[case.name, f][3],
                    "meta": inputs[case.name, f][1],
                    "runs": runs[case.name, f, state],
                }
                for f in sizes
            },
            args.quick,
            state,
        )
        for case in cases
        for state in cache_states(case, args.column_cache)
    ]
    for table in render(results, args.quick):
        console.print(table)
    load_after = os.getloadavg()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "quick": args.quick,
            "reps": args.reps,
            "sizes": sizes,
            "stages": not args.no_stages,
            "machine": {
                "cpus": psutil.cpu_count(),
                "memory_gib": psutil.virtual_memory().total / (1 << 30),
                "load_average_before": load_before[0],
                "load_average_after": load_after[0],
            },
            "cases": results,
        }
        args.json.write_text(json.dumps(doc, indent=1))
        console.print(f"figures: {args.json}")
    return 0 if all(r["passed"] is not False for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
