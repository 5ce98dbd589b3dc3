"""Slowdown items checked against the run they slow: every rank, link, node, step, op pattern and device an
item names is in the run, so that a slowdown of rank 99 on 8 ranks, or of an op no rank runs, is refused
naming its key instead of slowing nothing, silently. :func:`skewlens.replay.simulate.simulate` checks a
:class:`~skewlens.replay.slowdown.SlowdownModel` it is given; ``skewlens replay`` checks its config's items
(``skewlens.replay.driver.slowdowns_for``) before anything is simulated or written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from skewlens.profiler.autograd import backward_function
from skewlens.profiler.store.issues import counted, rank_ranges, ranks_label
from skewlens.profiler.store.model import RankTrace, RunTrace
from skewlens.replay.errors import MAX_SIM_NS, SIM_CLOCK, ConfigError
from skewlens.replay.execution import compute_rows, execution_model, host_idle_rows
from skewlens.replay.lower import group_members
from skewlens.replay.slowdown import COMM_ON, Slowdown, op_matches


class Preset(Protocol):
    """The knobs of a named slowdown preset (``skewlens.replay.config.SlowdownConfig``, which this module
    cannot import: it imports ``omegaconf``, and the simulator, which checks with this module, may not)."""

    name: str
    rank: int
    factor: float
    step: int | None


def run_steps(run: RunTrace) -> list[int]:
    """The steps the run's nodes belong to, in order."""
    found: set[int] = set()
    for rt in run.ranks.values():
        found.update(int(s) for s in np.unique(rt.step) if s >= 0)
    return sorted(found)


def check_slowdown_targets(
    items: Sequence[Slowdown],
    run: RunTrace,
    node_of: Callable[[int], int],
    steps: Sequence[int],
    *,
    preset: Preset | None = None,
    where: str = "slowdown.entries",
    placed_by: str = "",
) -> None:
    """Every rank, link, node and step a slowdown item names is in the replayed run (a slowdown of rank 99
    on 8 ranks would otherwise slow nothing, silently; nodes as ``node_of`` places the ranks, ``placed_by``
    naming that placement; ``steps``: the run's, :func:`run_steps`, needed where an item is a stall): raises
    :class:`ConfigError` naming the key (``where[k]``, ``slowdown.entries[k]`` as the replay's config names
    item ``k``), and, where the items came from ``preset`` (``slowdown=straggler``; None: entries given on
    the command line or in Python) and the value is its knob's, the knob to set (``slowdown.rank``)."""
    world_size = run.world_size
    nodes = sorted({node_of(r) for r in range(world_size)}) if any(i.nodes for i in items) else []
    for k, item in enumerate(items):
        key = f"{where}[{k}]"
        for r in (*item.ranks, *(r for link in item.links for r in link)):
            if not 0 <= r < world_size:
                field = "ranks" if r in item.ranks else "links"
                hint = _preset_hint(preset, "rank", r) if field == "ranks" else ""
                raise ConfigError(
                    f"{key}.{field}: rank {r} is not in the run (ranks 0-{world_size - 1}){hint}"
                )
        for r in item.ranks:
            if r not in run.ranks:  # in the world, but no trace of it was loaded (lenient, --allow-missing)
                traced = rank_ranges(sorted(run.ranks))
                raise ConfigError(
                    f"{key}.ranks: rank {r} has no trace in the run (traced: {traced}), so slowing it would "
                    f"slow nothing{_preset_hint(preset, 'rank', r)}"
                )
        for n in item.nodes:
            if n not in nodes:
                raise ConfigError(
                    f"{key}.nodes: node {n} holds none of the run's {counted(world_size, 'rank')}"
                    f"{placed_by} (nodes {nodes[0]}-{nodes[-1]})"
                )
        if item.device != "any":
            check_compute_device(key, item, run)
        if item.kind == "op":
            check_op_pattern(key, item, run)
        if item.kind in ("compute", "op") and item.factor > 1:
            check_factor_fits(key, item, run, preset=preset)
        if item.kind == "comm_delay":
            check_comm_delay_ops(key, item, run, preset=preset)
        if item.kind == "network" and item.links:
            check_network_links(key, item, run, preset=preset)
        have = f"steps {steps[0]}-{steps[-1]}" if steps else "no steps"
        if item.kind == "host_idle":
            check_host_idle(key, item, run, steps, preset=preset)
        if item.kind == "stall" and item.every_step:
            if not any(item.in_window(s) for s in steps):
                raise ConfigError(
                    f"{key}.first_step: steps {item.window()} hold none of the run's ({have}): a stall at "
                    "every step of them would stall nothing"
                )
        elif item.kind == "stall" and item.step is None:  # the replay's config fills in the first step
            raise ConfigError(f"{key}.step: a stall needs the step it comes before, or every_step ({have})")
        elif item.kind == "stall" and item.step not in steps:
            hint = _preset_hint(preset, "step", item.step)
            raise ConfigError(f"{key}.step: step {item.step} is not in the run ({have}){hint}")


