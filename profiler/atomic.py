"""Atomic file output: write to a temporary file beside the target, rename into place on success.

Every file skewlens writes goes through :func:`atomic_file`, so a crash, a full disk or an exception
never leaves a half-written output under the final name. The temporary file gets the permissions an
ordinary ``open(..., "w")`` would (0666 minus the umask), not ``mkstemp``'s private 0600.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import resource
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from skewlens.profiler.bounded import read_json_bounded
from skewlens.profiler.errors import SkewlensError


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()
#: What ``mkdir`` gives a new directory (0777 minus the umask), for those made private by ``mkdtemp``.
DIR_MODE = FILE_MODE | (FILE_MODE & 0o444) >> 2  # x wherever r
#: What :func:`replace_dir` adds to its staging directory's name for the earlier output it moves aside.
REPLACED_SUFFIX = ".old"
#: Longest file name, in bytes, that Linux's file systems take.
NAME_MAX = 255
#: How many random characters ``tempfile`` (``mkstemp``, ``mkdtemp``) puts between a prefix and a suffix.
_TEMP_RANDOM_CHARS = 8
#: What a temporary name adds to its prefix and suffix: ``mkstemp``'s random characters, and the ``.old``
#: that :func:`replace_dir` gives a replaced directory.
_TEMP_EXTRA = _TEMP_RANDOM_CHARS + len(REPLACED_SUFFIX)


def temp_prefix(name: str, suffix: str = ".tmp") -> str:
    """``.NAME.``, the prefix of a temporary file or directory beside ``NAME`` (``mkstemp``'s, with
    ``suffix``), ``NAME`` cut where the whole would pass :data:`NAME_MAX`: an output named by 242 to 255
    bytes, a name the file system takes, was refused ``File name too long``, the temporary one's fault."""
    room = NAME_MAX - 2 - _TEMP_EXTRA - len(os.fsencode(suffix))
    raw = os.fsencode(name)
    return f".{os.fsdecode(raw[:room]) if len(raw) > room else name}."


def chmod_as_made(directory: Path) -> None:
    """Give a directory made by ``mkdtemp`` (private, 0700) what ``mkdir`` would have given it:
    :data:`DIR_MODE`, and the set-group-ID bit it took from its parent (a team's shared directory), which
    a plain chmod cleared: what was written in it then belonged to the writer's own group, and a second
    member of the team could neither replace the output nor remove it."""
    directory.chmod(DIR_MODE | (directory.stat().st_mode & stat.S_ISGID))


def not_a_directory(path: Path) -> Path | None:
    """The first of ``path``'s parents (from the root down) that exists and is not a directory (a regular
    file where the output's directory should be), or None."""
    return next((a for a in reversed(path.parents) if a.exists() and not a.is_dir()), None)


def dangling_link(path: Path) -> str | None:
    """``a symbolic link to T, which does not exist`` where ``path`` is one (``/x/link is a symbolic link
    to T, ...`` where one of its parents is), else None: making a directory there said ``File exists``,
    and renaming one onto it ``Not a directory``, of a link to nothing."""
    for a in (*reversed(path.parents), path):
        if a.is_symlink() and not a.exists():
            return f"{'' if a == path else f'{a} is '}a symbolic link to {a.readlink()}, which does not exist"
    return None


def why_not_created(path: Path, e: OSError) -> str:
    """Why ``path`` (its temporary file or directory) could not be created, in a line: ``/x/file is not a
    directory`` where a parent is a regular file (the OSError's ``File exists`` named neither), the
    :func:`dangling_link` in the way, else the OSError's reason."""
    if (link := dangling_link(path)) is not None:
        return link
    if (blocker := not_a_directory(path)) is not None:
        return f"{blocker} is not a directory"
    return e.strerror or str(e) or type(e).__name__


