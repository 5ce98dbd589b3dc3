"""Tidying the profiler's capture of a replay (parent side, no torch).

The workers start the profiler before the common start time and mark one *pre-roll* step (the profiler's
own start-up and the wait for the common start) before the replayed steps; this module removes that step
from the captured run directory, so ``OUT_DIR/run`` holds the replayed steps only and can itself be
replayed, and marks the manifest as a replay.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from skewlens.profiler.chakra_io import EtWriter, attr_value, read_et
from skewlens.profiler.errors import ManifestError
from skewlens.profiler.manifest import rank_file, read_manifest, write_manifest
from skewlens.profiler.vocab import Attr


def _drop_step(path: Path, step: int, renumber: dict[int, int]) -> int:
    """Rewrite one rank's trace without the nodes of ``step`` (and dependencies on them), the other nodes'
    steps renumbered by ``renumber`` (a step it lacks kept); returns how many were dropped."""
    et = read_et(path)
    meta = {k: v for k, v in et.metadata.items() if k != "version"}
    kept = []
    dropped: set[int] = set()
    for node in et.nodes:
        st = next((attr_value(a) for a in node.attr if a.name == Attr.STEP), None)
        if st == step:
            dropped.add(node.id)
            continue
        kept.append(node)
        for a in node.attr:
            if a.name == Attr.STEP and st in renumber:
                setattr(a, str(a.WhichOneof("value")), renumber[st])
    for node in kept:
        ctrl = [d for d in node.ctrl_deps if d not in dropped]
        data = [d for d in node.data_deps if d not in dropped]
        del node.ctrl_deps[:]
        del node.data_deps[:]
        node.ctrl_deps.extend(ctrl)
        node.data_deps.extend(data)
    with EtWriter(path, meta) as w:
        w.write_all(kept)
    return len(dropped)


def _recorded_steps(source_run: Path) -> list[int]:
    """The steps the replayed run's manifest marked, ascending (none where it has no manifest or marks)."""
    try:
        return sorted({s.step for s in read_manifest(source_run).steps})
    except (OSError, ManifestError):
        return []


def finish_capture(run_dir: Path, *, source_run: Path, node_aligned: Path) -> None:
    """Drop the pre-roll step from every rank of the captured replay, number its steps as the replayed run
    (``source_run``) numbered them, in order, where it marked as many; mark the manifest ``replay``.
    Before, the replay's steps were numbered from 2 whatever the run's: a run recorded from step 1 (window
    ``0:1:13``) replayed as steps 2-14, its step 6 read as the replay's step 7.

    Once: across hosts every host's parent finishes the same ``run_dir`` (the workers have all ended), and
    a second pass would drop the first replayed step as if it were the pre-roll."""
    m = read_manifest(run_dir)
    if m.source == "replay":  # another host's parent finished it
        return
    notes = {**m.notes, "replay_of": str(source_run.resolve()), "node_aligned_replay": str(node_aligned)}
    steps = m.steps
    if steps:
        preroll = min(s.step for s in steps)
        replayed = sorted({s.step for s in steps if s.step != preroll})
        recorded = _recorded_steps(source_run)
        renumber = dict(zip(replayed, recorded, strict=True)) if len(recorded) == len(replayed) else {}
        for r in m.ranks:
            _drop_step(rank_file(run_dir, r), preroll, renumber)
        steps = tuple(replace(s, step=renumber.get(s.step, s.step)) for s in steps if s.step != preroll)
        notes["pre_roll_step"] = f"step {preroll} (profiler start-up before the common start) removed"
    write_manifest(run_dir, replace(m, source="replay", notes=notes, steps=steps))
