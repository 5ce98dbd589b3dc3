"""The native gloo-event recorder: a small C++ library built once per torch version, loaded with ctypes.

At the ``collectives`` level the capture needs the end of the collectives it does not time itself (DDP's
bucket all-reduce, issued from C++): gloo runs each collective on a worker thread inside a
``USER_SCOPE`` record function named ``gloo:<collective>``. ``gloo_events.cpp`` registers one
RecordFunction callback for that scope only and keeps those events (name, native thread id, start and
end on ``time.time_ns()``'s clock) in a buffer of a fixed capacity. A Kineto session restricted to the
same scope gives the same events at a higher cost (``benchmarks/capture_overhead.py --recorders``, 40
interleaved triples of whole runs, 2 ranks: 1.026 with Kineto, 1.006 with this library, CPU 1.028 and
1.012); it is the fallback.

The library is compiled with the C++ compiler (``$CXX``, split into words as a shell would, else ``c++``)
against the installed torch's headers and libraries into a cache directory (``$SKEWLENS_CACHE_DIR``, else
``$XDG_CACHE_HOME/skewlens``, else ``~/.cache/skewlens``), named by the torch version and a hash of the
source and of torch's location; one process compiles while the others wait on a lock, and the file
appears only when complete (compiled under a temporary name, then renamed). ``scripts/install.sh`` and
``skewlens profile`` (before starting the command) build it; a capture session that does not find it
(Python API) builds it when its window's warm-up begins. Where it cannot be built (no compiler, say),
or with ``SKEWLENS_GLOO_EVENTS=kineto``, the capture uses the Kineto session instead and the manifest
says why.

Nothing here imports torch at module level (the launcher does not load it): :class:`GlooEvents` does.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from skewlens.profiler.errors import CaptureError

SOURCE = Path(__file__).resolve().with_name("gloo_events.cpp")
ENV_MODE = "SKEWLENS_GLOO_EVENTS"
"""``native`` (the default) or ``kineto``: which recorder gives gloo's worker events."""
ENV_CACHE = "SKEWLENS_CACHE_DIR"
ENV_UNAVAILABLE = "SKEWLENS_NATIVE_UNAVAILABLE"
"""Set by ``skewlens profile`` for its command when the library could not be built, to why: the ranks
then take the Kineto session without compiling again, each of them."""
#: Longest a compilation may take.
BUILD_TIMEOUT_S = 300
#: Longest event name kept (gloo's are ``gloo:all_reduce`` and the like).
MAX_NAME_BYTES = 128
#: Longest a stop waits for gloo events still open. A worker thread closes its event after the work
#: completed and woke its waiter; on a loaded machine the waiter can reach the end of the window first,
#: and the window's last collective would have no end.
STOP_SETTLE_S = 0.1
#: How often a stop looks again while events are open.
STOP_POLL_S = 0.0005


class NativeBuildError(CaptureError):
    """The native gloo-event recorder could not be built or loaded."""


@dataclass(frozen=True, slots=True)
class GlooEvent:
    """One ``gloo:*`` record function as the library saw it."""

    name: str
    """Record function name, e.g. ``gloo:all_reduce``."""
    thread: int
    """Native id of the thread that ran it (gloo's worker)."""
    start_ns: int
    """Start, on ``time.time_ns()``'s clock."""
    end_ns: int
    """End, on the same clock."""


def wanted() -> bool:
    """Whether the native recorder is to be used (``SKEWLENS_GLOO_EVENTS`` not ``kineto``)."""
    mode = os.environ.get(ENV_MODE, "native").strip().lower()
    if mode not in {"native", "kineto"}:
        raise CaptureError(f"{ENV_MODE}={mode!r}: expected 'native' or 'kineto'")
    return mode == "native"


def cache_dir() -> Path:
    """Where built libraries are kept."""
    explicit = os.environ.get(ENV_CACHE)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "skewlens"
    try:
        return Path.home() / ".cache" / "skewlens"
    except RuntimeError as e:  # no home directory (a service account, say)
        raise NativeBuildError(
            f"native gloo-event recorder: no cache directory ({e}); set {ENV_CACHE}"
        ) from e


def _torch() -> tuple[Path, str]:
    """The installed torch's directory and version, found without importing it (the launcher does not
    need torch loaded)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise NativeBuildError("native gloo-event recorder: torch is not installed")
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError as e:
        raise NativeBuildError("native gloo-event recorder: torch has no package metadata") from e
    return Path(spec.origin).resolve().parent, version


def library_path() -> Path:
    """The library's path for the installed torch and this source."""
    torch_dir, version = _torch()
    try:
        source = SOURCE.read_bytes()
    except OSError as e:
        raise NativeBuildError(f"native gloo-event recorder: its source {SOURCE} is missing ({e})") from e
    digest = hashlib.sha256(source + str(torch_dir).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in ".-" else "_" for c in version)
    return cache_dir() / f"gloo_events-torch{safe}-{digest}.so"


def _compiler() -> list[str]:
    """``$CXX`` (else ``c++``) split as a shell splits it: make and a shell take ``CXX="ccache g++"`` or
    ``CXX="g++ -m64"``, which as one word was "no C++ compiler 'ccache g++'". A value the shell could not
    split (an unclosed quote) is a :class:`NativeBuildError` naming it."""
    value = os.environ.get("CXX") or "c++"
    try:
        words = shlex.split(value)
    except ValueError as e:
        raise NativeBuildError(f"native gloo-event recorder: CXX={value!r}: {e}") from None
    if not words:
        return ["c++"]
    return words