def check_host_idle(
    key: str, item: Slowdown, run: RunTrace, steps: Sequence[int], *, preset: Preset | None = None
) -> None:
    """A ``host_idle`` item's window holds some of the run's ``steps`` (where it is limited to some), and its
    ranks some untraced host time in it (``execution.host_idle_rows``), else a :class:`ConfigError` naming
    the key: scaling none would replay the run unchanged, silently."""
    windowed = item.first_step is not None or item.last_step is not None
    if windowed and not any(item.in_window(s) for s in steps):
        have = f"steps {steps[0]}-{steps[-1]}" if steps else "no steps"
        field = "first_step" if item.first_step is not None else "last_step"
        hint = _preset_hint(preset, "step", getattr(item, field))
        raise ConfigError(f"{key}.{field}: steps {item.window()} hold none of the run's ({have}){hint}")
    em = execution_model(run)
    ranks = list(item.ranks) or sorted(run.ranks)
    for r in ranks:
        rt, m = run.ranks[r], em.ranks[r]
        gaps, untraced = host_idle_rows(rt, m)
        # the rows of the steps the item scales (Slowdown.in_window, the rule its factor is applied by)
        window = np.isin(rt.step, [s for s in np.unique(rt.step).tolist() if item.in_window(s)])
        if (m.gap_ns[gaps & window] > 0).any() or (m.work_ns[untraced & window] > 0).any():
            return
    raise ConfigError(
        f"{key}: {ranks_label(ranks)} {'has' if len(ranks) == 1 else 'have'} no untraced host time"
        f"{f' in steps {item.window()}' if windowed else ''} "
        "(no gap between host rows, no untraced node) for factor to scale"
    )


def _preset_hint(preset: Preset | None, knob: str, value: object) -> str:
    """``; the straggler preset takes it from slowdown.rank`` where the items came from ``preset`` and
    ``value`` is its ``knob``'s (a value the user typed into entries of their own gets no such hint)."""
    if preset is None or getattr(preset, knob) != value:
        return ""
    return f"; the {preset.name} preset takes it from slowdown.{knob}"


def check_comm_delay_ops(key: str, item: Slowdown, run: RunTrace, *, preset: Preset | None = None) -> None:
    """A ``comm_delay`` item's ranks have a node it delays (a ``before`` op), else a :class:`ConfigError`
    naming the key and the ranks that have such ops (a delay before every send of a rank that sends nothing
    delayed nothing, and the report said ``+5 ms before every send op on rank 1`` all the same)."""
    types = np.array([int(t) for t in COMM_ON[item.before]], dtype=np.int8)

    def has(r: int) -> bool:
        return bool(np.isin(run.ranks[r].node_type, types).any())

    ranks = [r for r in (item.ranks or sorted(run.ranks)) if r in run.ranks]
    if any(has(r) for r in ranks):
        return
    others = [r for r in sorted(run.ranks) if r not in ranks and has(r)]
    have = f"ranks with {item.before} ops: {', '.join(map(str, others))}" if others else "the run has none"
    knob = preset is not None and preset.rank in item.ranks
    hint = f"; the {preset.name} preset takes the rank from slowdown.rank" if knob and preset else ""
    raise ConfigError(
        f"{key}.ranks: {_has_none(item, ranks, f'{item.before} op')}, so a delay before every {item.before} "
        f"would delay nothing ({have}){hint}"
    )


