"""Load a run directory into a :class:`RunTrace` and match communication across ranks.

This is the straightforward loader (one protobuf decode per node); see ``profiler.store`` for the
faster columnar paths built on top of it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from profiler.chakra_io import attr_value, iter_nodes
from profiler.errors import ValidationError
from profiler.manifest import Manifest, ProcessGroupInfo, rank_file, read_manifest
from profiler.store.model import DEP_CTRL, DEP_DATA, CollectiveInstance, P2PPair, RankTrace, RunTrace
from profiler.vocab import PG_INIT_NODE_NAME, Attr, CommType, NodeType


class _Columns:
    def __init__(self) -> None:
        self.node_id: list[int] = []
        self.node_type: list[int] = []
        self.name_idx: list[int] = []
        self.start_ns: list[int] = []
        self.dur_ns: list[int] = []
        self.stream: list[int] = []
        self.step: list[int] = []
        self.comm_type: list[int] = []
        self.comm_bytes: list[int] = []
        self.pg: list[int] = []
        self.seq: list[int] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.tag: list[int] = []
        self.is_cpu: list[bool] = []
        self.deps: list[tuple[int, int]] = []  # (node_id, kind) per dep, grouped per row via dep_count
        self.dep_count: list[int] = []


def load_rank(
    path: str | Path, rank: int, pg_names: list[str], pg_found: dict[str, ProcessGroupInfo] | None = None
) -> RankTrace:
    """Decode one rank's ``.et`` into columns. ``pg_names`` is extended with groups first seen here."""
    p = Path(path)
    c = _Columns()
    names: list[str] = []
    name_ix: dict[str, int] = {}
    pg_ix = {n: i for i, n in enumerate(pg_names)}
    for _offset, node in iter_nodes(p):
        if node.type == NodeType.METADATA and node.name == PG_INIT_NODE_NAME and pg_found is not None:
            pg_found.update(parse_pg_init(node.inputs.values, p))
        attrs: dict[str, Any] = {a.name: attr_value(a) for a in node.attr}
        c.node_id.append(node.id)
        c.node_type.append(node.type)
        ni = name_ix.get(node.name)
        if ni is None:
            ni = name_ix[node.name] = len(names)
            names.append(node.name)
        c.name_idx.append(ni)
        start = attrs.get(Attr.START_NS)
        dur = attrs.get(Attr.DUR_NS)
        c.start_ns.append(int(start) if start is not None else node.start_time_micros * 1000)
        c.dur_ns.append(int(dur) if dur is not None else node.duration_micros * 1000)
        c.stream.append(int(attrs.get(Attr.STREAM, 0)))
        c.step.append(int(attrs.get(Attr.STEP, -1)))
        is_comm_coll = node.type == NodeType.COMM_COLL
        c.comm_type.append(int(attrs.get(Attr.COMM_TYPE, -1)) if is_comm_coll else -1)
        c.comm_bytes.append(int(attrs.get(Attr.COMM_SIZE, 0)))
        pg_name = attrs.get(Attr.PG_NAME)
        if pg_name is None:
            c.pg.append(-1)
        else:
            gi = pg_ix.get(pg_name)
            if gi is None:
                gi = pg_ix[pg_name] = len(pg_names)
                pg_names.append(pg_name)
            c.pg.append(gi)
        c.seq.append(int(attrs.get(Attr.SEQ, -1)))
        c.src.append(int(attrs.get(Attr.COMM_SRC, -1)))
        c.dst.append(int(attrs.get(Attr.COMM_DST, -1)))
        c.tag.append(int(attrs.get(Attr.COMM_TAG, 0)))
        c.is_cpu.append(bool(attrs.get(Attr.IS_CPU_OP, True)))
        c.deps.extend((d, DEP_CTRL) for d in node.ctrl_deps)
        c.deps.extend((d, DEP_DATA) for d in node.data_deps)
        c.dep_count.append(len(node.ctrl_deps) + len(node.data_deps))
    row_of = {nid: i for i, nid in enumerate(c.node_id)}
    if len(row_of) != len(c.node_id):
        seen: set[int] = set()
        dup = next(n for n in c.node_id if n in seen or seen.add(n))  # type: ignore[func-returns-value]
        raise ValidationError(f"{p}: rank {rank}: duplicate node id {dup}")
    dep_idx = np.empty(len(c.deps), dtype=np.int64)
    for k, (d, _kind) in enumerate(c.deps):
        r = row_of.get(d)
        if r is None:
            owner = int(np.searchsorted(np.cumsum(c.dep_count), k, side="right"))
            raise ValidationError(
                f"{p}: rank {rank}: node {c.node_id[owner]} ({names[c.name_idx[owner]]}) depends on "
                f"node {d}, which does not exist (dangling dependency)"
            )
        dep_idx[k] = r
    dep_ptr = np.zeros(len(c.node_id) + 1, dtype=np.int64)
    np.cumsum(np.asarray(c.dep_count, dtype=np.int64), out=dep_ptr[1:])
    return RankTrace(
        rank=rank,
        path=str(p),
        node_id=np.asarray(c.node_id, dtype=np.int64),
        node_type=np.asarray(c.node_type, dtype=np.int8),
        name_idx=np.asarray(c.name_idx, dtype=np.int32),
        names=names,
        start_ns=np.asarray(c.start_ns, dtype=np.int64),
        dur_ns=np.asarray(c.dur_ns, dtype=np.int64),
        stream=np.asarray(c.stream, dtype=np.int64),
        step=np.asarray(c.step, dtype=np.int32),
        comm_type=np.asarray(c.comm_type, dtype=np.int8),
        comm_bytes=np.asarray(c.comm_bytes, dtype=np.int64),
        pg=np.asarray(c.pg, dtype=np.int32),
        seq=np.asarray(c.seq, dtype=np.int64),
        src=np.asarray(c.src, dtype=np.int32),
        dst=np.asarray(c.dst, dtype=np.int32),
        tag=np.asarray(c.tag, dtype=np.int64),
        is_cpu=np.asarray(c.is_cpu, dtype=np.bool_),
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        dep_kind=np.asarray([k for _d, k in c.deps], dtype=np.int8),
    )


