"""Real replay: re-execute a run's traces on real processes through torch.distributed.

    result = real_replay(run_dir=RUN, out_dir=OUT, effects=NO_EFFECTS, cfg=RealConfig())

1. load and validate the run (the store's checks: matching collectives, p2p pairs);
2. turn each rank's trace into a replay plan (:mod:`skewlens.replay.real.plan`: gaps, dependencies, effects);
3. start one worker per traced rank through torchrun (:mod:`skewlens.replay.real.launch`), each
   re-creating the process groups and re-issuing every collective / p2p op with the recorded type, size,
   dtype and group, with calibrated compute in between (:mod:`skewlens.replay.real.worker`);
4. the replay is captured by the profiler (``skewlens.profiler.capture``, collectives level, as ``skewlens
   profile`` captures a training job) into ``OUT_DIR/run`` (manifest ``source="replay"``), which loads,
   checks and analyses like any captured run; the workers also record each replayed node's own times
   into ``OUT_DIR/real/replayed`` (the original nodes, same ids, with replayed times on rank 0's clock).
   With ``cfg.capture = "self"`` that node-aligned record is ``OUT_DIR/run`` and the profiler stays out.

Step times (``RealReplayResult``) are per rank: the span of each step's nodes (first start to last end),
averaged over the steps, for the original and for ``OUT_DIR/run``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skewlens.console import print_warning
from skewlens.profiler.capture.records import DEBUG_ENV
from skewlens.profiler.manifest import (
    MANIFEST_NAME,
    PARTS_DIR,
    RANK_FILE,
    Manifest,
    StepSpan,
    write_manifest,
)
from skewlens.profiler.store import RunTrace, load_run
from skewlens.profiler.store.issues import no_trace_line
from skewlens.profiler.store.load import locate_run
from skewlens.profiler.store.model import RankTrace
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.effects import Effects
from skewlens.replay.errors import ConfigError, ReplayError
from skewlens.replay.execution import execution_model
from skewlens.replay.outputs import REAL_FAILED_DIR, REAL_RUN_DIR, REAL_WORK_DIR, check_trace_outside
from skewlens.replay.real.capture import finish_capture
from skewlens.replay.real.launch import TORCHRUN_LOGS, launcher_command, launcher_log, run_workers
from skewlens.replay.real.plan import (
    ERROR_FILE,
    KIND_COMPUTE,
    KIND_NESTED,
    PROGRESS_FILE,
    RESULT_FILE,
    PlanMeta,
    ReplayOp,
    all_to_all_splits,
    group_specs,
    rank_plan,
    read_json_bounded,
    warmup_ops,
    write_plan,
)
from skewlens.replay.real.result import RankStepTimes, RealReplayResult, rank_step_times, step_spans
from skewlens.replay.summary import moved_step_marks

if TYPE_CHECKING:  # the config module brings omegaconf: the workers and the plan do not need it
    from skewlens.replay.config import RealConfig

#: Allowance for start-up (interpreter + torch import, rendezvous, groups) in the whole-replay deadline.
STARTUP_ALLOWANCE_S = 120.0
#: Memory one worker holds: 236 MiB peak RSS per gloo worker (torch 2.13, CPU), measured on a 2-rank replay
#: of a 94-node trace with the profiler capturing it; torch alone is 218 MiB.
WORKER_RSS_BYTES = 240 * 2**20


def _available_memory() -> int:
    """Bytes of memory this host can give new processes now (psutil's ``available``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_host_memory(nproc: int, available: int, run_dir: Path) -> None:
    """Refuse ``nproc`` workers on this host when they would not fit in ``available`` bytes (a 512-rank
    trace would start 512 torch processes, 120 GiB, and push the host into swap or the OOM killer)."""
    need = nproc * WORKER_RSS_BYTES
    if need > available:
        raise ReplayError(
            f"{run_dir}: cannot replay on real processes: {nproc} ranks on this host need about "
            f"{need / 2**30:.1f} GiB ({WORKER_RSS_BYTES // 2**20} MiB per worker process) and "
            f"{available / 2**30:.1f} GiB is available; replay it across hosts (real.launcher_args: "
            "--nnodes, --node-rank, --rdzv-endpoint, and real.nproc ranks per host), or in the simulator "
            "(mode=sim)"
        )


def _comm_label(run: RunTrace, rt: RankTrace, i: int) -> str:
    """``all_reduce group '0' seq 10 (node 15)``, ``send to rank 1 tag 0 (node 9)`` and the like."""
    node = f"(node {rt.node_id[i]})"
    if rt.node_type[i] == int(NodeType.COMM_COLL):
        group = f" group {run.pg_names[rt.pg[i]]!r}" if rt.pg[i] >= 0 else ""
        seq = f" seq {rt.seq[i]}" if rt.seq[i] >= 0 else ""
        return f"{CommType(int(rt.comm_type[i])).name.lower()}{group}{seq} {node}"
    if rt.node_type[i] == int(NodeType.COMM_SEND):
        return f"send to rank {rt.dst[i]} tag {rt.tag[i]} {node}"
    return f"recv from rank {rt.src[i]} tag {rt.tag[i]} {node}"


def serial_deadlock(run: RunTrace, plans: dict[int, list[ReplayOp]]) -> str | None:
    """Where the workers, each running its rank's ``plans`` on one thread in plan order, would wait for each
    other for ever: one line naming each rank's op it would stop at and what that op waits for; None where
    every rank gets through. An op waits (as :class:`~skewlens.replay.real.worker.Runner` does) for the
    communication it depends on (start and wait dependencies) and, issued blocking, for itself; a member
    of a sync group completes once the arrivals its :attr:`~skewlens.replay.execution.SyncGroup.waits_for`
    names were issued (an eager send at its own arrival); communication of no sync group, GPU work and
    nested ops hold nothing. Issuing inside a host op (``issues_inside``) is taken at the op's own turn,
    which is never earlier than the worker issues it."""
    em = execution_model(run)
    member: dict[tuple[int, int], tuple[int, int]] = {}
    for g, sg in enumerate(em.syncs):
        for k, (r, row) in enumerate(zip(sg.ranks, sg.rows, strict=True)):
            member[r, row] = (g, k)
    arrived: list[set[int]] = [set() for _ in em.syncs]

    def done(r: int, row: int) -> bool:
        if (r, row) not in member:
            return True
        g, k = member[r, row]
        sg = em.syncs[g]
        if sg.detached[k]:
            return k in arrived[g]
        w = sg.waits_for[k]
        return len(arrived[g]) == len(sg.ranks) if w < 0 else w in arrived[g]

    ops = {r: [o for o in p if o.kind != KIND_NESTED and not o.gpu] for r, p in plans.items()}
    at = dict.fromkeys(ops, 0)
    issued: dict[int, set[int]] = {r: set() for r in ops}
    moved = True
    while moved:
        moved = False
        for r, seq in ops.items():
            while at[r] < len(seq):
                op = seq[at[r]]
                if not all(done(r, d) for d in (*op.deps, *op.wait_deps) if d in issued[r]):
                    break
                if op.row not in issued[r] and op.kind != KIND_COMPUTE:
                    issued[r].add(op.row)
                    if (r, op.row) in member:
                        g, k = member[r, op.row]
                        arrived[g].add(k)
                    moved = True
                if op.blocking and not done(r, op.row):
                    break
                at[r] += 1
                moved = True
    stuck = [r for r in ops if at[r] < len(ops[r])]
    if not stuck:
        return None
    parts = []
    for r in stuck[:4]:
        op = ops[r][at[r]]
        rt = run.ranks[r]
        waits = [d for d in (*op.deps, *op.wait_deps) if d in issued[r] and not done(r, d)]
        c = waits[0] if waits else op.row
        g, k = member[r, c]
        # the arrivals it waits for (its waits_for: a broadcast's receiver its root's alone) not yet issued
        w = em.syncs[g].waits_for[k]
        awaited = range(len(em.syncs[g].ranks)) if w < 0 else (w,)
        late = ", ".join(str(em.syncs[g].ranks[j]) for j in awaited if j not in arrived[g])
        where = (
            "" if c == op.row else f"at {rt.name(op.row)} (node {op.node_id}, stream {rt.stream[op.row]}) "
        )
        parts.append(
            f"rank {r} would wait {where}for {_comm_label(run, rt, c)} of stream {rt.stream[c]}, "
            f"which rank(s) {late} would not have issued"
        )
    more = f"; and {len(stuck) - 4} more rank(s)" if len(stuck) > 4 else ""
    return "; ".join(parts) + more


def _config_fields(cfg: RealConfig) -> tuple[float, str, int | None, str, list[str] | None, str]:
    """What the real replay reads of its config. ``RealConfig`` checked every field when it was made (the
    one check of ``real.*``, naming the key); nothing is checked again here."""
    launcher_args = cfg.launcher_args
    return (
        float(cfg.timeout_s),
        cfg.backend,
        cfg.nproc,
        cfg.compute,
        list(launcher_args) if launcher_args else None,
        cfg.capture,
    )


def _cuda_available() -> bool:
    import torch  # only here: deciding on NCCL needs it, the rest of the parent does not

    return bool(torch.cuda.is_available())


def resolve_backend(backend: str, manifest: Manifest) -> str:
    """``auto``: NCCL when the run was on CUDA devices and CUDA is available here, gloo when it was not; a
    run on CUDA devices where CUDA is not available is refused (its kernels would run as host work, one
    after another, and the replay would not reproduce it) unless ``real.backend=gloo`` asks for that."""
    cuda = sorted({d for d in manifest.devices.values() if d.startswith("cuda")})
    if backend == "auto":
        if not cuda:
            return "gloo"
        if _cuda_available():
            return "nccl"
        raise ConfigError(
            f"real.backend=auto: the run was recorded on CUDA devices ({', '.join(cuda[:4])}"
            f"{', ...' if len(cuda) > 4 else ''}) and CUDA is not available on this machine; on CPU "
            "processes its kernels would run as host work and the replay would not reproduce the run "
            "(give real.backend=gloo to replay it so anyway)"
        )
    if backend == "nccl" and not _cuda_available():
        raise ConfigError("real.backend=nccl: CUDA is not available on this machine")
    return backend


def _no_trace_refusal(run_dir: Path, missing: list[int], world_size: int, way: str) -> ReplayError:
    """A real replay's refusal of a run whose ``missing`` ranks have no trace: every rank's processes issue
    their collectives, so it cannot go on without them (never lenient); ``way``: the simulated replay's
    options that replay the traced ranks ('': none does)."""
    rest = f"; the simulated replay ({way}) replays the traced ranks" if way else ""
    return ReplayError(
        f"{run_dir}: cannot replay on real processes: {no_trace_line(missing, world_size)}{rest}"
    )


def preflight(run_dir: Path, cfg: RealConfig, manifest: Manifest | None = None) -> str:
    """What refuses a real replay of ``run_dir`` before anything runs (the config, ranks without a trace,
    ``real.nproc`` against the run's ranks, the backend); returns the backend. ``manifest``: the run's, if
    loaded (else read from ``run_dir``)."""
    _timeout_s, backend_cfg, nproc, _compute, launcher_args, _capture = _config_fields(cfg)
    located = locate_run(run_dir)  # a directory of Chakra traces without a manifest too, as the simulator
    m = manifest if manifest is not None else located.manifest
    absent = {r for r, f in located.files.items() if not f.is_file()}  # listed, file gone
    if absent or m.missing_ranks or sorted(m.ranks) != list(range(m.world_size)):
        missing = sorted(set(range(m.world_size)) - set(m.ranks) | set(m.missing_ranks) | absent)
        if not missing:
            raise ReplayError(f"{run_dir}: cannot replay on real processes: not every rank was loaded")
        # a rank the manifest says has no trace is a warning to the simulator's load; a listed rank whose file
        # is gone an error that lenient=true leaves out; a gap without a manifest, or a rank it does not list,
        # an error either way
        said = set(m.missing_ranks) if located.has_manifest else set()
        way = ""
        if said | absent >= set(missing):
            way = "mode=sim" if said >= set(missing) else "mode=sim lenient=true"
        raise _no_trace_refusal(run_dir, missing, m.world_size, way)
    if not launcher_args and nproc is not None and nproc != m.world_size:
        raise ConfigError(
            f"real.nproc={nproc} but {run_dir} has {m.world_size} ranks: on one host start one process per "
            "traced rank; across hosts set real.launcher_args (--nnodes, --node-rank, --rdzv-endpoint) and "
            "run the same command on every host with OUT_DIR on a shared file system"
        )
    nnodes = _nnodes(launcher_args or [])
    if nnodes is not None and nnodes > 1 and (nproc or m.world_size) * nnodes != m.world_size:
        raise ConfigError(
            f"real.launcher_args start {nnodes} hosts of real.nproc={nproc or m.world_size} ranks each"
            f"{'' if nproc else ' (the default: every rank of the run)'}, {nnodes * (nproc or m.world_size)} "
            f"in all, but {run_dir} has {m.world_size} ranks: set real.nproc to the ranks of each host"
        )
    check_host_memory(nproc or m.world_size, _available_memory(), run_dir)
    return resolve_backend(backend_cfg, m)


def _nnodes(launcher_args: list[str]) -> int | None:
    """torchrun's ``--nnodes`` among ``launcher_args`` when it is one number (not an elastic range)."""
    for i, a in enumerate(launcher_args):
        value = a.split("=", 1)[1] if a.startswith("--nnodes=") else None
        if a == "--nnodes" and i + 1 < len(launcher_args):
            value = launcher_args[i + 1]
        if value is not None:
            return int(value) if value.isdigit() else None
    return None


def load_checked(run_dir: Path) -> RunTrace:
    """The run, validated by the store's checks where available (``skewlens.profiler.store.validate``)."""
    try:
        validate = importlib.import_module("skewlens.profiler.store.validate")
    except ImportError:
        return load_run(run_dir)
    run: RunTrace = validate.load_validated(run_dir)
    return run


def _deadline_s(run: RunTrace, plans: dict[int, list[ReplayOp]], timeout_s: float) -> float:
    """Bound on the whole replay: twice the recorded span plus added work, plus start-up and timeout."""
    span = 0
    for r, rt in run.ranks.items():
        if len(rt):
            extra = sum(max(0, o.dur_ns - int(rt.dur_ns[o.row])) + o.delay_ns for o in plans[r])
            span = max(span, int(rt.end_ns.max() - rt.start_ns.min()) + extra)
    return 2 * span / 1e9 + STARTUP_ALLOWANCE_S + timeout_s


def shared_out(launcher_args: list[str] | None) -> bool:
    """Whether ``real.launcher_args`` start hosts that all write into ``OUT`` (``--nnodes`` other than 1)."""
    for i, a in enumerate(launcher_args or []):
        if a.startswith("--nnodes="):
            return a.split("=", 1)[1] not in ("1", "1:1")
        if a == "--nnodes" and i + 1 < len(launcher_args or []):
            return (launcher_args or [])[i + 1] not in ("1", "1:1")
    return False


def keep_failure_logs(work_dir: Path, log: Path, kept: Path, *, alone: bool) -> Path:
    """Move a failed replay's logs (the launcher's ``log``, torchrun's log directory, the workers' error and
    progress files) from ``work_dir`` into ``kept``, which outlives the failed replay's working files;
    returns where ``log`` went. ``alone`` (one host): ``kept`` holds only this failure's logs; across hosts
    every host adds its own (launcher logs per host and process, torchrun's per launch)."""
    if alone:
        shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True, exist_ok=True)
    items = [
        log,
        *(f for name in (ERROR_FILE, PROGRESS_FILE) for f in sorted(work_dir.glob(name.format(rank="*")))),
    ]
    logs = work_dir / TORCHRUN_LOGS
    if logs.is_dir():
        (kept / TORCHRUN_LOGS).mkdir(exist_ok=True)
        items += sorted(logs.iterdir())
    for item in items:
        dest = kept / item.relative_to(work_dir)
        if dest.is_dir():
            shutil.rmtree(dest, ignore_errors=True)
        with contextlib.suppress(OSError):
            item.replace(dest)
    return kept / log.relative_to(work_dir)