def no_temp_dir() -> str | None:
    """Why no temporary directory can be had, in a line that says what to set; None where one can. Python's
    ``tempfile`` takes the first writable of ``TMPDIR``, ``TEMP``, ``TMP``, ``/tmp``, ``/var/tmp``,
    ``/usr/tmp`` and the working directory; where none is (a locked-down node's read-only ``/tmp`` and a
    ``TMPDIR`` that does not exist), each ``mkdtemp`` raised ``FileNotFoundError: No usable temporary
    directory found in [...]``, a traceback, or behind another error's words (``No such file or
    directory``)."""
    try:
        tempfile.gettempdir()
    except OSError as e:
        return f"{e.strerror or e}; set TMPDIR to a writable directory"
    return None


def check_writable(path: str | Path) -> None:
    """Refuse, before any work, an output ``path`` that could not be written: a parent that is a regular
    file, or the nearest existing one not writable (a :class:`SkewlensError` naming ``path``). Nothing is
    created."""
    p = Path(path)
    if (blocker := not_a_directory(p)) is not None:
        raise SkewlensError(f"cannot write {p}: {blocker} is not a directory")
    existing = next(a for a in p.parents if a.exists())
    if not os.access(existing, os.W_OK | os.X_OK):  # a read-only mount (a locked-down node's) said it too
        try:
            read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        except OSError:  # the mount's flags cannot be read: not writable is all that is known
            read_only = 0
        raise SkewlensError(
            f"cannot write {p}: {existing}: {os.strerror(errno.EROFS if read_only else errno.EACCES)}"
        )


