"""Critical path of each step across ranks, through compute, stream order, collectives and p2p.

Walk back from the step's last finishing node (over all ranks):

- at a collective, if the member whose arrival this one waited for (the last to arrive; of a rooted
  collective with a known root what the execution model's ``waits_for`` says: a broadcast's or scatter's
  root, no one for a gather's or reduce's non-root) arrived later, the path goes through that member: this
  node contributes only its transfer (``end - that arrival``), that member's node is put on the path with
  no duration (it marks the jump) and the walk continues from its dependencies;
- at a recv whose send started later than the recv, likewise through the send (``via="p2p"``), and at a
  send whose recv was posted later, through the recv, unless the execution model made the send eager
  (done before its recv arrived: it waited for nobody); a member, send or recv that arrived after this
  node ended (an asynchronous collective's node, which ends at its launch) is not what it waited for,
  and the walk does not jump to it;
- at a collective whose transfer waited for the one queued before it on its stream (the execution model's
  queue edge: gloo's worker threads) past the last arrival, through that one, on this rank;
- otherwise through the latest-finishing of what the node waits for in the execution model
  (``skewlens.replay.execution``: program and stream order, data, the communication a wait node blocked
  on; a nested node, through its enclosing node; GPU work, through the host node that launched it, which
  is on the path only up to the launch call, and then through what held that node's arrival, not what it
  waited for after its launches: ``.item()`` waits for the copy it launched; or, for a launch between two
  of its waits, through the latest wait that ended before the launch: ``aten::index`` waits for one copy,
  launches the next, waits for that).

A node is on the path only up to when the node that waited for it needed it (never later than that node's
start on the path), so the walk never goes forward in time. The walk stops at a node without dependencies
or when the next node belongs to another step. Each path node records its ``contribution_ns`` (time it
accounts for) and ``gap_before_ns`` (idle on the path before it, on the node's own rank), so per step the
contributions plus gaps add up to the span from the first path node's start to the last node's end.
:func:`shares` sums them per rank and per op.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from skewlens.analysis.index import RunIndex
from skewlens.analysis.records import CriticalPathRecord
from skewlens.profiler.vocab import NodeType
from skewlens.replay.execution import awaited_member, eager_sends, execution_model

#: Path-record ``kind`` of each node type (``other`` for the rest).
KIND_NAMES = {
    int(NodeType.COMP): "compute",
    int(NodeType.COMM_COLL): "collective",
    int(NodeType.COMM_SEND): "send",
    int(NodeType.COMM_RECV): "recv",
}


def _last_nodes(ix: RunIndex) -> dict[int, tuple[int, int]]:
    """Step -> (rank, row) of the latest-ending node of that step over all ranks, not the lowest rank's of
    nodes ending at once, so that the path does not depend on what the ranks are called: of communication
    (and wait nodes, which end with it) ending at once, the one that started last (the members of a
    collective all end at its completion: the last to arrive, from which the walk goes on), before compute;
    of compute ending at once, the one that started first (the longer: of rank 0's 10 ms operator and
    rank 1's 4 ms one ending with it, rank 0's)."""
    best: dict[int, tuple[int, int, int, int, int]] = {}
    for r, ri in sorted(ix.ranks.items()):
        rt = ri.trace
        keep = np.flatnonzero(rt.node_type != int(NodeType.METADATA))
        if keep.size == 0:
            continue
        st = rt.step[keep].astype(np.int64)
        comm = (~ri.is_comp[keep]).astype(np.int64)  # all but the program's compute: waits end with comms
        start = rt.start_ns[keep].astype(np.int64)
        tie = np.where(comm == 1, start, -start)
        o = np.lexsort((tie, comm, ri.end_ns[keep], st))
        st_sorted = st[o]
        last = np.flatnonzero(np.append(st_sorted[1:] != st_sorted[:-1], True))
        for j in last.tolist():
            row = int(keep[o[j]])
            s = int(st_sorted[j])
            key = (int(ri.end_ns[row]), int(comm[o[j]]), int(tie[o[j]]))
            if s not in best or key > best[s][:3]:
                best[s] = (*key, r, row)
    steps = {s: (r, row) for s, (_e, _c, _t, r, row) in best.items()}
    if len(steps) > 1:
        steps.pop(-1, None)  # nodes outside any step are not a step of their own
    return steps


def _queued_behind(ix: RunIndex) -> dict[int, dict[int, int]]:
    """Per rank: each communication row with queue edges in the execution model -> the latest-ending of
    their sources (its transfer waits for them: the collective before it on its stream)."""
    out: dict[int, dict[int, int]] = {}
    for r, m in execution_model(ix.run).ranks.items():
        end = ix.ranks[r].end_ns
        o = np.lexsort((m.queue_src, end[m.queue_src], m.queue_dst))  # last per dependant: the latest
        src, dst = m.queue_src[o], m.queue_dst[o]
        last = np.append(dst[1:] != dst[:-1], True) if dst.size else dst.astype(np.bool_)
        out[r] = dict(zip(dst[last].tolist(), src[last].tolist(), strict=True))
    return out


def _walk(
    ix: RunIndex, step: int, rank: int, row: int, *, eager: set[int], queue: dict[int, dict[int, int]]
) -> list[CriticalPathRecord]:
    run = ix.run
    # (rank, row, eff_start, eff_end, via)
    path: list[tuple[int, int, int, int, str]] = []
    budget = sum(len(ri.trace) for ri in ix.ranks.values()) + 1
    r, w = rank, row
    cap: int | None = None  # when the node after this one on the path needed it (a launch: the call)
    while budget > 0:
        budget -= 1
        ri = ix.ranks[r]
        start, end = int(ri.trace.start_ns[w]), int(ri.end_ns[w])
        if cap is not None:  # never later than when the path entry after it needed it: no time twice
            end = min(end, cap)
            start = min(start, end)
        nxt_r, nxt_w = r, int(ri.latest_dep[w])
        nxt_cap = int(ri.latest_met_ns[w])
        if cap is not None and nxt_cap > cap and w in ri.arrival_dep:
            # needed for a launch before it waited (``.item()``'s copy): what held its arrival, or for one
            # between two of its waits, the latest wait that ended by then (``aten::index``'s first copy)
            nxt_w, nxt_cap = ri.arrival_dep[w]
            for s, t in ri.part_waits.get(w, ()):
                if nxt_cap <= t <= cap:
                    nxt_w, nxt_cap = s, t
        if nxt_w >= 0:
            start = min(max(start, nxt_cap), end)  # a wait: on the path from what it waited for
        k = int(ri.coll[w])
        p = int(ri.p2p[w])
        peer: tuple[int, int, int, str] | None = None  # the member or peer this node waited for, last
        if k >= 0:
            c = run.collectives[k]
            arr = [int(run.ranks[m].start_ns[x]) for m, x in zip(c.ranks, c.rows, strict=True)]
            # the member whose arrival this one's transfer waited for (the model's rule): the last, a
            # rooted collective's root, or none (itself: it arrived at its own start, not after it)
            me = c.ranks.index(r)
            j = awaited_member(execution_model(run).rule(k, len(c.ranks)), arr, me)
            if (
                j != me and start < arr[j] <= end
            ):  # a member that arrived after this node ended is not what it waited for
                peer = (c.ranks[j], c.rows[j], arr[j], "collective")
        elif p >= 0:
            pair = run.p2p[p]
            # a recv waits for its send; a send that did not complete eagerly, for its recv
            recv = int(ri.trace.node_type[w]) == int(NodeType.COMM_RECV)
            pr, pw = (pair.src_rank, pair.src_row) if recv else (pair.dst_rank, pair.dst_row)
            s_start = int(run.ranks[pr].start_ns[pw])
            if (recv or p not in eager) and start < s_start <= end:
                peer = (pr, pw, s_start, "p2p")
        q = queue[r].get(w, -1) if k >= 0 or p >= 0 else -1
        if q >= 0 and max(start, peer[2] if peer else start) < int(ri.end_ns[q]) <= end:
            # its transfer waited for the communication queued before it on its stream, which ended last
            qe = int(ri.end_ns[q])
            path.append((r, w, qe, end, "dep"))
            nxt_r, nxt_w, nxt_cap = r, q, qe
            start = -1
        elif peer is not None:
            pr, pw, at, via = peer
            path.append((r, w, at, end, via))
            path.append((pr, pw, at, at, "dep"))
            nxt_r, nxt_w = pr, int(ix.ranks[pr].latest_dep[pw])
            nxt_cap = min(int(ix.ranks[pr].latest_met_ns[pw]), at)
            start = -1
        if start >= 0:
            path.append((r, w, start, end, "dep"))
            nxt_cap = min(nxt_cap, start)
        if nxt_w < 0:
            break
        nstep = int(ix.ranks[nxt_r].trace.step[nxt_w])
        if step >= 0 and nstep != step:
            break
        r, w, cap = nxt_r, nxt_w, nxt_cap
    out = []
    for i, (pr, pw, es, ee, via) in enumerate(path):
        rt = ix.ranks[pr].trace
        gap = max(es - path[i + 1][3], 0) if i + 1 < len(path) else 0
        out.append(
            CriticalPathRecord(
                step=step,
                position=i,
                rank=pr,
                node_id=int(rt.node_id[pw]),
                name=rt.name(pw),
                kind="idle"
                if ix.ranks[pr].is_untraced[pw]
                else KIND_NAMES.get(int(rt.node_type[pw]), "other"),
                start_ns=int(rt.start_ns[pw]),
                end_ns=int(ix.ranks[pr].end_ns[pw]),
                contribution_ns=max(ee - es, 0),
                gap_before_ns=gap,
                via=via if i + 1 < len(path) else "end",
            )
        )
    return out


def analyze_critical_path(ix: RunIndex) -> list[CriticalPathRecord]:
    """Critical path records of every step, by step then position (last node first)."""
    eager = {g.index for g in eager_sends(ix.run)}
    queue = _queued_behind(ix)
    out: list[CriticalPathRecord] = []
    for step, (r, row) in sorted(_last_nodes(ix).items()):
        out.extend(_walk(ix, step, r, row, eager=eager, queue=queue))
    return out


#: :func:`shares`' name for the time on the path before a host node it does not spend in its dependencies.
HOST_GAP = "(host gap)"
#: :func:`shares`' name for the time on the path a GPU node waited beyond its launch and its known
#: dependencies (a wait the trace does not show: an event wait without CUDA sync events, another process).
DEVICE_GAP = "(device gap)"


def shares(
    records: list[CriticalPathRecord], ix: RunIndex | None = None
) -> tuple[dict[int, dict[int, int]], dict[int, dict[str, int]]]:
    """Per step: time on the path per rank (contributions + gaps on that rank) and per op name, the gaps as
    :data:`HOST_GAP` (or, given the run's index, :data:`DEVICE_GAP` before GPU nodes)."""
    by_rank: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    by_op: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    device: dict[int, set[int]] = {}
    if ix is not None:
        for r in {rec.rank for rec in records if rec.gap_before_ns}:
            rt = ix.ranks[r].trace
            device[r] = set(rt.node_id[~rt.is_cpu].tolist())
    for rec in records:
        by_rank[rec.step][rec.rank] += rec.contribution_ns + rec.gap_before_ns
        by_op[rec.step][rec.name] += rec.contribution_ns
        if rec.gap_before_ns:
            gap = DEVICE_GAP if rec.node_id in device.get(rec.rank, ()) else HOST_GAP
            by_op[rec.step][gap] += rec.gap_before_ns
    return ({s: dict(v) for s, v in by_rank.items()}, {s: dict(v) for s, v in by_op.items()})