def parse_pg_init(values: str, path: Path) -> dict[str, ProcessGroupInfo]:
    """Process groups from a ``## process_group:init ##`` metadata node (PyTorch's JSON list form)."""
    try:
        data = json.loads(values) if values else []
        if isinstance(data, list) and len(data) == 1 and isinstance(data[0], str):
            data = json.loads(data[0])  # PyTorch host ETs wrap the JSON string in a list
        out: dict[str, ProcessGroupInfo] = {}
        for g in data:
            name = str(g["pg_name"])
            out[name] = ProcessGroupInfo(
                name=name,
                ranks=tuple(int(r) for r in g["ranks"]),
                desc=str(g.get("pg_desc", "")),
                backend=str(g.get("backend_config", "")),
            )
        return out
    except (ValueError, KeyError, TypeError) as e:
        raise ValidationError(
            f"{path}: malformed process-group metadata node ({type(e).__name__}: {e})"
        ) from None


def match_collectives(run: RunTrace) -> list[CollectiveInstance]:
    """Group COMM_COLL nodes by (group, seq); check that every member has the instance and agrees."""
    by_key: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for rank, rt in sorted(run.ranks.items()):
        rows = np.flatnonzero(rt.node_type == NodeType.COMM_COLL)
        for r in rows.tolist():
            if rt.seq[r] < 0 or rt.pg[r] < 0:
                raise ValidationError(
                    f"{rt.path}: rank {rank}: collective node {rt.node_id[r]} ({rt.name(r)}) has no "
                    f"process group / sequence number ({Attr.PG_NAME}, {Attr.SEQ})"
                )
            by_key[(int(rt.pg[r]), int(rt.seq[r]))].append((rank, r))
    out = []
    for (gi, seq), members in sorted(by_key.items()):
        name = run.pg_names[gi]
        members.sort()
        types = {run.ranks[rk].comm_type[r] for rk, r in members}
        if len(types) > 1:
            detail = ", ".join(
                f"rank {rk}: {CommType(int(run.ranks[rk].comm_type[r])).name}" for rk, r in members
            )
            raise ValidationError(f"collective mismatch in group {name!r} seq {seq}: types differ ({detail})")
        out.append(
            CollectiveInstance(
                pg_name=name,
                seq=seq,
                comm_type=CommType(int(types.pop())),
                ranks=tuple(rk for rk, _ in members),
                rows=tuple(r for _, r in members),
                comm_bytes=tuple(int(run.ranks[rk].comm_bytes[r]) for rk, r in members),
            )
        )
    return out


def match_p2p(run: RunTrace) -> list[P2PPair]:
    """Pair the k-th send a->b (per group and tag) with the k-th recv on b from a."""
    sends: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    for rank, rt in sorted(run.ranks.items()):
        for r in np.flatnonzero(rt.node_type == NodeType.COMM_SEND).tolist():
            sends[(rank, int(rt.dst[r]), int(rt.pg[r]), int(rt.tag[r]))].append(r)
        for r in np.flatnonzero(rt.node_type == NodeType.COMM_RECV).tolist():
            recvs[(int(rt.src[r]), rank, int(rt.pg[r]), int(rt.tag[r]))].append(r)
    pairs = []
    for key in sorted(set(sends) | set(recvs)):
        s, rv = sends.get(key, []), recvs.get(key, [])
        src, dst, gi, tag = key
        if len(s) != len(rv):
            raise ValidationError(
                f"p2p mismatch: rank {src} sends {len(s)} message(s) to rank {dst} (tag {tag}) but rank "
                f"{dst} posts {len(rv)} recv(s) from rank {src}"
            )
        for a, b in zip(s, rv, strict=True):
            pairs.append(
                P2PPair(
                    src_rank=src,
                    src_row=a,
                    dst_rank=dst,
                    dst_row=b,
                    comm_bytes=int(run.ranks[src].comm_bytes[a]),
                    tag=tag,
                    pg_name=run.pg_names[gi] if gi >= 0 else "",
                )
            )
    return pairs


def load_run(run_dir: str | Path, *, match: bool = True) -> RunTrace:
    """Load ``RUN_DIR`` (manifest + ``rank-<r>.et``) into a RunTrace and match its communication."""
    d = Path(run_dir)
    manifest: Manifest = read_manifest(d)
    pg_names: list[str] = [g.name for g in manifest.process_groups]
    pg_found: dict[str, ProcessGroupInfo] = {}
    ranks = {r: load_rank(rank_file(d, r), r, pg_names, pg_found) for r in manifest.ranks}
    groups = {**pg_found, **{g.name: g for g in manifest.process_groups}}
    run = RunTrace(run_dir=str(d), manifest=manifest, ranks=ranks, pg_names=pg_names, process_groups=groups)
    if match:
        run.collectives = match_collectives(run)
        run.p2p = match_p2p(run)
    return run
