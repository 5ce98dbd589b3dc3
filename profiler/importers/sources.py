"""Input files for ``skewlens import``: plain files, directories and ``.tar.gz`` archives, read with bounds.

Everything here treats its input as untrusted:

- a JSON file is read only up to :data:`MAX_JSON_BYTES` (after gzip decompression; a gzipped one also to
  at most :data:`~skewlens.profiler.bounded.JSON_GZIP_RATIO` times its size, or 64 MiB), then parsed by
  msgspec (Kineto traces, into typed records) or the standard library (host traces, and whatever msgspec
  declines), neither of which executes anything; nesting deeper than the interpreter's recursion limit is
  reported as a corrupt file, not a crash;
- an archive is never extracted with ``extractall``: only regular members whose name ends in ``.json`` or
  ``.json.gz`` are copied out, one by one, after their path was checked (no absolute paths, no ``..``,
  no links, no devices), with a bound on the member count, on each member's size and on the archive's
  decompressed stream (at most ``JSON_GZIP_RATIO`` times the archive's size, or 64 MiB, and at most
  :data:`MAX_ARCHIVE_BYTES`; skipped members and long-name headers count: tar inflates them too);
- a directory is walked without following symbolic links, with a bound on the number of files.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from skewlens.profiler.bounded import (
    JSON_GZIP_FLOOR_BYTES,
    JSON_GZIP_RATIO,
    open_archive,
    parse_json_bounded,
    read_bytes_bounded,
)
from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.vocab import ARCHIVE_SUFFIXES, TRACE_SUFFIXES

#: Largest (decompressed) JSON trace accepted. Real per-rank Kineto traces of long windows reach a few GB;
#: converting one takes ~3x its text size in memory (a parsed host trace ~10x), so 2 GiB is a sane ceiling.
MAX_JSON_BYTES = 2 * 1024**3
#: Most members an archive may have (all kinds, including the ones skipped).
MAX_ARCHIVE_MEMBERS = 100_000
#: Most bytes of one archive's decompressed stream (its members, extracted or skipped, and their headers).
MAX_ARCHIVE_BYTES = 16 * 1024**3
#: Most trace files collected from one directory.
MAX_DIR_FILES = 100_000

_CHUNK = 1 << 20


def is_trace_name(name: str) -> bool:
    """True for ``*.json`` / ``*.json.gz`` file names (hidden and AppleDouble ``._*`` files excluded)."""
    base = name.rsplit("/", 1)[-1]
    return base.endswith(TRACE_SUFFIXES) and not base.startswith(".")


def _is_archive(path: Path) -> bool:
    return path.name.endswith(ARCHIVE_SUFFIXES)


def _safe_member_path(archive: Path, name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in name:
        raise TraceImportError(f"{archive}: unsafe member path {name!r} (absolute or with '..')")
    return p


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceFile:
    """A trace file to read, and the name to use for it in messages."""

    path: Path
    """Where the bytes are (for an archive member: its extracted copy)."""
    label: Path
    """The name users know: the file itself, or ``ARCHIVE/MEMBER`` for an archive member."""


def scratch_error(what: str, e: OSError) -> TraceImportError:
    """``what`` (``SOURCE: cannot ...``) failed writing the import's scratch files (a full disk, a quota):
    the line names the temporary directory and how to move it, not the input nor a file already removed."""
    why = e.strerror or str(e)
    return TraceImportError(
        f"{what} into {tempfile.gettempdir()} ({why}); TMPDIR names another place for the import's "
        "scratch files"
    )


def extract_traces(archive: Path, dest: Path, *, max_bytes: int = MAX_ARCHIVE_BYTES) -> list[Path]:
    """Copy the ``.json``/``.json.gz`` regular members of a tar archive under ``dest``; returns their paths.

    Links, devices and other member kinds are skipped; a member path that is absolute or climbs out
    with ``..`` is an error (the archive is not one a tool wrote innocently), and so is an archive that
    decompresses to more than ``JSON_GZIP_RATIO`` times its size (a decompression bomb).
    """
    out: list[Path] = []
    total = 0
    try:
        with (
            open_archive(archive, max_bytes, error=TraceImportError) as (stream, limit),
            tarfile.open(fileobj=stream, mode="r:") as tf,
        ):
            for count, member in enumerate(tf, start=1):
                if count > MAX_ARCHIVE_MEMBERS:
                    raise TraceImportError(f"{archive}: more than {MAX_ARCHIVE_MEMBERS} members")
                rel = _safe_member_path(archive, member.name)
                if not member.isreg() or not is_trace_name(member.name):
                    continue
                if member.size > MAX_JSON_BYTES:
                    raise TraceImportError(
                        f"{archive}: member {member.name} is {member.size} bytes (limit {MAX_JSON_BYTES})"
                    )
                target = dest.joinpath(*rel.parts)
                src = tf.extractfile(member)
                if src is None:
                    continue
                with src, _scratch_copy(archive, member.name, target) as write:
                    written = 0
                    while chunk := src.read(_CHUNK):
                        written += len(chunk)
                        total += len(chunk)
                        if written > MAX_JSON_BYTES or total > limit:  # a sparse member's zeros
                            raise TraceImportError(
                                f"{archive}: extracted data exceeds the limit at member {member.name}"
                            )
                        write(chunk)
                out.append(target)
    except tarfile.TarError as e:
        raise TraceImportError(f"{archive}: not a readable tar archive ({e})") from None
    except (OSError, EOFError, zlib.error) as e:  # zlib's: a corrupt deflate stream in a .tar.gz
        raise TraceImportError(f"{archive}: cannot read archive ({e})") from None
    if not out:
        raise TraceImportError(f"{archive}: archive holds no .json / .json.gz trace files")
    return sorted(out)


@contextmanager
def _scratch_copy(archive: Path, member: str, target: Path) -> Iterator[Callable[[bytes], object]]:
    """A writer of ``target``, the scratch copy of ``archive``'s ``member``, closed when the block ends. Its
    errors (a full disk, a quota) are the scratch space's, not the archive's (whose read errors the caller
    says); a path that two members need as both a file and a folder is the archive's."""

    def scratch(e: OSError) -> TraceImportError:
        return scratch_error(f"{archive}: cannot extract {member}", e)

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fh = target.open("wb")
    except (FileExistsError, NotADirectoryError, IsADirectoryError):  # in a new scratch directory
        raise TraceImportError(
            f"{archive}: member {member} and another member need one path as both a file and a folder"
        ) from None
    except OSError as e:
        raise scratch(e) from None

    def write(chunk: bytes) -> None:
        try:
            fh.write(chunk)
        except OSError as e:
            raise scratch(e) from None

    try:
        yield write
    except BaseException:
        with suppress(OSError):
            fh.close()
        raise
    try:
        fh.close()  # the last of it is written as the file closes
    except OSError as e:
        raise scratch(e) from None