@contextmanager
def atomic_file(path: str | Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory; rename it to ``path`` when the block succeeds.

    ``suffix`` lets writers that pick a format from the extension (matplotlib) see the right one.
    """
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=temp_prefix(p.name, suffix), suffix=suffix, dir=p.parent)
    except OSError as e:
        raise SkewlensError(f"cannot write {p}: {why_not_created(p, e)}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(FILE_MODE)
        tmp.replace(p)
    except OSError as e:  # the disk full, a quota: the writer's own traceback would say it in 20 lines
        tmp.unlink(missing_ok=True)
        raise SkewlensError(f"cannot write {p}: {why_not_written(e, tmp)}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: The errors a process limit causes: the limit, and how it is said.
_LIMITS: dict[int, tuple[int, Callable[[int], str]]] = {
    errno.EFBIG: (resource.RLIMIT_FSIZE, lambda n: f"a file may have at most {n >> 10:,} KiB: ulimit -f"),
    errno.EMFILE: (resource.RLIMIT_NOFILE, lambda n: f"a process may have {n:,} files open: ulimit -n"),
}


def why_not_written(e: OSError, tmp: Path) -> str:
    """An OSError in a line: its reason, and the file it names where that is not the temporary one. The
    reason is the C library's for its errno (pyarrow's own said ``Error writing bytes to file. Detail:
    [errno 28] No space left on device``), and an error a process limit caused says the limit (``ulimit -f``,
    ``ulimit -n``)."""
    why = os.strerror(e.errno) if e.errno else e.strerror or str(e) or type(e).__name__
    if e.errno in _LIMITS:
        which, says = _LIMITS[e.errno]
        if (limit := resource.getrlimit(which)[0]) != resource.RLIM_INFINITY:
            why += f" ({says(limit)})"
    other = e.filename not in (None, str(tmp))
    return f"{why} ({e.filename})" if other else why


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write a text file atomically (UTF-8; a file name's bytes that Python could not decode, kept as
    surrogates where it does not read names as UTF-8, are written as they were)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8", errors="surrogateescape")
    return Path(path)


def write_json_atomic(path: str | Path, data: Any, **dump_kwargs: Any) -> Path:
    """Write JSON atomically; ``dump_kwargs`` go to :func:`json.dump`."""
    with atomic_file(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        json.dump(data, fh, **dump_kwargs)
    return Path(path)


#: What the name of a staging directory (:func:`staging_dir`) ends with.
STAGING_SUFFIX = ".tmp"


#: A staging directory's name (:func:`staging_dir`): ``.NAME.`` (:func:`temp_prefix`), ``mkdtemp``'s random
#: characters (``tempfile``'s: ``a-z``, ``0-9``, ``_``) and :data:`STAGING_SUFFIX`.
_STAGING_NAME = re.compile(
    rf"\.(.+)\.[a-z0-9_]{{{_TEMP_RANDOM_CHARS}}}" + re.escape(STAGING_SUFFIX), re.DOTALL
)


def is_staging_name(name: str, out_name: str | None = None) -> bool:
    """Whether ``name`` is that of a staging directory :func:`staging_dir` makes (``.NAME.<random>.tmp``,
    exactly): for an output named ``out_name`` where one is given, else for any output. A user's own
    ``.foo.tmp`` or ``.notes.old.tmp`` is not one (the random part is 8 of ``mkdtemp``'s characters)."""
    m = _STAGING_NAME.fullmatch(name)
    return m is not None and (out_name is None or f".{m[1]}." == temp_prefix(out_name))


def is_replaced_name(name: str) -> bool:
    """Whether ``name`` is that of an earlier output :func:`replace_dir` moved aside
    (``.NAME.<random>.tmp.old``, exactly: a staging directory's name, :func:`is_staging_name`, and
    :data:`REPLACED_SUFFIX`). A user's own ``.foo.tmp.old`` is not one."""
    stem = name.removesuffix(REPLACED_SUFFIX)
    return stem != name and is_staging_name(stem)


@contextmanager
def staging_dir(out: Path, *, inside: bool = False) -> Iterator[Path]:
    """A new, empty directory beside ``out`` (its parents made) to write a whole output into; the block
    moves what it wrote into place (:func:`replace_dir`, or file by file), and whatever is left, on success
    or after an error or an interrupt, is removed when it ends. It has an ordinary directory's permissions
    (:data:`DIR_MODE`), not ``mkdtemp``'s private 0700: moved into place, it is what others read. An
    unwritable place is a :class:`SkewlensError` naming ``out``.

    With ``inside`` (for outputs moved in file by file, :func:`move_into`), an ``out`` that is already a
    directory holds the staging directory itself: its files then move by renames on ``out``'s own file
    system. Beside it, an ``out`` that is a mount point (a container's output volume) failed every move
    with ``Invalid cross-device link``, and one whose parent the user cannot write (a CI job's own
    artifacts directory) was refused as ``Permission denied``.

    The command holds a lock of its staging directory (``flock``) until the block ends; the staging
    directories that a killed command left where this one stages (SIGKILL, the OOM killer: nothing of its
    own removed them, and each held a whole output), for any output's name, are removed when the next one
    begins (:func:`remove_abandoned`), and so are the earlier outputs that a command killed after its
    renames left moved aside (``.OUT.<random>.tmp.old``: :func:`replace_dir`), while this one holds the
    lock of where it stages that those renames take. Where the file system cannot lock, none is removed."""
    if (why := dangling_link(out)) is not None:
        raise SkewlensError(f"cannot write {out}: {why}")
    home = out if inside and out.is_dir() else out.parent
    held: int | None = None
    made: Path | None = None
    try:
        home.mkdir(parents=True, exist_ok=True)
        with _locked(home) as home_held:  # made and locked before another command's look at what is abandoned
            made = Path(tempfile.mkdtemp(prefix=temp_prefix(out.name), suffix=STAGING_SUFFIX, dir=home))
            held = lock_directory(made, wait=False)  # new: no one else holds it
            remove_abandoned(home, mine=made, replaced=home_held)
        chmod_as_made(made)
    except BaseException as e:  # an interrupt too (an abandoned output's removal takes seconds)
        if held is not None:
            os.close(held)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        if not isinstance(e, OSError):
            raise
        why = why_not_created(out, e)
        if (
            isinstance(e, PermissionError) and home != out and out.is_dir()
        ):  # it said "OUT: Permission denied"
            why = f"{why} in {home}, where it is made anew beside {out.name} to replace it whole"
        raise SkewlensError(f"cannot write {out}: {why}") from None
    tmp = made
    try:
        yield tmp
    except OSError as e:  # the disk full while the block wrote into it (Parquet, JSON, ...)
        raise SkewlensError(_as_written(f"cannot write {out}: {why_not_written(e, tmp)}", tmp, out)) from None
    except SkewlensError as e:  # an atomic_file's or EtWriter's inside: it named the file by its staged path
        if str(tmp) not in str(e):
            raise
        kind = type(e) if type(e).__init__ is SkewlensError.__init__ else SkewlensError  # its kind, if it can
        raise kind(_as_written(str(e), tmp, out)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if held is not None:
            os.close(held)


def remove_abandoned(
    home: Path, *, out_name: str | None = None, mine: Path | None = None, replaced: bool = False
) -> None:
    """Remove the staging directories in ``home`` (:func:`is_staging_name`: of the output ``out_name``
    where one is given, else of any output; other than ``mine``) that no command holds (:func:`staging_dir`):
    a command killed before it moved its outputs in leaves one (a replay's ``OUT/.OUT.k3j2x7ab.tmp/`` with
    a whole replay's files in it, one more for each replay killed). A command removes those of any output
    where it stages, so that a nightly export into a new ``FLEET/run=<date>`` each night removes a killed
    night's ``FLEET/.run=<date>.<random>.tmp/``, an output no later night writes again. One that a running
    command holds, or whose lock cannot be taken here (a file system without locks), is left, and so is
    anything not named exactly as a staging directory is.

    With ``replaced``, for a caller that holds ``home``'s lock (:func:`_locked`), the earlier outputs that
    :func:`replace_dir` moved aside there (:func:`is_replaced_name`) go too: a command killed while it
    removed one, after its renames (seconds, for a big output), leaves it (a whole earlier export,
    ``FLEET/.run=n1.k3j2x7ab.tmp.old/``). Its renames, and the putting back of the earlier output where the
    second fails, take that lock: one seen while holding it is no longer read, only being removed."""
    with suppress(OSError):  # home unreadable: nothing to look at
        for p in home.iterdir():
            old = replaced and is_replaced_name(p.name)
            named = old or is_staging_name(p.name, out_name)
            if p == mine or not named or p.is_symlink() or not p.is_dir():
                continue
            if old:
                shutil.rmtree(p, ignore_errors=True)  # its own command's removal, if running, ignores ours
                continue
            try:
                fd = lock_directory(p, wait=False)
            except BlockingIOError:
                continue  # a running command's
            if fd is None:
                continue
            try:
                shutil.rmtree(p, ignore_errors=True)
            finally:
                os.close(fd)


def _as_written(message: str, tmp: Path, out: Path) -> str:
    """``message`` with the staging directory ``tmp`` named as ``out``, where its files were going: the
    staged path (``.OUT.k3j2x.tmp/summary.parquet``) is gone by the time the user reads it."""
    return message.replace(str(tmp), str(out))


def move_into(stage: Path, out: Path, names: Iterable[str]) -> None:
    """Move the files ``names`` that ``stage`` holds into ``out`` (made if missing), replacing ``out``'s,
    and remove ``out``'s files of the other ``names`` (an earlier output's that this one did not write).
    Every name is checked first: a directory at one of them in ``out`` (which no rename or unlink can
    replace) is a :class:`SkewlensError` naming it, and ``out`` is left as it was; the moves began, stopped
    at it, and left ``out`` half the new output and half the earlier one."""
    for name in names:
        if (dest := out / name).is_dir() and not dest.is_symlink():
            raise SkewlensError(f"cannot write {dest}: a directory is in the way; {out} was left as it was")
    out.mkdir(exist_ok=True)
    with _locked(out), moving_into(out):
        for name in names:
            if (stage / name).exists():
                (stage / name).replace(out / name)
            else:
                (out / name).unlink(missing_ok=True)


@contextmanager
def moving_into(out: Path) -> Iterator[None]:
    """The block moves a command's outputs into ``out`` one rename after another: an interrupt (Ctrl-C,
    SIGTERM) between two of them left ``out`` holding some of the new outputs beside the earlier ones, and
    the command said ``interrupted`` alone. Here it is a :class:`KeyboardInterrupt` that says so (the
    dispatcher prints it after ``interrupted``). The renames take microseconds: holding the signals off
    for them would be a mechanism of its own."""
    try:
        yield
    except KeyboardInterrupt as e:
        if e.args:  # an inner block's, saying it already
            raise
        raise KeyboardInterrupt(
            f"while its outputs were moved into {out}, which may now hold some of them beside an earlier "
            "output's; run the command again"
        ) from None


@contextmanager
def _locked(directory: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` of ``directory`` while the block moves outputs into it: two commands
    that finish at once into one place take turns, and the last one's output is there whole (its moves
    interleaved with the other's left half of each). Where the file system cannot lock (some network
    ones) or the directory cannot be opened to lock it (no read permission), the block runs unlocked; a
    process killed holding it releases it. It yields whether the lock is held."""
    fd = lock_directory(directory)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def lock_directory(directory: Path, *, wait: bool = True) -> int | None:
    """Open ``directory`` and take an exclusive ``flock`` of it, held until the returned file descriptor is
    closed (or the process ends, however it ends). None where the directory cannot be opened (no read
    permission) or the file system cannot lock (some network ones): the caller runs unlocked. Without
    ``wait``, a lock another process holds is a :class:`BlockingIOError` (nothing left open)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:
        os.close(fd)
        return None
    return fd


#: Largest export provenance file read (ours are a few hundred bytes).
MAX_MARKER_BYTES = 1 << 20


def export_marker(directory: Path, marker: str, fmt: str) -> dict[str, Any] | None:
    """The provenance ``directory / marker`` that an export writes, if it is a JSON object of format
    ``fmt``; else None (missing, unreadable, not a regular file, too large or deep, or another export's).
    Every load of a run reads its ``run.json``: a FIFO there hung ``skewlens check``, and deep nesting was
    a RecursionError traceback."""
    path = directory / marker
    try:
        doc = read_json_bounded(path, MAX_MARKER_BYTES)
    except SkewlensError:
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == fmt else None


def check_replaceable(out: Path, *, marker: str, fmt: str, what: str) -> None:
    """Refuse an ``out`` that :func:`replace_dir` would replace but that is anything other than missing,
    empty or an earlier ``what`` (its ``marker`` file of format ``fmt``): it would remove whatever else the
    directory held (a run itself, given as ``--out RUN``)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SkewlensError(f"{out}: exists and is not a directory")
    if any(out.iterdir()) and export_marker(out, marker, fmt) is None:
        raise SkewlensError(
            f"{out}: not empty and not an earlier {what} (no {marker} of format {fmt!r}), and the export "
            f"replaces the whole directory; choose another --out or remove it"
        )


def replace_dir(tmp: Path, out: Path) -> None:
    """Put the finished directory ``tmp`` (a sibling of ``out``) in place of ``out``, by renames: readers
    see the old directory or the new one, never a mix; the old one is removed after. Two replacing one
    ``out`` at once take turns (:func:`_locked`): the last one's is there."""
    with _locked(out.parent):  # another's replace between these renames failed one, leaving its .old-
        if not out.exists():
            tmp.replace(out)
            return
        old = tmp.with_name(f"{tmp.name}{REPLACED_SUFFIX}")  # as unique as tmp, a staging directory
        try:
            out.replace(old)
        except OSError:
            if os.path.ismount(out):  # was "cannot write OUT: Device or resource busy (OUT)"
                raise SkewlensError(
                    f"cannot write {out}: it is a mount point, and this output replaces its whole directory "
                    f"(by renames beside it); give a directory inside it, such as {out / 'out'}"
                ) from None
            raise
        try:
            tmp.replace(out)
        except BaseException:  # an interrupt too: one between the renames left the earlier output hidden
            if tmp.exists():  # not renamed: the earlier output back, not left hidden as .OUT.<random>.tmp.old
                old.replace(out)
            else:  # renamed, then interrupted: the new output is in place, and the earlier one goes
                shutil.rmtree(old, ignore_errors=True)
            raise
    shutil.rmtree(old, ignore_errors=True)  # killed during it: the next command staging here removes it