def worker_env(environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """The replay's workers' environment, ``environ`` with ``OMP_NUM_THREADS`` 1 unless it is set, and what
    it changed of the program's settings to say ('' for nothing).

    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` becomes ``INFO`` (its logging kept): at DETAIL torch wraps every
    process group in one that checks each collective with collectives of its own on a helper group, which
    a capture cannot tell from the program's, so no run was recorded at that level, and a replay at it
    would time the checks as the run's collectives; the profiler's capture of the replay also refuses it
    (before, the replay failed after its workers had started: ``rank 0: profiler start-up: CaptureError:
    TORCH_DISTRIBUTED_DEBUG=DETAIL ...``, its advice that of a capture)."""
    env = {**environ, "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", "1")}
    if env.get(DEBUG_ENV, "").strip().upper() != "DETAIL":
        return env, ""
    env[DEBUG_ENV] = "INFO"
    return env, (
        f"{DEBUG_ENV}={environ[DEBUG_ENV]}: the replay's ranks run at INFO: at DETAIL each collective would "
        "add checks of its own (collectives on a helper group) that the recorded run did not have"
    )


def real_replay(
    *, run_dir: Path, out_dir: Path, effects: Effects, cfg: RealConfig, stage_dir: Path | None = None
) -> RealReplayResult:
    """Replay ``run_dir`` on real processes; the replay is for ``out_dir/run`` (see module doc).

    ``stage_dir``: a new directory beside ``out_dir`` to write ``run/`` and ``real/`` into (the caller moves
    them into ``out_dir`` once the whole replay has succeeded), unless the replay spans hosts: every host's
    workers write into ``out_dir`` itself then. A failed launch's logs go to ``out_dir/real-failed``."""
    timeout_s, _backend, nproc, compute, launcher_args, capture = _config_fields(cfg)
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    across = shared_out(launcher_args)
    root = out_dir if stage_dir is None or across else Path(stage_dir)
    check_trace_outside(run_dir, out_dir)
    run = load_checked(run_dir)
    m = run.manifest
    if sorted(run.ranks) != list(range(m.world_size)):
        missing = sorted(set(range(m.world_size)) - set(run.ranks))
        # a strict load went on without them: the manifest says they saved none
        raise _no_trace_refusal(run_dir, missing, m.world_size, "mode=sim")
    backend = preflight(run_dir, cfg, m)
    default_pg, groups = group_specs(run)
    firsts = {r: rm.t0_ns for r, rm in execution_model(run).ranks.items()}
    first = min(firsts.values(), default=0)
    plans = all_to_all_splits(run, {r: rank_plan(rt, run, effects) for r, rt in sorted(run.ranks.items())})
    if (stuck := serial_deadlock(run, plans)) is not None:
        raise ConfigError(
            f"{run_dir}: cannot replay on real processes: re-issued in recorded start order on one thread "
            f"per rank (a rank's threads run on one), its communication would deadlock: {stuck}; replay by "
            "simulation (mode=sim) instead"
        )
    out_run = root / REAL_RUN_DIR
    work = root / REAL_WORK_DIR
    plan_dir, work_dir = work / "plan", work / "work"
    self_run = out_run if capture == "self" else work / "replayed"
    original_spans = {r: step_spans(rt) for r, rt in run.ranks.items()}
    n_steps = max((len(s) for s in original_spans.values()), default=1)
    meta = PlanMeta(
        world_size=m.world_size,
        backend=backend,
        timeout_s=timeout_s,
        compute=compute,
        default_pg=default_pg,
        groups=groups,
        origin_ns={r: f - first for r, f in firsts.items()},
        first_start_ns=first,
        source_run=str(run_dir.resolve()),
        out_run=str(self_run.resolve()),
        work_dir=str(work_dir.resolve()),
        capture_run=str(out_run.resolve()) if capture == "profiler" else "",
        capture_steps=n_steps,
        source_files={r: str(Path(rt.path).resolve()) for r, rt in run.ranks.items()},
    )
    warmups = {r: warmup_ops(run, r, ops) for r, ops in plans.items()}
    write_plan(plan_dir, meta, plans, warmups)
    _clear_previous(out_run, self_run)
    cmd = launcher_command(
        plan_dir.resolve(), nproc or m.world_size, launcher_args, log_dir=(work_dir / TORCHRUN_LOGS).resolve()
    )
    env, lowered = worker_env(os.environ)
    if lowered:
        print_warning("replay", lowered)
    log = launcher_log(work_dir, launcher_args)
    everyone = range(m.world_size)
    if across:  # the launcher says nothing until every node has joined (or its join_timeout ends)
        print(
            f"real replay: waiting for the other nodes ({_nnodes(launcher_args or []) or 'several'} in all) "
            "to join torchrun's rendezvous (its --rdzv-conf join_timeout bounds the wait, 600 s by default)",
            file=sys.stderr,
            flush=True,
        )
    run_workers(
        cmd,
        work_dir=work_dir,
        deadline_s=_deadline_s(run, plans, timeout_s),
        env=env,
        log=log,
        keep_logs=lambda f: keep_failure_logs(work_dir, f, out_dir / REAL_FAILED_DIR, alone=not across),
        groups={"": everyone, default_pg: everyone, **{g.name: g.ranks for g in groups}},
    )
    # the command as it would read in out_dir, where the record is moved
    shown = [a.replace(str(root.resolve()), str(out_dir.resolve())) for a in cmd] if root != out_dir else cmd
    manifest = _replay_manifest(work_dir=work_dir, original=m, backend=backend, cmd=shown, source=run_dir)
    write_manifest(self_run, manifest)  # the record loads through its manifest; its step marks come next
    replayed = load_run(self_run, match=False)
    moved = _moved_marks(run, replayed)
    if moved:  # the recorded step marks, moved with the nodes they follow (as the simulator measures)
        marks = tuple(
            StepSpan(rank=r, step=s, start_ns=v[2], end_ns=v[3]) for (r, s), v in sorted(moved.items())
        )
    else:
        marks = tuple(
            StepSpan(rank=r, step=s, start_ns=a, end_ns=b)
            for r in sorted(replayed.ranks)
            for s, (a, b) in sorted(step_spans(replayed.ranks[r]).items())
        )
    write_manifest(self_run, replace(manifest, steps=marks))
    if capture == "profiler":
        # the record's place once moved into out_dir
        finish_capture(out_run, source_run=run_dir, node_aligned=out_dir / self_run.relative_to(root))
    if moved:
        ranks = tuple(_mark_step_times(r, moved) for r in sorted(run.ranks))
    else:
        if capture == "profiler":
            replayed = load_run(out_run, match=False)
        ranks = tuple(
            rank_step_times(r, original_spans[r], step_spans(replayed.ranks[r])) for r in sorted(run.ranks)
        )
    return RealReplayResult(run_dir=out_dir / REAL_RUN_DIR, out_dir=out_dir, backend=backend, ranks=ranks)


