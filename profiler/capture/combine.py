"""Combine the run directories that the hosts of one job wrote to storage of their own into one run
directory (``skewlens merge``): the same merge of the ranks' part files as a shared directory gets
(:func:`~skewlens.profiler.capture.run.finalize_run`), after checking that the directories hold every rank
of one run, once."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from skewlens.profiler.atomic import replace_dir, staging_dir
from skewlens.profiler.bounded import file_kind
from skewlens.profiler.capture.autostart import CLOCK_TIMEOUT_DEFAULT_S, ENV_CLOCK_TIMEOUT
from skewlens.profiler.capture.run import SAVE_UNSAID, finalize_run, part_gpus, read_parts
from skewlens.profiler.capture.schedule import format_window
from skewlens.profiler.capture.session import part_file
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import (
    MANIFEST_NAME,
    OTHER_HOST_NOTE,
    PARTS_DIR,
    RAW_DIR,
    Manifest,
    RankNote,
    rank_file,
    rank_note_key,
    read_manifest,
    write_manifest,
)
from skewlens.profiler.store.issues import first_named, ranks_label
from skewlens.profiler.vocab import Level

#: The merged manifest's note on the run identity: why it was not checked, or that it was overridden.
RUN_IDENTITY_NOTE = "run identity"


def combine_runs(
    sources: Sequence[Path], out: Path, *, force: bool = False, allow_missing: bool = False
) -> Manifest:
    """Copy the hosts' run directories ``sources`` into ``out`` (new or empty) and merge their part files
    into one manifest. Refuses (:class:`CaptureError`, naming the directories and ranks) directories of
    different world sizes or ``skewlens profile`` options, of different run identities (torchrun's run id
    and rendezvous endpoint; unless ``force``), a rank found twice or in none (unless ``allow_missing``:
    then the ranks found are merged and the others listed missing, with why), and ranks whose recorded
    steps do not overlap in time once their clock offsets are applied (not one run, or a wrong offset;
    even with ``force``), a host's manifest that says another GPU for a rank than its part file, and a
    directory given twice. Directories written before the run identity was recorded are merged, with a
    manifest note (:data:`RUN_IDENTITY_NOTE`) that it was not checked. The manifest's ``merged_from`` lists
    the directories, absolute."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CaptureError(f"--out {out}: exists and is not an empty directory (choose a new run directory)")
    given: dict[Path, Path] = {}
    for src in sources:
        if (same := given.get(key := src.resolve())) is not None:
            twice = f"{src} is given twice" if same == src else f"{same} and {src} are one directory"
            raise CaptureError(f"{twice}: give each host's directory once")
        given[key] = src
    where: dict[int, Path] = {}
    parts: dict[int, dict] = {}
    manifests: dict[Path, Manifest] = {}
    for src in sources:
        if not src.is_dir():  # read_manifest's "(is DIR a skewlens run directory?)" asks the wrong question
            raise CaptureError(
                f"{src}: no such directory: a host's skewlens profile whose ranks saved no trace leaves none "
                "(its stderr said so); leave it out and merge the others with --allow-missing"
            )
        m = manifests[src] = read_manifest(src)
        if m.source != "capture":
            raise CaptureError(f"{src}: not a run captured by skewlens profile (source {m.source!r})")
        found = {r: p for r, p in read_parts(src).items() if rank_file(src, r).is_file()}
        if lost := sorted(set(m.ranks) - set(found)):
            _refuse_lost(src, lost)
        for r in found:
            _refuse_link(rank_file(src, r))
            _refuse_link(part_file(src, r))
            if r in where:
                raise CaptureError(
                    f"rank {r} is in both {where[r]} and {src}: give each host's directory once"
                )
            where[r] = src
        parts.update(found)
    if not parts:
        raise CaptureError("no rank's trace in " + ", ".join(map(str, sources)))
    _check_same(manifests, lambda m: f"world size {m.world_size}")
    _check_same(manifests, lambda m: f"--level {m.level} --steps {format_window(m.step_window)}")
    identity_note = _check_identity(manifests, force=force)
    first = manifests[where[min(where)]]
    missing = [r for r in range(first.world_size) if r not in where]
    if missing and not allow_missing:
        are = "is" if len(missing) == 1 else "are"
        raise CaptureError(
            f"{ranks_label(missing)} of {first.world_size} {are} in none of {first_named(sources)}: "
            "give the directory of every host of the job (or --allow-missing to merge the ranks found)"
        )
    _check_overlap(parts, where)
    _check_gpus(manifests, parts, where)
    with staging_dir(out) as tmp:
        for r, src in where.items():
            shutil.copy2(rank_file(src, r), rank_file(tmp, r))
            part_file(tmp, r).parent.mkdir(exist_ok=True)
            shutil.copy2(part_file(src, r), part_file(tmp, r))
        for src in sources:  # --keep-raw: the ranks' raw torch traces, named by rank
            if (src / RAW_DIR).is_dir() and not (src / RAW_DIR).is_symlink():
                shutil.copytree(src / RAW_DIR, tmp / RAW_DIR, dirs_exist_ok=True, ignore=_not_own_files)
        manifest = finalize_run(
            tmp, level=Level(first.level), window=first.step_window, command=first.command
        )
        if manifest is None:  # every rank has its trace and part file: cannot happen
            raise CaptureError(f"{out}: nothing merged")
        manifest = replace(manifest, merged_from=tuple(str(p) for p in given))
        notes = dict(manifest.notes)
        for r in missing:
            # what a host saw of the rank (a trace cut short while saving, the command's exit code), not
            # the hosts' guess that another host saved it
            said = [
                f"{src} said: {note}"
                for src, m in manifests.items()
                if (note := m.notes.get(f"rank {r}")) and not note.startswith(OTHER_HOST_NOTE)
            ]
            merged = (
                f"no trace in any host directory merged ({first_named(sources)}): its process "
                f"crashed or was killed before saving, {SAVE_UNSAID}, or its host's directory was not "
                "given; merged without it (skewlens merge --allow-missing)"
            )
            notes[rank_note_key(r)] = "; ".join([merged, *said])
        if identity_note:
            notes[RUN_IDENTITY_NOTE] = identity_note
        manifest = replace(manifest, notes=notes)
        write_manifest(tmp, manifest)
        if (tmp / PARTS_DIR).is_dir():  # kept by a merge that lacked ranks (--allow-missing)
            shutil.rmtree(tmp / PARTS_DIR)
        replace_dir(tmp, out)  # an empty OUT (checked above) is replaced
    return manifest


