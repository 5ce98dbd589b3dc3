"""The console the commands (and the sweep summary, which Hydra calls back) print their reports on."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO, TextIO

from rich.console import Console, ConsoleOptions, ConsoleRenderable, Group, RenderableType, RenderHook
from rich.segment import Segment
from rich.table import Table

from skewlens.profiler.store.issues import MAX_RANK_ROWS

#: Width of the reports where they go to a file or a pipe (a CI log, ``| tee``): rich's default there is
#: 80 columns, which wraps a table's free-text cause column into slivers a word wide. ``COLUMNS`` in the
#: environment still decides, and a terminal keeps its own width.
FILE_WIDTH = 160
#: The narrowest a report is drawn (the terminal wraps it): ``COLUMNS=0`` printed no report at all, and
#: a width under a table's borders (``COLUMNS=5``, a pane a few columns wide) was rich's AssertionError
#: traceback (``Sum of ratios must be > 0``), exit code 1, or, in ``skewlens replay``, Hydra's, exit code 2.
MIN_WIDTH = 20


#: What :func:`printable` replaces: the C0 controls but tab and newline, DEL, and the C1 controls.
_CONTROLS = dict.fromkeys([*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)], "\N{REPLACEMENT CHARACTER}")


def undecodable_name(e: UnicodeEncodeError) -> str | None:
    """What to say of ``e`` where it is a name Python could not decode in this locale (``LC_ALL=C
    PYTHONUTF8=0``: a file name's non-ASCII bytes kept as surrogates, which no UTF-8 output, a Parquet
    string or a Chakra attribute, can hold), else None. It was a UnicodeEncodeError traceback (``skewlens
    export``, ``calibrate``, ``replay -m``, ``export --format astra-sim`` of a run in ``/data/rün``)."""
    if not isinstance(e.object, str) or "surrogates not allowed" not in str(e):
        return None
    around = e.object[max(0, e.start - 60) : e.end + 60]
    shown = around.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return (
        f"{shown!r}: holds a name this locale cannot decode (file names are "
        f"{sys.getfilesystemencoding()} here, and this one is not), which an output cannot hold; run with "
        "PYTHONUTF8=1 or in a UTF-8 locale"
    )


def printable(text: str) -> str:
    """``text`` with its control characters shown as U+FFFD: names and messages from a trace are untrusted,
    and an operator named ``\x1b]0;...\x07`` set the terminal's title when a report printed it (ESC
    sequences can recolour, move the cursor, or on some terminals write the clipboard)."""
    return text.translate(_CONTROLS)


#: One ASCII character for each non-ASCII one the reports print (units, ellipses, fitted symbols), so that a
#: table keeps its columns' widths where the output's encoding lacks them.
_ASCII_STAND_INS = str.maketrans(
    "\N{HORIZONTAL ELLIPSIS}\N{MICRO SIGN}\N{GREEK SMALL LETTER MU}\N{MULTIPLICATION SIGN}"
    "\N{RIGHTWARDS ARROW}\N{LEFTWARDS ARROW}\N{SUPERSCRIPT TWO}\N{GREEK SMALL LETTER ALPHA}"
    "\N{GREEK SMALL LETTER BETA}\N{GREEK CAPITAL LETTER DELTA}\N{MINUS SIGN}\N{EN DASH}\N{EM DASH}"
    "\N{MIDDLE DOT}\N{ALMOST EQUAL TO}",
    "~uux><2abd---.~",
)

#: The codec error handler :func:`encodable_output` gives a stream: :data:`_ASCII_STAND_INS`, and any other
#: character escaped as Python's ``backslashreplace`` does (a path's ``ü`` as ``\xfc``, still telling).
STAND_IN_ERRORS = "skewlens-stand-in"

#: The error handlers :func:`encodable_output` replaces: Python's defaults for stdout and for stderr, and
#: for stdout in the C locale without UTF-8 mode (``LC_ALL=C PYTHONUTF8=0``: ASCII with surrogateescape).
_DEFAULT_ERRORS = ("strict", "backslashreplace", "surrogateescape")

#: The surrogates that ``surrogateescape`` decoding made of undecodable bytes (a file name's), given back
#: as those bytes as that handler does.
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


def _stand_in(error: UnicodeError) -> tuple[str | bytes, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    escaped = ord(error.object[error.start]) in _ESCAPED_BYTES
    end = error.start
    while end < error.end and (ord(error.object[end]) in _ESCAPED_BYTES) == escaped:
        end += 1
    if escaped:  # those bytes, up to the next other character (surrogateescape refused a range holding one)
        return bytes(ord(c) - 0xDC00 for c in error.object[error.start : end]), end
    text = error.object[error.start : end].translate(_ASCII_STAND_INS)
    return text.encode("ascii", "backslashreplace").decode("ascii"), end


codecs.register_error(STAND_IN_ERRORS, _stand_in)


@contextlib.contextmanager
def encodable_output() -> Iterator[None]:
    """stdout and stderr print what their encoding lacks as :data:`STAND_IN_ERRORS` does while the command
    runs: on a stream that cannot encode the reports' characters (``PYTHONIOENCODING=ascii``, a Latin-1
    locale, a CI runner's ASCII log) the first ``…`` or ``µs`` on stdout was a UnicodeEncodeError traceback
    and exit code 1, and the whole report was lost; on stderr (profile's summary) each was a ``\u2026``
    six columns wide that pushed its table's borders out of line. rich draws its boxes in ASCII there by
    itself. A stream told something else to do with such characters (``PYTHONIOENCODING=ascii:replace``)
    is left as it is."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors in _DEFAULT_ERRORS:
            changed.append((stream, stream.errors))
            stream.reconfigure(errors=STAND_IN_ERRORS)
    try:
        yield
    finally:
        for stream, errors in changed:
            with contextlib.suppress(ValueError, OSError):  # closed, or its reader gone: nothing to put back
                stream.reconfigure(errors=errors)


def print_warning(command: str, text: str) -> None:
    """``text`` on stderr as ``skewlens COMMAND: warning: TEXT``, through :func:`printable`: what a command
    skipped, ignored, left out or assumed, kept out of its results (a script's ``> out.txt``); written as
    :func:`print_stderr` writes."""
    print_stderr(f"skewlens {command}: warning: {text}")


def print_stderr(line: str) -> None:
    """``line`` on stderr through :func:`printable`. A stderr whose reader went away is silenced and the
    command goes on (it ended the command with exit code 141 before calibrate wrote its ``--out``, and
    turned a failed sweep's exit code 2 into 141); with no stderr at all (``2>&-``) the line is dropped,
    where ``print`` wrote it to stdout, among the results."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(f"{printable(line)}\n")
        stream.flush()
    except BrokenPipeError:
        silence(stream)


def silence(stream: IO[str]) -> None:
    """Points ``stream``'s file descriptor at the null device, so that what is still written to it (a
    buffer flushed at exit included) goes nowhere instead of raising :class:`BrokenPipeError` again; a
    stream without a descriptor (a test's ``StringIO``) is left as it is."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class QuietPipe(io.TextIOBase):
    """A text stream in front of ``stream`` that goes quiet where ``stream``'s reader went away: what is
    written after that is dropped (the descriptor :func:`silence` d) instead of raising
    :class:`BrokenPipeError`, and :attr:`broken` says so. For what prints through :mod:`logging` onto
    stdout (Hydra's ``--info``): a logging handler takes the error of every line it writes and prints it
    as a "--- Logging error ---" traceback on stderr. Only that stream is guarded: another handler's errors
    are still reported."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False
        """Whether ``stream``'s reader went away."""

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        self.broken = True
        silence(self.stream)  # what the stream still buffers goes nowhere when it is flushed at exit


class ReportConsole(Console):
    """A console that prints what it is given as plain text: no markup (a kernel named ``x[/bold]`` was a
    MarkupError traceback, ``[link=...]`` a link), no control characters (:func:`printable`); rich's own
    control segments (a progress bar's cursor moves) pass. Its reader going away (``skewlens calibrate RUN
    --out cal.yaml | head -3``) silences it and lets the command finish: rich's own console ended the
    command with ``SystemExit(1)`` at that print, without a word, before calibrate wrote its ``--out`` and
    with ``check``'s exit code for a run with errors."""

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            yield seg if seg.control else Segment(printable(seg.text), seg.style)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence(self.file)


class FoldFigures(RenderHook):
    """Folds the figures of a table too wide for the console onto a second line instead of cutting them:
    rich narrowed every column of such a table alike and ended what no longer fitted with an ellipsis, so
    that at 80 columns the step breakdown of a GPU run showed a step of 615.14 ms as ``615…`` (and one of
    1,234.56 as ``1,2…``). A table's right-aligned columns (its figures, ranks and rank ranges) fold; their
    headers are still cut (``ste…``), where folding ``steps`` into ``step`` and ``s`` would read worse. A
    column made ``no_wrap`` (one rich narrows last) keeps its ellipsis where it is cut at all."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        for renderable in renderables:
            self._fold(renderable)
        return renderables

    def _starved(self, table: Table) -> bool:
        """Whether rich would draw a column of ``table`` with no room for a character at the console's
        width, its columns that may not wrap taking it all: at 40 columns the worst collectives showed
        their names and six empty columns (no step, bytes, skew, wait, rank or cause), and calibrate's fit
        table, at 40, its fits' names and no figure at all. Such a table's columns may all wrap, and fold
        what does not fit (names too), so that nothing is lost. Rich's own sizing (private, so a rich
        without it changes nothing)."""
        if not any(column.no_wrap for column in table.columns):
            return False
        try:
            width = (table.width or self.console.width) - table._extra_width
            widths = table._calculate_column_widths(self.console, self.console.options.update_width(width))
            return any(w <= table._get_padding_width(i) for i, w in enumerate(widths))
        except AttributeError:
            return False

    def _fold(self, renderable: object) -> None:
        if isinstance(renderable, Group):
            for inner in renderable.renderables:
                self._fold(inner)
        elif isinstance(renderable, Table):
            if self._starved(renderable):
                for column in renderable.columns:
                    if column.no_wrap:  # the names too: folded whole, the row's name as its figures
                        column.no_wrap, column.overflow = False, "fold"
            for column in renderable.columns:
                # a column that may not wrap keeps its ellipsis: folded, rich cut it without a mark
                if column.justify == "right" and column.overflow == "ellipsis" and not column.no_wrap:
                    if isinstance(column.header, str):
                        column.header = self.console.render_str(column.header)
                        column.header.overflow = "ellipsis"
                    column.overflow = "fold"


def on_a_terminal(console: Console) -> bool:
    """Whether ``console`` writes to a terminal: rich's ``is_terminal``, except where it says so only because
    ``FORCE_COLOR`` is set, as CI jobs set it for coloured logs, of a stream that is no TTY: there a progress
    bar was redrawn into the log ten times a second, and the reports were 80 columns wide instead of
    :data:`FILE_WIDTH`. Colours are still rich's to decide. ``TTY_COMPATIBLE=1`` asks for a terminal's
    behaviour on any stream, bars included (``benchmarks/e2e.py`` reads the commands' stages from them)."""
    if not console.is_terminal:
        return False
    if os.environ.get("FORCE_COLOR") is None or os.environ.get("TTY_COMPATIBLE") == "1":
        return True  # rich asked the stream, or the user asked for a terminal's behaviour
    isatty = getattr(console.file, "isatty", None)
    try:
        return isatty is not None and bool(isatty())
    except ValueError:  # a closed stream
        return False


def report_console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr), :data:`FILE_WIDTH` wide where it is not a terminal (at least
    :data:`MIN_WIDTH` wide wherever ``COLUMNS`` or the terminal says less), that prints
    strings as plain text and that a closed pipe silences (:class:`ReportConsole`), and whose tables fold
    their figures rather than cut them (:class:`FoldFigures`)."""
    console = ReportConsole(stderr=stderr, markup=False)
    console.push_render_hook(FoldFigures(console))
    columns = os.environ.get("COLUMNS", "")
    width = console.width
    if not on_a_terminal(console) and not columns.isdigit():
        # COLUMNS that is no width (empty, `abc`, ` 60`) says nothing, as rich takes it: the report was 80
        # columns wide, rich's default, where it is FILE_WIDTH without COLUMNS
        width = FILE_WIDTH
    elif console.is_dumb_terminal and columns.isdigit():
        # rich draws 80 columns on a dumb terminal (TERM=dumb: Emacs' shell, which sets COLUMNS to its
        # window's width) whatever COLUMNS says: at COLUMNS=60 the report ran past the window, at 120 it
        # wrapped the cause columns a word wide
        width = int(columns)
    elif console.is_dumb_terminal and (size := _terminal_columns(console.file)):
        # and without COLUMNS, rich's 80 columns whatever the terminal's width: its own size, as any
        # terminal's (a TERM=dumb terminal outside Emacs, which sets COLUMNS, ran past a 60-column one)
        width = size
    if width != console.width or width < MIN_WIDTH:
        # the size, not the width alone: on a dumb terminal rich takes a width only with a height
        console.size = (max(width, MIN_WIDTH), console.height)
    return console


def _terminal_columns(stream: IO[str]) -> int:
    """The width of the terminal ``stream`` writes to (``os.get_terminal_size``); 0 where it tells none (no
    file descriptor, not a terminal, a pseudo-terminal that says 0)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is an OSError
        return 0


def print_line(console: Console, text: str) -> None:
    """``text``, which names paths or a command to copy, printed as one line that the terminal wraps
    (rich's ``soft_wrap``), as plain text: rich wrapped such lines itself, with a line break in the middle
    of a long path (``/tmp/runs/a_long_na`` / ``me/analysis``), which a copy from the terminal or a CI
    log then held; a terminal's own wrap copies as the one line it is."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def ranks_caption(ranks: tuple[int, ...], where: str) -> str:
    """What a summary listing only the first :data:`MAX_RANK_ROWS` of ``ranks`` says of the rest: ``1,024
    ranks: the first 32 listed, 992 more in RUN/manifest.json``."""
    rest = len(ranks) - MAX_RANK_ROWS
    return f"{len(ranks):,} ranks: the first {MAX_RANK_ROWS} listed, {rest:,} more in {where}"
