"""Bounded reading of untrusted input files: raw bytes (gzip-aware) and strict JSON.

Traces, dumps and plans are untrusted: every reader goes through these functions, which refuse more
than ``max_bytes`` (after decompression), refuse non-standard JSON (NaN, Infinity) and over-deep
nesting, and raise the caller's error class with a one-line message naming the file.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import json
import lzma
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, BinaryIO, cast

from skewlens.profiler.errors import SkewlensError

#: A gzipped JSON input (a Kineto or host execution trace, a manifest) or a compressed archive of traces may
#: expand to at most this many times its size on disk (or :data:`JSON_GZIP_FLOOR_BYTES`): real traces
#: compress 8 to 19 times (the 8-GPU DLRM archives 16); a 2 MB gzip of one repeated value inflated to the
#: 2 GiB trace limit, and the JSON parser then held 6 GB for it.
JSON_GZIP_RATIO = 64
JSON_GZIP_FLOOR_BYTES = 64 * 1024**2


class NotRegularFileError(OSError):
    """What :func:`open_regular` refuses: a FIFO, a device, a socket or a directory in place of a file."""


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` that is no regular file is, in words (``a FIFO``)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, unbuffered, if it is a regular file; else a :class:`NotRegularFileError`
    saying what it is. Opened without blocking and checked on the open file: a FIFO's open blocked until a
    writer came (``skewlens check`` hung, deaf to the first Ctrl-C), and a check before the open could be
    raced."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, f"{file_kind(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return open(fd, "rb", buffering=0)  # noqa: PTH123 (a descriptor, not a path)
    except BaseException:
        os.close(fd)
        raise


#: Most bytes one read asks for past those a file is expected to hold: a read allocates all it asks for before
#: it reads, and asking for the whole limit is an out-of-memory error under ``ulimit -v`` where the file holds
#: little: 8 GiB for a trace whose size reads 0 (a ``/proc`` file) or that grew while read, and 32 times a
#: gzipped trace's size (a 60 MB one of 60 MB of data fails under a 1.5 GiB limit).
READ_CHUNK_BYTES = 16 << 20
#: Fewest bytes one read past those expected asks for: a file that grew by a little (or a ``/proc`` file of
#: size 0) is read in a syscall or two, and reads of as many as held so far double from there.
MIN_READ_CHUNK_BYTES = 64 << 10
#: Size of the smallest gzip file: its 10-byte header and 8-byte trailer (CRC-32, then ISIZE: the size of the
#: data modulo 4 GiB); a shorter one has no trailer to read.
GZIP_MIN_BYTES = 18


def _read_upto(fh: BinaryIO, limit: int, expect: int | None = None) -> bytes:
    """Up to ``limit`` bytes from a file (a read may return fewer: Linux stops at 2 GiB): the ``expect``
    bytes it should hold asked for at once (default: ``limit``), any past them in reads of as many as
    held so far, from :data:`MIN_READ_CHUNK_BYTES` up to :data:`READ_CHUNK_BYTES` (never the limit of a
    file holding less)."""
    expect = limit if expect is None else min(expect, limit)
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        ask = (
            expect - got
            if got < expect
            else min(max(got, MIN_READ_CHUNK_BYTES), READ_CHUNK_BYTES, limit - got)
        )
        chunk = fh.read(ask)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_bytes_bounded(
    path: Path,
    max_bytes: int,
    *,
    error: type[SkewlensError] = SkewlensError,
    what: str = "file",
    gzip_ratio: int = 0,
    gzip_floor: int = 0,
) -> bytes:
    """The file's bytes, gunzipped if it is gzip-compressed; at most ``max_bytes``, and where ``gzip_ratio``
    is given, a gzipped file at most ``max(gzip_ratio × its size, gzip_floor)`` (a decompression bomb)."""
    try:
        with open_regular(path) as fh:
            fd = fh.fileno()
            if os.pread(fd, 2, 0) == b"\x1f\x8b":
                packed = os.fstat(fd).st_size
                limit = expansion_limit(packed, max_bytes, gzip_ratio, gzip_floor)
                # the gzip trailer's size of the data (modulo 4 GiB; untrusted: only what is asked for first)
                isize = (
                    int.from_bytes(os.pread(fd, 4, packed - 4), "little") if packed >= GZIP_MIN_BYTES else 0
                )
                with gzip.GzipFile(fileobj=fh) as gz:
                    data = _read_upto(cast(BinaryIO, gz), limit + 1, isize + 1)
                if len(data) > limit and limit < max_bytes:
                    raise error(_bomb(path, f"gzipped {what}", limit, gzip_ratio, packed))
            else:
                # one read of the file's size (not a buffer of max_bytes shrunk afterwards: a syscall or
                # two per file where a run has thousands of small ones); a file that grew meanwhile is
                # read on, still bounded
                data = _read_upto(fh, max_bytes + 1, os.fstat(fd).st_size + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except NotRegularFileError as e:
        raise error(f"{path}: {e.strerror}: cannot read {what}") from None
    except (OSError, EOFError, zlib.error) as e:  # zlib's: a corrupt deflate stream inside the gzip
        raise error(f"{path}: cannot read {what}: {e}") from None
    if len(data) > max_bytes:
        raise error(f"{path}: {what} larger than the {max_bytes}-byte limit")
    return data


def expansion_limit(packed: int, max_bytes: int, ratio: int, floor: int) -> int:
    """How many bytes a compressed file of ``packed`` bytes may expand to: ``ratio`` times its size, at
    least ``floor``, at most ``max_bytes`` (where ``ratio`` is 0: ``max_bytes``)."""
    return min(max_bytes, max(ratio * packed, floor)) if ratio else max_bytes


def _bomb(path: Path, what: str, limit: int, ratio: int, packed: int) -> str:
    return (
        f"{path}: {what} expands past {limit} bytes, over {ratio} times its {packed} bytes "
        "(a decompression bomb?); if it is a real one, decompress it first (gunzip, tar -x): a plain file "
        "is not held to this ratio"
    )


class _Capped:
    """A decompressed stream that raises ``over`` where it would be read or sought past ``limit`` bytes,
    before it inflates them: ``tarfile`` skips a member by decompressing it, and reads a long-name or pax
    header whole, whatever size the header claims."""

    def __init__(self, f: BinaryIO, limit: int, over: SkewlensError) -> None:
        self._f, self._limit, self._over = f, limit, over

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        target = pos if whence == os.SEEK_SET else self._f.tell() + pos if whence == os.SEEK_CUR else -1
        if not 0 <= target <= self._limit:  # SEEK_END would inflate the whole stream
            raise self._over
        return self._f.seek(target)

    def read(self, n: int = -1) -> bytes:
        left = self._limit - self._f.tell()
        want = left + 1 if n < 0 else min(n, left + 1)
        try:
            data = self._f.read(want)
        except lzma.LZMAError as e:  # the others' corrupt streams are OSError, EOFError or zlib.error
            raise OSError(str(e)) from None
        if len(data) > left:
            raise self._over
        return data


#: The compressions a tar archive may have, by their magic bytes (what ``tarfile``'s ``r:*`` reads).
_CODECS: tuple[tuple[bytes, Callable[[BinaryIO], Any]], ...] = (
    (b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f)),
    (b"BZh", bz2.BZ2File),
    (b"\xfd7zXZ\x00", lzma.LZMAFile),
)


@contextmanager
def open_archive(
    path: Path,
    max_bytes: int,
    *,
    error: type[SkewlensError] = SkewlensError,
    ratio: int = JSON_GZIP_RATIO,
    floor: int = JSON_GZIP_FLOOR_BYTES,
) -> Iterator[tuple[BinaryIO, int]]:
    """A tar archive (gzip-, bzip2- or xz-compressed, or not) as its decompressed stream, for
    ``tarfile.open(fileobj=..., mode="r:")``, and the most bytes that stream may hold: at most
    ``max_bytes`` and ``ratio`` times the archive's size (or ``floor``); reading or seeking past them is
    an ``error`` naming the archive (a decompression bomb; an uncompressed one's past its end: unreadable)."""
    with open_regular(path) as raw:
        fd = raw.fileno()
        packed = os.fstat(fd).st_size
        head = os.pread(fd, 6, 0)
        limit = expansion_limit(packed, max_bytes, ratio, floor)
        codec = next((c for magic, c in _CODECS if head.startswith(magic)), None)
        cap, over = limit, error(_bomb(path, "archive", limit, ratio, packed))
        if codec is None:  # nothing inflates: what runs past the file's end is a member it does not hold
            limit = min(limit, max(packed, floor))  # but a plain tar's sparse members inflate too
            cap, over = packed, error(f"{path}: not a readable tar archive (a member runs past its end)")
        with codec(raw) if codec is not None else nullcontext(raw) as inner:
            yield cast(BinaryIO, _Capped(inner, cap, over)), limit


class _ConstantError(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _ConstantError(name)


def read_json_bounded(
    path: Path, max_bytes: int, *, error: type[SkewlensError] = SkewlensError, what: str = "file"
) -> Any:
    """Parse a (possibly gzip-compressed) standard JSON file of at most ``max_bytes``."""
    data = read_bytes_bounded(path, max_bytes, error=error, what=what)
    return parse_json_bounded(data, max_bytes, source=str(path), error=error, what=what)


def parse_json_bounded(
    data: bytes | str,
    max_bytes: int,
    *,
    source: str,
    error: type[SkewlensError] = SkewlensError,
    what: str = "file",
) -> Any:
    """Parse standard JSON of at most ``max_bytes`` that came from ``source`` (named in the errors)."""
    if len(data) > max_bytes:
        raise error(f"{source}: {what} larger than the {max_bytes}-byte limit")
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except _ConstantError as e:
        raise error(f"{source}: not standard JSON (contains {e})") from None
    except UnicodeDecodeError:
        raise error(f"{source}: not JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise error(f"{source}: not JSON ({json_error_text(e)})") from None
    except RecursionError:
        raise error(f"{source}: JSON nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts (4,300)
        raise error(f"{source}: not usable JSON ({too_long(e)})") from None


def json_error_text(e: json.JSONDecodeError) -> str:
    """``line 1 column 57: Unterminated string``: where the JSON went wrong and what, in words (the decoder's
    own ``msg`` ends ``starting at`` or ``at`` where its ``str`` gives the place after it)."""
    msg = e.msg.removesuffix(" at").removesuffix(" starting")
    return f"line {e.lineno} column {e.colno}: {msg}"


def too_long(e: ValueError) -> str:
    """What a ValueError of ``json.loads`` says, without Python's advice to raise its digit limit."""
    return "an integer of more than 4,300 digits" if "digits" in str(e) else str(e)[:200]