def _refuse_link(f: Path) -> None:
    """Refuse a host's trace or part file that is a symbolic link: the merge copies what a link points to
    into the run (a host directory's ``rank-2.et`` linking to ``~/.ssh/id_rsa`` put that key in the run)."""
    if f.is_symlink():
        raise CaptureError(
            f"{f}: a symbolic link (to {f.readlink()}), not a file the host saved: merge copies only the "
            "hosts' own files (copy the host's directory with its files, not links)"
        )


def _not_own_files(directory: str, names: list[str]) -> set[str]:
    """What a copy of a host's ``raw/`` leaves out: symbolic links (one to ``/etc/passwd`` was copied in as
    a raw trace) and what is neither a file nor a directory (a FIFO's copy hung)."""
    d = Path(directory)
    return {n for n in names if (d / n).is_symlink() or not ((d / n).is_file() or (d / n).is_dir())}


def _refuse_lost(src: Path, lost: list[int]) -> None:
    """Refuse ``src``, whose manifest lists ``lost`` among its ranks although their files cannot be merged:
    the traces missing first (a part file is not blamed for a trace that is gone), then the part files."""
    for r in lost:  # there, but not what the host saved: say what it is, not that it is missing
        f = rank_file(src, r)
        if not f.is_symlink() and f.exists() and not f.is_file():
            raise CaptureError(
                f"{f}: {file_kind(f.stat().st_mode)}, not the trace file the host saved: "
                f"{src / MANIFEST_NAME} lists rank {r} with a trace (copy the host's whole directory)"
            )
    if gone := [r for r in lost if not rank_file(src, r).is_file()]:
        files = ", ".join(str(rank_file(src, r)) for r in gone[:3])
        more = f" and {len(gone) - 3} more rank(s)' traces" if len(gone) > 3 else ""
        raise CaptureError(
            f"{files}{more} {'is' if len(gone) == 1 else 'are'} missing: {src / MANIFEST_NAME} lists "
            f"{ranks_label(gone)} with a trace (copy the host's whole directory)"
        )
    lost_part = part_file(src, lost[0])
    if lost_part.exists():  # read_parts said why it was ignored
        raise CaptureError(f"{src}: ranks {lost}: part file unreadable or malformed ({lost_part})")
    raise CaptureError(
        f"{src}: ranks {lost} have a trace but no part file ({lost_part}): the "
        "directory was already merged with every rank, or its .parts/ was removed"
    )