def _moved_marks(run: RunTrace, replayed: RunTrace) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """The original's step marks moved with the node-aligned record's replayed times (row for row)."""
    if not run.manifest.steps or any(len(replayed.ranks[r]) != len(rt) for r, rt in run.ranks.items()):
        return {}
    timed = {r: rt.node_type != int(NodeType.METADATA) for r, rt in run.ranks.items()}
    starts = {r: replayed.ranks[r].start_ns for r in run.ranks}
    ends = {r: replayed.ranks[r].start_ns + replayed.ranks[r].dur_ns for r in run.ranks}
    return moved_step_marks(run, starts, ends, timed)


def _mark_step_times(rank: int, moved: dict[tuple[int, int], tuple[int, int, int, int]]) -> RankStepTimes:
    mine = sorted((s, v) for (r, s), v in moved.items() if r == rank)
    return RankStepTimes(
        rank=rank,
        steps=tuple(s for s, _v in mine),
        original_ns=tuple(v[1] - v[0] for _s, v in mine),
        replay_ns=tuple(v[3] - v[2] for _s, v in mine),
    )


def _clear_previous(*run_dirs: Path) -> None:
    """Remove what an earlier replay into the same OUT_DIR left (our files only), so nothing stale merges."""
    for d in run_dirs:
        for f in [d / MANIFEST_NAME, *d.glob(RANK_FILE.format(rank="*"))]:
            f.unlink(missing_ok=True)
        parts = d / PARTS_DIR
        if parts.is_dir():
            shutil.rmtree(parts)


