"""What ui.perfetto.dev would drop or misdraw in a Chrome trace JSON file (``python tests/perfetto_lint.py
FILE...``; :func:`lint` for the tests).

It models trace_processor's JSON importer (``importers/json``, ``sorter/trace_sorter.h``,
``common/slice_tracker.cc``, ``common/flow_tracker.cc``):

- events are sorted by ``ts``, then, at one ``ts``, ``X`` slices longest first, other phases after them,
  then file order; a negative ``ts`` is dropped;
- the ``X`` slices of one track (``pid``, ``tid``) must nest: one that starts inside another and ends after
  it is spilled onto an overflow track (older versions drop it); the slices of one ``ts`` that nest only by
  file order (a shorter one written first) nest the other way round in chrome://tracing and older Perfetto;
- a flow ``s`` / ``t`` (and an ``f`` with ``"bp": "e"``) binds to the slice on top of its track's stack
  when it is read, which is the enclosing slice only if one is open at its ``ts``: none is
  ``flow_no_enclosing_slice`` (the arrow is dropped), an ended one binds the arrow to the wrong slice;
- a track or process with events but no ``thread_name`` / ``process_name`` is drawn as ``Thread 7`` /
  ``Process 3``; a name given twice to one track keeps the last;
- a process without ``process_sort_index`` is ordered by the viewer's own rule (chrome://tracing: by name as
  text, ``rank 10`` before ``rank 2``).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FLOW = {"s", "t", "f"}


@dataclass
class Report:
    """Findings by kind, each a list of one-line examples (all counted, the first few kept)."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    events: int = 0

    def add(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < 3:
            self.examples[kind].append(text)

    def lines(self) -> list[str]:
        return [
            f"{kind}: {n} (e.g. {'; '.join(self.examples[kind])})" for kind, n in sorted(self.counts.items())
        ]


def _ns(v: Any) -> int | None:
    """µs (a JSON number) as integer ns, as the importer rounds them; None where not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return round(v * 1000)


def lint(path: str | Path) -> Report:
    """Read a trace file and report what Perfetto would drop or misdraw."""
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    rep = Report(events=len(events))
    proc_names: dict[int, list[str]] = defaultdict(list)
    sorted_procs: set[int] = set()
    thread_names: dict[tuple[int, int], list[str]] = defaultdict(list)
    procs: set[int] = set()
    # per track: (ts, key, file index, kind, payload)
    timeline: dict[tuple[int, int], list[tuple[int, float, int, str, Any]]] = defaultdict(list)
    for i, ev in enumerate(events):
        ph = ev.get("ph")
        pid, tid = ev.get("pid"), ev.get("tid")
        where = f"#{i} {ev.get('name')!r} pid {pid} tid {tid}"
        if ph == "M":
            name = ev.get("name")
            label = (ev.get("args") or {}).get("name")
            if name == "process_name":
                proc_names[pid].append(label)
            elif name == "process_sort_index":
                sorted_procs.add(pid)
            elif name == "thread_name":
                thread_names[(pid, tid)].append(label)
            continue
        ts = _ns(ev.get("ts"))
        if ts is None:
            rep.add("no ts", where)
            continue
        if ts < 0:
            rep.add("negative ts (dropped)", where)
            continue
        if ph == "X":
            dur = _ns(ev.get("dur"))
            if not isinstance(pid, int) or not isinstance(tid, int):
                rep.add("X without integer pid/tid", where)
                continue
            if dur is None or dur < 0:
                rep.add("X without a dur >= 0", where)
                continue
            procs.add(pid)
            timeline[(pid, tid)].append((ts, -dur, i, "X", (ts + dur, where)))
        elif ph in _FLOW:
            if not isinstance(pid, int) or not isinstance(tid, int):
                rep.add("flow without integer pid/tid", where)
                continue
            key = (ev.get("id"), ev.get("cat"), ev.get("name"))
            bind = ph != "f" or ev.get("bp") == "e"
            timeline[(pid, tid)].append((ts, math.inf, i, ph, (key, bind, where)))
        elif ph in ("i", "I"):
            scope = ev.get("s", "t")
            if scope not in ("g", "p", "t"):
                rep.add("instant of unknown scope", where)
            elif scope == "t" and not isinstance(tid, int):
                rep.add("thread instant without tid", where)
    flows: dict[Any, list[tuple[str, int, str]]] = defaultdict(list)
    for items in timeline.values():
        items.sort(key=lambda t: (t[0], t[1], t[2]))
        stack: list[tuple[int, int, str]] = []  # (start, end, where) of the slices open
        last_x: dict[int, tuple[int, int]] = {}  # ts -> (dur, file index) of the last X read at it
        for ts, key, i, kind, payload in items:
            if kind == "X":
                end, where = payload
                while stack and stack[-1][1] <= ts and not (stack[-1][1] == ts == end == stack[-1][0]):
                    stack.pop()
                if stack and end > stack[-1][1]:
                    rep.add(
                        "X partly overlapping its parent (spilled or dropped)",
                        f"{where} [{ts}, {end}] ns in {stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}] ns",
                    )
                    continue
                prev = last_x.get(ts)
                if prev is not None and prev[1] > i and prev[0] > -key:
                    rep.add("nesting at one ts only by Perfetto's sort (file order reversed)", where)
                last_x[ts] = (-int(key), i)
                stack.append((ts, end, where))
            else:
                fkey, bind, where = payload
                if not bind:
                    flows[fkey].append((kind, ts, "pending"))
                    continue
                if not stack:
                    rep.add("flow endpoint with no slice on its track (dropped)", where)
                    continue
                top = stack[-1]
                if top[1] < ts or (top[1] == ts and top[0] < ts):
                    rep.add("flow endpoint bound to a slice that ended before it", f"{where} -> {top[2]}")
                flows[fkey].append((kind, ts, top[2]))
    for fkey, ends in flows.items():
        kinds = [k for k, _, _ in ends]
        if kinds.count("s") != 1 or kinds.count("f") != 1:
            rep.add("flow id without exactly one s and one f", f"{fkey}: {kinds}")
    for pid in sorted(procs):
        if not proc_names.get(pid):
            rep.add("process without process_name", f"pid {pid}")
        elif pid not in sorted_procs:
            rep.add("process without process_sort_index", f"pid {pid}")
    for (pid, tid), _ in sorted(timeline.items()):
        if any(k == "X" for _, _, _, k, _ in timeline[(pid, tid)]) and not thread_names.get((pid, tid)):
            rep.add("track without thread_name", f"pid {pid} tid {tid}")
    for (pid, tid), names in thread_names.items():
        if len(set(names)) > 1:
            rep.add("track named twice", f"pid {pid} tid {tid}: {names}")
        if (pid, tid) not in timeline:
            rep.add("named track with no events", f"pid {pid} tid {tid}: {names}")
    return rep


def main(argv: list[str]) -> int:
    bad = 0
    for p in argv:
        rep = lint(p)
        print(f"{p}: {rep.events} events")
        for line in rep.lines():
            print("  " + line)
        bad += bool(rep.counts)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
