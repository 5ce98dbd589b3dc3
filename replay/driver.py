"""One replay, end to end, from a typed :class:`~skewlens.replay.config.ReplayConfig`.

Load (validated) -> build the slowdown model -> simulate (and, for ``mode=real``, re-execute through
``skewlens.replay.real``) -> write ``timeline.parquet``, ``summary.parquet``, ``timeline.json``.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from skewlens.profiler.atomic import staging_dir
from skewlens.profiler.store.issues import ranks_label, unmatched_comm
from skewlens.profiler.store.model import RunTrace, type_mask
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import COMM_NODE_TYPES
from skewlens.progress import NO_PROGRESS, Progress, given
from skewlens.replay.calibrate import POOR_FIT_R2
from skewlens.replay.config import ReplayConfig
from skewlens.replay.errors import ConfigError
from skewlens.replay.network.topology import Topology, TopologyError, config_message
from skewlens.replay.outputs import (
    CONFIG_YAML,
    SUMMARY_PARQUET,
    TIMELINE_JSON,
    TIMELINE_PARQUET,
    check_trace_outside,
    publish_replay,
    real_dirs_state,
    remove_begun,
    write_perfetto,
    write_summary,
    write_text,
    write_timeline,
)
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel
from skewlens.replay.summary import SummaryRecord, summarize
from skewlens.replay.targets import check_slowdown_targets, run_steps


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayOutcome:
    """What one replay produced."""

    out_dir: Path
    """Where the outputs were written."""
    run: RunTrace
    """The replayed (loaded) run."""
    sim: SimResult
    """The simulated replay."""
    summary: list[SummaryRecord]
    """Per (rank, step) summary of the simulated replay."""
    real: Any = None
    """``skewlens.replay.real`` result for ``mode=real`` (else None)."""
    notes: tuple[str, ...] = ()
    """What the outputs left out (``timeline.json`` past ``perfetto_max_events``), for the user."""
    slowdowns: tuple[Slowdown, ...] = ()
    """The slowdowns replayed (a stall's step filled in: :func:`slowdowns_for`)."""


#: The override that replays a run whose communication does not match across ranks (named in the refusal).
LENIENT_OPTION = "lenient=true"


def load_trace(
    run_dir: str | Path,
    *,
    progress: Progress | None = NO_PROGRESS,
    lenient: bool = False,
    lenient_option: str = LENIENT_OPTION,
) -> RunTrace:
    """Load a run with the store's validation (:func:`skewlens.profiler.store.validate.load_validated`);
    ``lenient``: communication that disagrees across ranks is skipped (``RunTrace.skipped_comm``);
    ``lenient_option``: the override a refusal suggests ('': none)."""
    return load_validated(run_dir, progress=progress, lenient=lenient, lenient_option=lenient_option)


def _node_of(topo: Topology, rank: int) -> int:
    """The node ``rank`` is placed on, as network slowdowns' ``nodes`` name it (a 1-D topology: the rank)."""
    try:
        c = topo.coords(rank)
    except TopologyError as e:  # node_of_rank gives the rank no node, or too many ranks its node
        raise ConfigError(config_message(e)) from None
    return c[1] if len(c) > 1 else c[0]


def slowdowns_for(cfg: ReplayConfig, run: RunTrace, topo: Topology) -> tuple[Slowdown, ...]:
    """``cfg``'s slowdown items for ``run``: a stall without a step (the ``stall`` preset's default) stalls
    the run's first step; every rank, link, node and step an item names must be in the run
    (:func:`~skewlens.replay.targets.check_slowdown_targets`, which this calls)."""
    items = cfg.slowdown.to_items()
    if cfg.comm_mode == "model" or any(i.nodes for i in items):  # ranks are placed on the topology
        check_fits(topo, run, cfg)
    steps = run_steps(run) if any(i.kind in ("stall", "host_idle") for i in items) else []
    unset = [i.kind == "stall" and i.step is None and not i.every_step for i in items]
    if any(unset):
        if not steps:
            raise ConfigError("slowdown: a stall needs a step, and the run marks none")
        items = [replace(i, step=steps[0]) if u else i for i, u in zip(items, unset, strict=True)]
    preset = cfg.slowdown if cfg.slowdown.name != "none" else None
    check_slowdown_targets(
        items,
        run,
        lambda r: _node_of(topo, r),
        steps,
        preset=preset,
        placed_by=f" under topology {topo.name}",
    )
    return tuple(items)


def build_effects(
    cfg: ReplayConfig, items: Sequence[Slowdown] | None = None, *, topo: Topology | None = None
) -> SlowdownModel:
    """The slowdown model of ``items`` (default: ``cfg``'s; nodes for network slowdowns follow the
    placement of ``topo``, default ``cfg``'s topology: give it sized for the run, ``Topology.sized``,
    where its outermost dimension has size 0 and its placement is ``round_robin``)."""
    topo = cfg.topology.to_topology() if topo is None else topo
    chosen = cfg.slowdown.to_items() if items is None else list(items)
    return SlowdownModel(chosen, node_of=lambda rank: _node_of(topo, rank))


def check_fits(topo: Topology, run: RunTrace, cfg: ReplayConfig) -> None:
    """Every rank of ``run`` has a place on ``topo``, else a one-line :class:`ConfigError` naming
    ``topology`` (and ``scale.dp`` where it made the ranks)."""
    cap = topo.capacity
    if cap and run.world_size > cap:
        made = f" (scale.dp={cfg.scale.dp})" if cfg.scale.dp else ""
        # the sizes by the keys a user sets (before, a topology.dims.0.size=1 that made too few went unsaid)
        sizes = ", ".join(f"topology.dims.{i}.size={d.size}" for i, d in enumerate(topo.dims))
        raise ConfigError(
            f"topology={topo.name}: {cap} rank slots ({sizes}), and the replayed run has {run.world_size} "
            f"ranks{made}; choose a larger topology or sizes, or a topology file whose outermost dimension "
            "has size 0 (as many as the ranks need)"
        )


def check_timed(run: RunTrace, cfg: ReplayConfig) -> None:
    """A one-line :class:`ConfigError` where nothing in ``run`` would take time: no node records a duration
    (Chakra's generator writes traces without) and either ``comm_mode=as_recorded`` (every step would take
    0 ns; a modelled replay costs the communication from its sizes) or the run has no communication either."""
    if any(rt.dur_ns.any() for rt in run.ranks.values()):
        return
    where = (
        f"no node of {cfg.trace} ({ranks_label(sorted(run.ranks))}) records a duration (Chakra's "
        "duration_micros, skewlens' skl_dur_ns)"
    )
    if cfg.comm_mode == "as_recorded":
        raise ConfigError(
            f"comm_mode=as_recorded: {where}: replayed as recorded, every step would take 0 ns; use "
            "comm_mode=model, which costs the communication from its sizes on the topology"
        )
    if not any(type_mask(rt.node_type, COMM_NODE_TYPES).any() for rt in run.ranks.values()):
        raise ConfigError(f"trace={cfg.trace}: {where}, and none is communication: nothing in it takes time")


def check_real_timeout(run: RunTrace, sim: SimResult | None, timeout_s: float) -> None:
    """Refuse a real replay whose ``real.timeout_s`` is shorter than its longest communication op (issue to
    completion, waits for late peers included, as ``sim``, the simulated replay of the same slowdowns with
    the recorded transfers, times it: for an unmodified run, as recorded; ``sim`` None: as recorded, where
    the simulation modelled transfers the real replay does not): every worker's watchdog would stop the
    whole replay at that op, after all the work before it, where a refusal costs nothing."""
    longest, where = 0, None
    for r, rt in sorted(run.ranks.items()):
        rows = np.flatnonzero(
            type_mask(rt.node_type, COMM_NODE_TYPES) & (True if sim is None else sim.timed[r])
        )
        if rows.size:
            dur = rt.dur_ns[rows] if sim is None else sim.end_ns[r][rows] - sim.start_ns[r][rows]
            k = int(np.argmax(dur))
            if int(dur[k]) > longest:
                longest, where = int(dur[k]), (r, int(rows[k]))
    if where is None or longest <= timeout_s * 1e9:
        return
    r, i = where
    rt = run.ranks[r]
    group = f", group {run.pg_names[rt.pg[i]]!r} seq {rt.seq[i]}" if rt.pg[i] >= 0 and rt.seq[i] >= 0 else ""
    recorded = (
        " as recorded"
        if int(rt.dur_ns[i]) == longest
        else f" in the simulated replay of these slowdowns ({int(rt.dur_ns[i]) / 1e9:.3g} s as recorded)"
    )
    suggest = math.ceil(2 * longest / 1e8) / 10  # twice the longest op, rounded up to 0.1 s
    raise ConfigError(
        f"real.timeout_s={timeout_s:g}: rank {r}'s {rt.name(i)} (node {rt.node_id[i]}{group}) is in flight "
        f"{longest / 1e9:.3g} s{recorded}, the run's longest communication op, and a real replay stops every "
        f"rank when an op is in flight longer than real.timeout_s; give real.timeout_s={suggest:g} or more"
    )


def check_real_matched(run: RunTrace) -> None:
    """Refuse a real replay of a run with communication that matches no other rank
    (:func:`~skewlens.profiler.store.issues.unmatched_comm`): re-issued on real processes, it waits for peers
    that never issue it. Before, a 2-rank capture of DDP under ``Join`` whose rank 1 ran out of batches (its
    trace ends at step 5, rank 0's at step 9) hung at rank 0's step 6 all_reduce until ``real.timeout_s``
    (60 s), then failed naming rank 1's exit."""
    if (left := unmatched_comm(run)) is not None:
        raise ConfigError(
            f"{run.run_dir}: cannot replay on real processes: {left}: re-issued, each would wait for peers "
            "that never issue it; the simulated replay (mode=sim) replays them like compute (skewlens check "
            "says why they were left out of matching)"
        )


def calibration_note(cfg: ReplayConfig) -> str:
    """A warning where an extrapolation (``scale.dp``) models transfers with a topology ``skewlens calibrate``
    fitted on fewer ranks and fitted poorly: its latency is then mostly the capture's per-call cost, which
    a ring charges ``2 (N - 1)`` times at N ranks; "" otherwise."""
    t = cfg.topology
    if not (cfg.scale.dp and cfg.comm_mode == "model" and 0 < t.calibrated_ranks < cfg.scale.dp):
        return ""
    if t.calibrated_r2 >= POOR_FIT_R2:
        return ""
    lat = max((d.latency_ns for d in t.dims), default=0) / 1e3
    return (
        f"topology {t.name} was calibrated on transfers of at most {t.calibrated_ranks} ranks with R² "
        f"{t.calibrated_r2:.2f}: its latency ({lat:.1f} us) is likely the capture's cost per call, not the "
        f"network's, and the {t.algorithm} algorithm pays it per stage at {cfg.scale.dp} ranks; these "
        "transfer times say more about that fit than about a network"
    )


def replay_run(
    cfg: ReplayConfig,
    out_dir: str | Path | None = None,
    *,
    progress: Progress | None = NO_PROGRESS,
    config_yaml: str | None = None,
) -> ReplayOutcome:
    """Run the replay ``cfg`` describes and write its outputs into ``out_dir`` (default: ``cfg.out``);
    ``progress`` is told of its stages (load, simulate, write). A path may be a string, as everywhere else
    in the library (one was a ``TypeError``: ``unsupported operand type(s) for /: 'str' and 'str'``).
    ``config_yaml``: the text of a ``config.yaml`` written with the outputs (``skewlens replay``'s); None:
    none, and an earlier replay's goes.

    ``skewlens replay`` runs its replays through this. The outputs (a real replay's ``run/`` and ``real/`` on
    one host too) are written into a hidden directory inside ``out_dir`` and moved in once the whole replay
    has succeeded (:func:`~skewlens.replay.outputs.publish_replay`): a failed or interrupted replay leaves
    ``out_dir``'s earlier files as they were, and nothing of its own (an interrupted real replay's
    ``real/plan`` and ``real/work`` included). A real replay across hosts writes ``run/`` and ``real/`` in
    ``out_dir`` itself (every host writes there): a failed one removes what it began
    (:func:`~skewlens.replay.outputs.real_dirs_state`), and its logs stay in ``real-failed/``."""
    progress = given(progress)
    out_dir = Path(cfg.out if out_dir is None else out_dir)
    check_trace_outside(cfg.trace, out_dir)
    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]  # the deepest first
    real_before = real_dirs_state(out_dir)
    try:
        with staging_dir(out_dir.absolute(), inside=True) as stage:
            outcome = _replay_into(cfg, out_dir, stage, progress)
            if config_yaml is not None:
                write_text(stage / CONFIG_YAML, config_yaml)
            publish_replay(stage, out_dir, mode=cfg.mode)
    except BaseException:
        remove_begun(out_dir, real_before)
        for d in made:  # made for this replay: not left behind empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    return outcome