def _replay_manifest(
    *, work_dir: Path, original: Manifest, backend: str, cmd: list[str], source: Path
) -> Manifest:
    """The node-aligned record's manifest (no step marks yet), from the workers' result files."""
    results: dict[int, dict[str, Any]] = {}
    for r in original.ranks:
        d = read_json_bounded(work_dir / RESULT_FILE.format(rank=r), "worker result")
        if not isinstance(d, dict):
            raise ReplayError(f"{work_dir}: malformed result of rank {r}")
        results[r] = d
    try:
        from skewlens import __version__ as version
    except ImportError:  # pragma: no cover - the package is always installed with skewlens
        version = ""
    return Manifest(
        world_size=original.world_size,
        ranks=original.ranks,
        process_groups=original.process_groups,
        backend=backend,
        level=original.level,
        source="replay",
        devices={r: str(d.get("device", "")) for r, d in results.items()},
        gpus={r: str(d["gpu"]) for r, d in results.items() if d.get("gpu")},
        hosts={r: str(d.get("host", socket.gethostname())) for r, d in results.items()},
        clock_offsets_ns={r: int(d.get("clock_offset_ns", 0)) for r, d in results.items()},
        step_window=original.step_window,
        torch_version=_torch_version(),
        skewlens_version=version,
        command=tuple(cmd),
        notes={"replay_of": str(source.resolve()), "original_source": original.source},
    )


def _torch_version() -> str:
    mod = sys.modules.get("torch")
    if mod is not None:
        return str(getattr(mod, "__version__", ""))
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        return ""
