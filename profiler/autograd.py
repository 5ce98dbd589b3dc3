"""Backward passes on autograd's device threads: which stretches of such a thread the main thread waited
for, one rule for the capture (:mod:`skewlens.profiler.capture.build`) and the Kineto importer
(:mod:`skewlens.profiler.importers.convert`).

On a GPU the autograd engine runs ``backward()`` on a device thread of its own while the calling thread
waits in the call, with no operator of its own; where the calling thread runs part of the graph itself
(CPU-side nodes, FSDP2's synchronisations over gloo) the two take turns. A stretch of the engine's work
during which the main thread started nothing follows what the main thread did last before it (the call),
and the main thread's next node follows the stretch. This module imports only the standard library.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

#: Kineto's name of the autograd engine's work on one node of the backward graph (a thread with such
#: operators other than the main thread is an engine thread).
ENGINE_OP_PREFIX = "autograd::engine::evaluate_function"
#: What comes before the backward function's name in such an operator's name
#: (``autograd::engine::evaluate_function: AddmmBackward0``).
ENGINE_NODE_PREFIX = f"{ENGINE_OP_PREFIX}: "


def is_engine_op(name: str) -> bool:
    """Whether a host operator is the autograd engine's work on a node of the backward graph."""
    return name.startswith(ENGINE_OP_PREFIX)


def backward_function(name: str) -> str:
    """The backward function the autograd engine's operator ``name`` ran (``AddmmBackward0`` of
    ``autograd::engine::evaluate_function: AddmmBackward0``: the name users know, which the analyses' causes
    give), any other name unchanged."""
    return name.removeprefix(ENGINE_NODE_PREFIX)


def is_accumulation(name: str) -> bool:
    """Whether a host operator is the autograd engine's work on a gradient's accumulation (a leaf of the
    backward graph: it accumulates the gradient and runs its hooks, DDP's reducer's among them, and
    evaluates no other node)."""
    return is_engine_op(name) and name.endswith("AccumulateGrad")


def backward_runs(engine_starts: Sequence[int], main_starts: Sequence[int]) -> list[tuple[int, int]]:
    """The stretches of an engine thread's nodes during which the main thread started nothing, as
    ``(first, last)`` indices into ``engine_starts`` (their starts, sorted). ``main_starts``: sorted starts
    of the main thread's nodes and of the steps (a stretch never spans a step boundary)."""
    out: list[tuple[int, int]] = []
    if not engine_starts:
        return out
    first, before = 0, bisect_left(main_starts, engine_starts[0])
    for i in range(1, len(engine_starts)):
        k = bisect_left(main_starts, engine_starts[i])
        if k != before:  # the main thread started something since this stretch began
            out.append((first, i - 1))
            first, before = i, k
    out.append((first, len(engine_starts) - 1))
    return out


def fork_and_join(
    first_start_ns: int,
    last_end_ns: int,
    *,
    main_starts: Sequence[int],
    main_ends: Sequence[int],
    step_starts: Sequence[int],
) -> tuple[int, int]:
    """Where a stretch of :func:`backward_runs` (its first node's start, its last node's end) joins the main
    thread: the index into ``main_ends`` (the main thread's nodes' ends, sorted) of the node it follows, the
    last to end by its start with no step starting in between (the call), and the index into
    ``main_starts`` (their starts, sorted) of the node that follows it, the main thread's next node after
    the stretch began, where that starts once the stretch has ended (it waited till then); -1 for none."""
    k = bisect_right(main_ends, first_start_ns) - 1
    if k >= 0 and bisect_right(step_starts, main_ends[k]) != bisect_right(step_starts, first_start_ns):
        k = -1
    a = bisect_left(main_starts, first_start_ns)
    return k, a if a < len(main_starts) and main_starts[a] >= last_end_ns else -1


def joins(
    stretches: Sequence[tuple[int, int]], main: Sequence[tuple[int, int]], step_starts: Sequence[int]
) -> list[tuple[int, int]]:
    """For each stretch of :func:`backward_runs` (its first node's start, its last node's end), the index
    into ``main`` (the main thread's nodes' ``(start, end)``; ties go by their order there) of the node it
    follows and of the node that follows it (:func:`fork_and_join`), -1 for none."""
    by_start = sorted(range(len(main)), key=lambda i: (main[i][0], i))
    by_end = sorted(range(len(main)), key=lambda i: (main[i][1], i))
    starts, ends = [main[i][0] for i in by_start], [main[i][1] for i in by_end]
    steps = sorted(step_starts)
    out = []
    for first, last in stretches:
        k, a = fork_and_join(first, last, main_starts=starts, main_ends=ends, step_starts=steps)
        out.append((by_end[k] if k >= 0 else -1, by_start[a] if a >= 0 else -1))
    return out


def joins_note(stretches: int, joined: int) -> str:
    """The manifest note of :func:`joins`: the stretches, and how many the main thread's next node
    followed."""
    return (
        f"{stretches} stretch(es) of backward passes on autograd's device thread(s): each after the main "
        f"thread's work before it, {joined} joined by the main thread's next node"
    )