def _compile_command(out: Path) -> list[str]:
    """torch 2.13+ wheels use the C++11 ABI (the compiler's default) and C++20 headers."""
    torch_dir, _ = _torch()
    include, lib = torch_dir / "include", torch_dir / "lib"
    return [
        *_compiler(), "-O2", "-std=c++20", "-fPIC", "-shared", "-isystem", str(include), str(SOURCE),
        "-o", str(out), f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu",
    ]  # fmt: skip


def build() -> Path:
    """Build the library unless it is there already; its path. Raises :class:`NativeBuildError`
    naming what failed (compiler missing, compilation error, cache not writable)."""
    path = library_path()
    if path.is_file():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_name(".build.lock").open("a")
    except OSError as e:
        raise NativeBuildError(
            f"native gloo-event recorder: cache {path.parent} not writable ({e}; set {ENV_CACHE} or "
            "XDG_CACHE_HOME to a writable directory)"
        ) from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process compiles, the others then find the file
        if path.is_file():
            return path
        cmd = _compile_command(path)
        if shutil.which(cmd[0]) is None:
            raise NativeBuildError(f"native gloo-event recorder: no C++ compiler {cmd[0]!r} (set CXX)")
        tmp = path.with_name(f".build-{os.getpid()}.so")
        cmd[cmd.index(str(path))] = str(tmp)
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
            if res.returncode != 0:
                lines = [ln for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
                first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "no output")
                raise NativeBuildError(
                    f"native gloo-event recorder: {cmd[0]} failed ({res.returncode}) on {SOURCE.name}: "
                    f"{first.strip()}"
                )
            tmp.replace(path)
        except subprocess.TimeoutExpired as e:
            raise NativeBuildError(
                f"native gloo-event recorder: {cmd[0]} took over {BUILD_TIMEOUT_S} s on {SOURCE.name}"
            ) from e
        except OSError as e:
            raise NativeBuildError(f"native gloo-event recorder: building {path} failed ({e})") from e
        finally:
            tmp.unlink(missing_ok=True)
    return path


class GlooEvents:
    """The loaded library: start, stop, read back."""

    def __init__(self, path: Path) -> None:
        import torch  # noqa: F401  (its libraries must be loaded first: this one links against them)

        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise NativeBuildError(f"native gloo-event recorder: cannot load {path} ({e})") from e
        i64, p64 = ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
        lib.skewlens_gloo_start.argtypes, lib.skewlens_gloo_start.restype = [i64], ctypes.c_int
        lib.skewlens_gloo_stop.argtypes, lib.skewlens_gloo_stop.restype = [], i64
        lib.skewlens_gloo_dropped.argtypes, lib.skewlens_gloo_dropped.restype = [], i64
        lib.skewlens_gloo_event.argtypes = [i64, ctypes.c_char_p, i64, p64, p64, p64]
        lib.skewlens_gloo_event.restype = ctypes.c_int
        lib.skewlens_gloo_clear.argtypes, lib.skewlens_gloo_clear.restype = [], None
        lib.skewlens_gloo_open.argtypes, lib.skewlens_gloo_open.restype = [], i64
        self._lib = lib
        self.dropped = 0
        """Events the last window did not keep (its buffer was full)."""

    def start(self, capacity: int) -> bool:
        """Start recording (at most ``capacity`` events); False when a recording is already on."""
        return int(self._lib.skewlens_gloo_start(capacity)) == 0

    def open_events(self) -> int:
        """gloo events started and not ended yet."""
        return int(self._lib.skewlens_gloo_open())

    def stop(self, settle_s: float = STOP_SETTLE_S) -> list[GlooEvent]:
        """Stop recording, once the events still open have ended (waiting at most ``settle_s``); the
        events, in the order they ended. The library's buffer is freed."""
        deadline = time.monotonic() + settle_s
        while self.open_events() > 0 and time.monotonic() < deadline:
            time.sleep(STOP_POLL_S)
        n = int(self._lib.skewlens_gloo_stop())
        self.dropped = int(self._lib.skewlens_gloo_dropped())
        name = ctypes.create_string_buffer(MAX_NAME_BYTES)
        thread, start, end = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        out = []
        for i in range(n):
            if self._lib.skewlens_gloo_event(
                i, name, MAX_NAME_BYTES, ctypes.byref(thread), ctypes.byref(start), ctypes.byref(end)
            ):
                break
            out.append(GlooEvent(name.value.decode("utf-8", "replace"), thread.value, start.value, end.value))
        self._lib.skewlens_gloo_clear()
        return out


_loaded: dict[Path, GlooEvents] = {}


def load() -> GlooEvents:
    """The recorder (built first when missing); :class:`NativeBuildError` when it cannot be had. Loaded
    once per process."""
    why = os.environ.get(ENV_UNAVAILABLE)
    if why:
        raise NativeBuildError(why)
    path = build()
    if path not in _loaded:
        _loaded[path] = GlooEvents(path)
    return _loaded[path]


def main() -> int:
    """``python -m skewlens.profiler.capture.native``: build the library (if needed) and print its path."""
    try:
        print(build())
    except NativeBuildError as e:
        print(f"skewlens: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