def _walk_dir(root: Path) -> list[Path]:
    """The trace files under ``root``: a link to a file is read as the file (a folder of links to traces
    kept elsewhere: it said it held none), a link to a folder is not followed (it may loop)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if is_trace_name(name) and p.is_file():
                found.append(p)
                if len(found) > MAX_DIR_FILES:
                    raise TraceImportError(f"{root}: more than {MAX_DIR_FILES} trace files")
    if not found:
        raise TraceImportError(f"{root}: directory holds no .json / .json.gz trace files")
    return found


def expand_inputs(paths: Iterable[Path], scratch: Path) -> list[TraceFile]:
    """Files named directly, the trace files of directories, and the trace members of archives.

    Archives are extracted under ``scratch`` (one sub-folder per archive); the caller owns ``scratch``.
    """
    out: list[TraceFile] = []
    for i, raw in enumerate(paths):
        p = Path(raw)
        if p.is_dir():
            out.extend(TraceFile(path=f, label=f) for f in _walk_dir(p))
        elif not p.is_file():
            raise TraceImportError(f"{p}: no such file or directory")
        elif _is_archive(p):
            dest = scratch / f"archive-{i}"
            out.extend(TraceFile(path=f, label=p / f.relative_to(dest)) for f in extract_traces(p, dest))
        else:
            out.append(TraceFile(path=p, label=p))
    return out


def _relabel(e: TraceImportError, path: Path, label: Path | None) -> TraceImportError:
    return e if label is None else TraceImportError(str(e).replace(str(path), str(label), 1))


def read_trace_bytes(path: Path, *, max_bytes: int = MAX_JSON_BYTES, label: Path | None = None) -> bytes:
    """A trace file's text (gunzipped), refusing more than ``max_bytes``; messages name ``label``."""
    try:
        return read_bytes_bounded(
            path,
            max_bytes,
            error=TraceImportError,
            what="trace",
            gzip_ratio=JSON_GZIP_RATIO,
            gzip_floor=JSON_GZIP_FLOOR_BYTES,
        )
    except TraceImportError as e:
        raise _relabel(e, path, label) from None


def text_size_estimate(path: Path) -> int:
    """About how many bytes of text a trace file holds: its size, or for gzip the size its trailer records
    (modulo 2**32, as gzip keeps it; never less than the compressed size). A hint for planning memory, not
    a bound: the reading itself is bounded by :func:`read_trace_bytes`."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            if fh.read(2) != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            return max(int.from_bytes(fh.read(4), "little"), size)
    except OSError:
        return 0


def read_json(path: Path, *, max_bytes: int = MAX_JSON_BYTES, label: Path | None = None) -> Any:
    """Parse a (possibly gzip-compressed) JSON file, refusing more than ``max_bytes`` of text.

    Messages name ``label`` (default: ``path``).
    """
    data = read_trace_bytes(path, max_bytes=max_bytes, label=label)
    source = str(label or path)
    return parse_json_bounded(data, max_bytes, source=source, error=TraceImportError, what="trace")
