"""The capture window, like torch.profiler's schedule: a pure function ``step -> action`` plus transitions.

Steps are counted from 0. The first ``wait`` steps are skipped, the next ``warmup`` steps run the capture
machinery without keeping what it records, the next ``active`` steps are recorded; after them capture is
done. :data:`TRANSITIONS` names what a session does when the action changes between two steps; the
session maps each :class:`Phase` to one of its methods. Nothing here imports torch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import StepWindow


class Action(StrEnum):
    """What capture does during one step."""

    NONE = "none"
    """Before the window: nothing recorded."""
    WARMUP = "warmup"
    """Capture machinery on, results discarded."""
    RECORD = "record"
    """Recorded."""
    DONE = "done"
    """After the window: capture finished (results saved)."""


class Phase(StrEnum):
    """Session callbacks run on a change of action."""

    START_WARMUP = "start_warmup"
    START_RECORD = "start_record"
    SAVE = "save"


#: ``(previous action, current action) -> phases to run, in order`` (unlisted pairs run nothing).
TRANSITIONS: dict[tuple[Action, Action], tuple[Phase, ...]] = {
    (Action.NONE, Action.WARMUP): (Phase.START_WARMUP,),
    (Action.NONE, Action.RECORD): (Phase.START_WARMUP, Phase.START_RECORD),
    (Action.WARMUP, Action.RECORD): (Phase.START_RECORD,),
    (Action.RECORD, Action.DONE): (Phase.SAVE,),
    (Action.NONE, Action.DONE): (Phase.SAVE,),
    (Action.WARMUP, Action.DONE): (Phase.SAVE,),
}


def action_for(step: int, window: StepWindow) -> Action:
    """The action of training step ``step`` (0-based) under ``window``."""
    if step < window.wait:
        return Action.NONE
    if step < window.wait + window.warmup:
        return Action.WARMUP
    if step < window.wait + window.warmup + window.active:
        return Action.RECORD
    return Action.DONE


def phases_between(previous: Action, current: Action) -> tuple[Phase, ...]:
    """Phases to run when the action changes from ``previous`` to ``current``."""
    return TRANSITIONS.get((previous, current), ())


_Choice = TypeVar("_Choice", bound=StrEnum)


def parse_choice(kind: type[_Choice], value: str, flag: str) -> _Choice:
    """``value`` as a member of ``kind`` (``Level``, ``HostTrace``); raises :class:`CaptureError` naming
    ``flag`` and the accepted values."""
    try:
        return kind(value)
    except ValueError:
        raise CaptureError(f"{flag} {value!r}: expected one of {', '.join(m.value for m in kind)}") from None


#: The most steps each of WAIT, WARMUP and ACTIVE may count: what a rank's part file may hold (the merge
#: refuses a part file past it, and a run whose every rank saved a trace would end without a manifest).
MAX_WINDOW_STEPS = 1 << 62


def parse_window(spec: str) -> StepWindow:
    """Parse ``WAIT:WARMUP:ACTIVE`` (e.g. ``1:1:3``); raises :class:`CaptureError` naming the problem."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise CaptureError(f"--steps {spec!r}: expected WAIT:WARMUP:ACTIVE, e.g. 1:1:3")
    try:
        wait, warmup, active = (int(p) for p in parts)
    except ValueError:
        raise CaptureError(f"--steps {spec!r}: WAIT, WARMUP and ACTIVE must be integers") from None
    if wait < 0 or warmup < 0 or active < 1:
        raise CaptureError(f"--steps {spec!r}: WAIT and WARMUP must be >= 0 and ACTIVE >= 1")
    if max(wait, warmup, active) > MAX_WINDOW_STEPS:
        raise CaptureError(
            f"--steps {spec!r}: WAIT, WARMUP and ACTIVE must be at most 2**62 ({MAX_WINDOW_STEPS})"
        )
    return StepWindow(wait=wait, warmup=warmup, active=active)


def format_window(window: StepWindow) -> str:
    """The ``WAIT:WARMUP:ACTIVE`` form of a window (inverse of :func:`parse_window`)."""
    return f"{window.wait}:{window.warmup}:{window.active}"
