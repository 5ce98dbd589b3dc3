"""Bounded reading of untrusted input files: raw bytes (gzip-aware) and strict JSON.

Traces, dumps and plans are untrusted: every reader goes through these functions, which refuse more
than ``max_bytes`` (after decompression), refuse non-standard JSON (NaN, Infinity) and over-deep
nesting, and raise the caller's error class with a one-line message naming the file.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from skewlens.profiler.errors import SkewlensError


class NotRegularFileError(OSError):
    """What :func:`open_regular` refuses: a FIFO, a device, a socket or a directory in place of a file."""


def _kind(mode: int) -> str:
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
            raise NotRegularFileError(errno.EINVAL, f"{_kind(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return open(fd, "rb", buffering=0)  # noqa: PTH123 (a descriptor, not a path)
    except BaseException:
        os.close(fd)
        raise


def _read_upto(fh: BinaryIO, limit: int) -> bytes:
    """Up to ``limit`` bytes from an unbuffered file (a read may return fewer: Linux stops at 2 GiB)."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = fh.read(limit - got)
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
                limit = min(max_bytes, max(gzip_ratio * packed, gzip_floor)) if gzip_ratio else max_bytes
                with gzip.GzipFile(fileobj=fh) as gz:
                    data = gz.read(limit + 1)
                if len(data) > limit and limit < max_bytes:
                    raise error(
                        f"{path}: gzipped {what} expands past {limit} bytes, over {gzip_ratio} times its "
                        f"{packed} bytes (a decompression bomb?)"
                    )
            else:
                # one read of the file's size (not a buffer of max_bytes shrunk afterwards: a syscall or
                # two per file where a run has thousands of small ones); a file that grew meanwhile is
                # read on, still bounded
                size = os.fstat(fd).st_size
                data = _read_upto(fh, min(size, max_bytes) + 1)
                if len(data) > size:
                    data += _read_upto(fh, max_bytes + 1 - len(data))
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except NotRegularFileError as e:
        raise error(f"{path}: {e.strerror}: cannot read {what}") from None
    except (OSError, EOFError, zlib.error) as e:  # zlib's: a corrupt deflate stream inside the gzip
        raise error(f"{path}: cannot read {what}: {e}") from None
    if len(data) > max_bytes:
        raise error(f"{path}: {what} larger than the {max_bytes}-byte limit")
    return data


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