def _check_same(manifests: dict[Path, Manifest], what: Callable[[Manifest], str]) -> None:
    by: dict[str, list[str]] = {}
    for src, m in manifests.items():
        by.setdefault(what(m), []).append(str(src))
    if len(by) > 1:
        raise CaptureError("not one run: " + "; ".join(f"{k} in {', '.join(v)}" for k, v in by.items()))


def _check_identity(manifests: dict[Path, Manifest], *, force: bool) -> str:
    """Refuse directories of different run identities unless ``force``; the manifest note to keep: that
    the identity was not checked (directories that did not record one) or was overridden ('' where
    neither)."""
    by: dict[str, list[str]] = {}
    unknown: list[str] = []
    for src, m in manifests.items():
        if m.run_identity is None:
            unknown.append(str(src))
        else:
            by.setdefault(m.run_identity.key(), []).append(str(src))
    said = "; ".join(f"{k} in {', '.join(v)}" for k, v in by.items())
    notes = []
    if len(by) > 1:
        if not force:
            raise CaptureError(
                f"not one run: {said} (torchrun's TORCHELASTIC_RUN_ID and MASTER_ADDR:MASTER_PORT differ; "
                "--force merges them anyway)"
            )
        notes.append(f"merged with --force although the directories' identities differ: {said}")
    if unknown:
        notes.append(
            f"not checked for {', '.join(unknown)}: captured by a skewlens that did not record the run's "
            "identity"
        )
    return "; ".join(notes)


def _check_overlap(parts: dict[int, dict], where: dict[int, Path]) -> None:
    """Every step that all ranks recorded spans a common instant (each rank's step waits for the others'
    collectives); else the ranks are of different runs or an offset is wrong: refused whatever ``force``
    says, naming each rank's host and directory (``where``). A rank saves its times on rank 0's clock (its
    ``clock_offset_ns`` already applied)."""
    spans: dict[int, dict[int, tuple[int, int]]] = {}
    for r, p in parts.items():
        for s in p.get("steps", []):
            spans.setdefault(int(s["step"]), {})[r] = (int(s["start_ns"]), int(s["end_ns"]))
    for step, by_rank in sorted(spans.items()):
        if len(by_rank) < len(parts):
            continue
        late = max(by_rank, key=lambda r: by_rank[r][0])
        early = min(by_rank, key=lambda r: by_rank[r][1])
        gap_s = (by_rank[late][0] - by_rank[early][1]) / 1e9
        if gap_s > 0:
            at = {r: f"(host {parts[r].get('host', '?')}, in {where[r]})" for r in (early, late)}
            unknown = [
                f"rank {r}'s {note}" for r in (early, late) if (note := _clock_note(parts[r], r)) is not None
            ]
            why = (
                f"{'; '.join(unknown)}: its host's times are on its own clock, not rank 0's (capture again "
                f"with a longer {ENV_CLOCK_TIMEOUT}: how long a rank waits for rank 0 at the window's "
                f"start, {CLOCK_TIMEOUT_DEFAULT_S:g} s by default), or the directories are of different runs"
                if unknown
                else "the directories are of different runs, or a clock offset is wrong"
            )
            raise CaptureError(
                f"not one run: rank {late} {at[late]} began step {step} {gap_s:.3f} s after rank "
                f"{early} {at[early]} ended it, on rank 0's clock: {why}; --force does not merge them (it "
                "overrides only a run identity that differs)"
            )


def _check_gpus(manifests: dict[Path, Manifest], parts: dict[int, dict], where: dict[int, Path]) -> None:
    """The merged run's GPU of each rank is its part file's; a host's manifest that says another for a rank
    merged (its own directory's, or a rank another directory holds the trace of) is refused, naming the
    rank: which GPU the rank ran on is not known."""
    merged = part_gpus(parts)
    for src, m in manifests.items():
        for r, gpu in sorted(m.gpus.items()):
            if r in where and merged.get(r) != gpu:
                raise CaptureError(
                    f"rank {r}: GPU {gpu!r} in {src / MANIFEST_NAME} but "
                    f"{repr(merged[r]) if r in merged else 'none'} in its part file in {where[r]}: the "
                    "directories disagree on which GPU it ran on (of different attempts or runs?)"
                )


def _clock_note(part: dict, rank: int) -> str | None:
    """What rank ``rank``'s part file says of its clock offset where it could not measure it, else None."""
    notes = part.get("notes")
    note = notes.get(rank_note_key(rank, RankNote.CLOCK)) if isinstance(notes, dict) else None
    return str(note) if note is not None else None