def check_network_links(key: str, item: Slowdown, run: RunTrace, *, preset: Preset | None = None) -> None:
    """Some communication of ``run`` spans both ends of one of a ``network`` item's links (a collective
    whose group holds both, or a send/recv between them), else a :class:`ConfigError` naming the key: a slow
    link no transfer crosses slowed nothing, and the report said ``bandwidth x0.25 on links 0-1``."""
    pairs = {(min(a, b), max(a, b)) for a, b in item.links}
    if any((min(p.src_rank, p.dst_rank), max(p.src_rank, p.dst_rank)) in pairs for p in run.p2p):
        return
    groups = {group_members(run, c) for c in run.collectives}
    if any(a in g and b in g for g in groups for a, b in pairs):
        return
    links = ", ".join(f"{a}-{b}" for a, b in sorted(pairs))
    hint = (
        "; the slow_link preset's link is ranks 0-1"
        if preset is not None and preset.name == "slow_link"
        else ""
    )
    raise ConfigError(
        f"{key}.links: no collective or send/recv of the run spans link{'s' if len(pairs) > 1 else ''} "
        f"{links}, so slowing it would slow nothing{hint}"
    )


def _on_device(rt: RankTrace, device: str) -> npt.NDArray[np.bool_]:
    """Per row: on the device a slowdown's ``device`` names (``host``, ``gpu``; ``any``: every row)."""
    if device == "any":
        return np.ones(len(rt), dtype=np.bool_)
    return rt.is_cpu if device == "host" else ~rt.is_cpu


def check_compute_device(key: str, item: Slowdown, run: RunTrace) -> None:
    """A ``compute``, ``op`` or ``jitter`` item whose ``device`` is ``host`` or ``gpu`` has a compute op
    there on one of its ranks, else a :class:`ConfigError` naming the key (``device: gpu`` on a CPU trace
    slowed nothing, and the report said ``compute x1.5 (GPU ops) on rank 2`` all the same)."""
    model = execution_model(run)
    ranks = [r for r in (item.ranks or sorted(run.ranks)) if r in run.ranks]
    for r in ranks:
        rt = run.ranks[r]
        if (compute_rows(rt, model.ranks[r]) & _on_device(rt, item.device)).any():
            return
    what = "compute GPU ops (a CPU trace?)" if item.device == "gpu" else "compute host operators"
    none = _has_none(item, ranks, what)
    raise ConfigError(f"{key}.device: {none}, so device={item.device} would slow nothing")


def check_op_pattern(key: str, item: Slowdown, run: RunTrace) -> None:
    """An ``op`` item's pattern matches a compute node (what a compute factor scales:
    :func:`~skewlens.replay.execution.compute_rows`) of one of its ranks, else a :class:`ConfigError` naming
    the key and the names that take the most compute time there (a pattern matching nothing slowed
    nothing, and the report said ``ops 'aten::mm' x3 on rank 0`` all the same)."""
    model = execution_model(run)
    ranks = [r for r in (item.ranks or sorted(run.ranks)) if r in run.ranks]
    time_by_name: dict[str, int] = {}
    for r in ranks:
        rt = run.ranks[r]
        rows = compute_rows(rt, model.ranks[r]) & _on_device(rt, item.device)
        per_name = np.bincount(rt.name_idx[rows], weights=rt.dur_ns[rows], minlength=len(rt.names))
        for i in np.flatnonzero(per_name).tolist():
            if op_matches(item.pattern, rt.names[i]):
                return
            time_by_name[rt.names[i]] = time_by_name.get(rt.names[i], 0) + int(per_name[i])
    where = ranks_label(ranks) if item.ranks else "any rank"
    top = sorted(time_by_name, key=lambda n: -time_by_name[n])[:5]
    raise ConfigError(
        f"{key}.pattern: {item.pattern!r} matches no compute node of {where}, so it would slow nothing; "
        f"{_backward_hint(item.pattern, time_by_name)}"
        f"the names with the most compute time there: {', '.join(repr(n) for n in top) or 'none'}"
    )


