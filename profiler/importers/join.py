"""Join host-trace operators to Kineto ``cpu_op`` events, for data dependencies from tensor ids.

Newer Kineto traces give each ``cpu_op`` its ``Record function id``, the host trace's ``rf_id``: the
join is by that id (and equal names). Older ones carry no such id, so the join is by order: the
observer's threads are paired with Kineto threads by the overlap of their operator names, then each
pair of sequences (host ops in id order, Kineto ops in start order) is aligned greedily by name. Where
the names disagree the shorter skip (looking ahead at most :data:`LOOK_AHEAD` ops on either side)
resynchronises them; the host trace also holds user annotations that Kineto files separately, which
are skipped this way. Linear time; ops that do not align stay unjoined (they get no data dependencies).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from skewlens.profiler.importers.host_et import HostOp
from skewlens.profiler.importers.kineto import KEvent

#: How far ahead the alignment looks for the other side's current name.
LOOK_AHEAD = 64


def _align(host: Sequence[HostOp], kin: Sequence[KEvent]) -> dict[int, HostOp]:
    out: dict[int, HostOp] = {}
    i = j = 0
    while i < len(host) and j < len(kin):
        if host[i].name == kin[j].name:
            out[kin[j].index] = host[i]
            i += 1
            j += 1
            continue
        di = next(
            (d for d in range(1, LOOK_AHEAD) if i + d < len(host) and host[i + d].name == kin[j].name), None
        )
        dj = next(
            (d for d in range(1, LOOK_AHEAD) if j + d < len(kin) and kin[j + d].name == host[i].name), None
        )
        if di is not None and (dj is None or di <= dj):
            i += di
        elif dj is not None:
            j += dj
        else:
            i += 1
            j += 1
    return out


def join_ops(host_ops: Sequence[HostOp], cpu_ops: Sequence[KEvent]) -> dict[int, HostOp]:
    """Map Kineto ``cpu_op`` event index -> the host op it is (by record-function id where both have it)."""
    by_rf = {h.rf_id: h for h in host_ops if h.rf_id is not None}
    if any(e.rf_id is not None for e in cpu_ops) and by_rf:
        return {
            e.index: h
            for e in cpu_ops
            if e.rf_id is not None and (h := by_rf.get(e.rf_id)) is not None and h.name == e.name
        }
    return _join_by_order(host_ops, cpu_ops)


def _join_by_order(host_ops: Sequence[HostOp], cpu_ops: Sequence[KEvent]) -> dict[int, HostOp]:
    h_by: dict[int, list[HostOp]] = defaultdict(list)
    for h in host_ops:
        h_by[h.tid].append(h)
    k_by: dict[int, list[KEvent]] = defaultdict(list)
    for e in sorted(cpu_ops, key=lambda e: (e.start_ns, -e.dur_ns, e.index)):
        k_by[e.tid].append(e)
    h_names = {t: Counter(h.name for h in hs) for t, hs in h_by.items()}
    k_names = {t: Counter(e.name for e in es) for t, es in k_by.items()}
    scores = sorted(
        ((sum((hn & kn).values()), ht, kt) for ht, hn in h_names.items() for kt, kn in k_names.items()),
        reverse=True,
    )
    out: dict[int, HostOp] = {}
    used_h: set[int] = set()
    used_k: set[int] = set()
    for score, ht, kt in scores:
        if score == 0 or ht in used_h or kt in used_k:
            continue
        used_h.add(ht)
        used_k.add(kt)
        out.update(_align(h_by[ht], k_by[kt]))
    return out