def _replay_into(cfg: ReplayConfig, out_dir: Path, files: Path, progress: Progress) -> ReplayOutcome:
    """:func:`replay_run`, the files written into ``files`` (the real replay's too, on one host)."""
    topo = cfg.topology.to_topology()
    real_api = None
    if cfg.mode == "real":  # refused before anything is simulated or written
        try:
            real_api = importlib.import_module("skewlens.replay.real.api")
        except ImportError:
            raise ConfigError("mode=real: real replay is not available") from None
        real_api.preflight(Path(cfg.trace), cfg.real)
    with progress.task(f"loading {cfg.trace}", 3) as advance:
        # lenient=true is for mode=sim only (a real replay of disagreeing communication would hang)
        # the load's own bars (ranks, nodes) under this one: a first load of two 60 MB ranks spent 20 s
        # here with this bar at 0/3 and nothing else moving
        run = load_trace(
            cfg.trace,
            progress=progress,
            lenient=cfg.lenient,
            lenient_option=LENIENT_OPTION if real_api is None else "",
        )
        if cfg.scale.dp:  # extrapolation (skewlens.replay.scale): the N-rank run is what is replayed
            # imported here: most replays extrapolate nothing and need neither (~35 ms of start-up)
            import psutil

            from skewlens.replay.scale import scale_run

            run = scale_run(
                run,
                cfg.scale.dp,
                source=cfg.scale.source_rank,
                seed=cfg.scale.seed,
                memory_bytes=psutil.virtual_memory().available,
            )
        check_timed(run, cfg)
        topo = topo.sized(run.world_size)  # the nodes a round_robin placement deals to, a ring's hops
        slowdowns = slowdowns_for(cfg, run, topo)
        effects = build_effects(cfg, slowdowns, topo=topo)
        nodes = sum(len(rt) for rt in run.ranks.values())
        advance(description=f"simulating {nodes:,} nodes of {len(run.ranks):,} ranks")
        sim = simulate(
            run,
            topology=topo,
            effects=effects,
            comm_mode=cfg.comm_mode,
            algorithm=cfg.topology.algorithm,
            contention=cfg.topology.contention,
        )
        if real_api is not None:  # before anything is written or started
            check_real_matched(run)
            # comm_mode=model is refused in mode=real (ReplayConfig): sim's transfers are the recorded ones
            check_real_timeout(run, sim, cfg.real.timeout_s)
        summary = summarize(run, sim)
        advance(description="writing outputs")
        notes: list[str] = [n for n in (calibration_note(cfg),) if n]
        # the Perfetto timeline is formatted in Python while the Parquet encoder, which releases the GIL,
        # writes the timeline table: on a thread of its own, it overlaps it (5.3 -> 4.7 s, 10 M nodes)
        with ThreadPoolExecutor(1, thread_name_prefix="skewlens-perfetto") as pool:
            perfetto = (
                pool.submit(
                    write_perfetto,
                    run,
                    sim,
                    files / TIMELINE_JSON,
                    max_events=cfg.perfetto_max_events,
                    on_note=notes.append,
                    idle_streams={s.rank: s.gpu_stream for s in summary if s.gpu_stream >= 0},
                )
                if cfg.perfetto
                else None
            )
            write_timeline(run, sim, files / TIMELINE_PARQUET)
            write_summary(run, summary, files / SUMMARY_PARQUET)
            if perfetto is not None:
                perfetto.result()
        advance()
    real = None
    if real_api is not None:
        real = real_api.real_replay(
            run_dir=Path(cfg.trace),
            out_dir=out_dir,
            effects=effects,
            cfg=cfg.real,
            stage_dir=files,
        )
    return ReplayOutcome(
        out_dir=out_dir, run=run, sim=sim, summary=summary, real=real, notes=tuple(notes), slowdowns=slowdowns
    )