def _backward_hint(pattern: str, time_by_name: dict[str, int]) -> str:
    """Where ``pattern`` matches backward ops of ``time_by_name`` only by their backward function's name
    (``SleepInBackwardBackward``, as ``skewlens analyze``'s causes name them), which of them, and that a
    pattern is matched against the whole name; else ''. A cause's ``compute grew: SleepInBackwardBackward
    +20.1 ms``, copied into a replay's pattern, was refused listing the names with the most compute time,
    the whole name among them but not said to be the one."""
    named = sorted(
        (n for n in time_by_name if backward_function(n) != n and op_matches(pattern, backward_function(n))),
        key=lambda n: -time_by_name[n],
    )
    if not named:
        return ""
    ops = f"backward op{'s' if len(named) > 1 else ''} {', '.join(repr(n) for n in named[:3])}"
    glob = "" if pattern.startswith("re:") else f": '*{pattern}' matches {'them' if len(named) > 1 else 'it'}"
    return (
        f"it names the {ops} as skewlens analyze's causes do, without the autograd engine's prefix, but a "
        f"pattern is matched against whole names{glob}; "
    )


def check_factor_fits(key: str, item: Slowdown, run: RunTrace, *, preset: Preset | None = None) -> None:
    """A ``compute`` or ``op`` item's factor times the longest compute op it scales stays on the simulator's
    clock, else a :class:`ConfigError` naming the key (a factor of 1e13 on a 2 ms op was an OverflowError
    traceback; 1e17 wrapped the replayed times around, silently)."""
    limit = MAX_SIM_NS / item.factor
    ranks = [r for r in (item.ranks or sorted(run.ranks)) if r in run.ranks]
    if all(not len(run.ranks[r]) or int(run.ranks[r].dur_ns.max()) <= limit for r in ranks):
        return  # no op at all is that long (the usual case: nothing else to look at)
    model = execution_model(run)
    for r in ranks:
        rt = run.ranks[r]
        rows = np.flatnonzero(compute_rows(rt, model.ranks[r]) & _on_device(rt, item.device))
        rows = rows[rt.dur_ns[rows] > limit]
        if item.kind == "op":
            rows = rows[[op_matches(item.pattern, rt.names[i]) for i in rt.name_idx[rows].tolist()]]
        if rows.size:
            i = int(rows[np.argmax(rt.dur_ns[rows])])
            dur = int(rt.dur_ns[i])
            raise ConfigError(
                f"{key}.factor: {item.factor:g} times rank {r}'s {rt.names[int(rt.name_idx[i])]} "
                f"({dur / 1e6:.3g} ms) is {item.factor * dur / 1e9:.3g} s, beyond {SIM_CLOCK}"
                f"{_preset_hint(preset, 'factor', item.factor)}"
            )


def _has_none(item: Slowdown, ranks: list[int], what: str) -> str:
    """``rank 3 has no X``, ``ranks 1, 2 have no X``, or for an item on every rank ``no rank has X``."""
    if not item.ranks:
        return f"no rank has {what}"
    return f"{ranks_label(ranks)} {'has' if len(ranks) == 1 else 'have'} no {what}"
