"""Build small synthetic multi-rank runs (tests, benchmarks, examples) and write them as run directories.

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        rb.compute("aten::mm", dur_ns=1_000_000)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=200_000)
    b.write(tmp_path / "run")

Each rank appends nodes to a stream in program order; a node starts when the previous node on its
stream ended unless ``start_ns`` is given. Sequence numbers are assigned per (group, rank) in call
order, so the n-th collective a rank issues on a group is instance n of that group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from skewlens.profiler.chakra_io import AttrValue, TraceNode, as_comm_node, pg_init_node, write_et
from skewlens.profiler.manifest import Manifest, ProcessGroupInfo, StepSpan, rank_file, write_manifest
from skewlens.profiler.vocab import Attr, CommType, NodeType, dtype_bytes

DEFAULT_PG = "0"


@dataclass
class RankBuilder:
    """Appends nodes to one rank's trace."""

    rank: int
    groups: dict[str, tuple[int, ...]]
    nodes: list[TraceNode] = field(default_factory=list)
    _next_id: int = 1
    _stream_last: dict[int, tuple[int, int]] = field(default_factory=dict)  # stream -> (node id, end ns)
    _seq: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    step_index: int = -1

    def step(self, index: int) -> RankBuilder:
        """Nodes added from now on belong to training step ``index``."""
        self.step_index = index
        return self

    def _add(
        self,
        name: str,
        node_type: NodeType,
        *,
        dur_ns: int,
        start_ns: int | None,
        stream: int,
        deps: tuple[int, ...],
        attrs: dict[str, AttrValue],
    ) -> int:
        prev = self._stream_last.get(stream)
        start = start_ns if start_ns is not None else (prev[1] if prev else 0)
        nid = self._next_id
        self._next_id += 1
        ctrl = ((prev[0],) if prev else ()) + tuple(d for d in deps if prev is None or d != prev[0])
        all_attrs: dict[str, AttrValue] = {Attr.STREAM: stream, Attr.IS_CPU_OP: True}
        if self.step_index >= 0:
            all_attrs[Attr.STEP] = self.step_index
        all_attrs.update(attrs)
        if node_type in (NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV):
            as_comm_node(all_attrs)
        self.nodes.append(
            TraceNode(
                node_id=nid,
                name=name,
                node_type=node_type,
                start_ns=start,
                dur_ns=dur_ns,
                ctrl_deps=ctrl,
                attrs=all_attrs,
            )
        )
        self._stream_last[stream] = (nid, start + dur_ns)
        return nid

    def compute(
        self,
        name: str,
        dur_ns: int,
        *,
        start_ns: int | None = None,
        stream: int = 0,
        deps: tuple[int, ...] = (),
        launch_ns: int | None = None,
        launched_in: int | None = None,
    ) -> int:
        """Add a COMP node; returns its id. With ``launch_ns``, a GPU kernel on CUDA stream ``stream``
        launched by a call at that time (its launching host op among ``deps``). ``launched_in``: instead, the
        host op (added before) that launched it and then synchronised on it (``.item()``'s copy), as a
        capture writes it: ``skl_launched_in`` names that op, which gets a ctrl dep on this node."""
        gpu: dict[str, AttrValue] = (
            {Attr.IS_CPU_OP: False, Attr.LAUNCH_NS: launch_ns} if launch_ns is not None else {}
        )
        if launched_in is not None:
            gpu[Attr.LAUNCHED_IN] = launched_in
        nid = self._add(
            name, NodeType.COMP, dur_ns=dur_ns, start_ns=start_ns, stream=stream, deps=deps, attrs=gpu
        )
        if launched_in is not None:
            k = next(k for k, n in enumerate(self.nodes) if n.node_id == launched_in)
            self.nodes[k] = replace(self.nodes[k], ctrl_deps=(*self.nodes[k].ctrl_deps, nid))
        return nid

    def collective(
        self,
        comm_type: CommType,
        comm_bytes: int,
        dur_ns: int,
        *,
        pg: str = DEFAULT_PG,
        start_ns: int | None = None,
        stream: int = 0,
        deps: tuple[int, ...] = (),
        name: str | None = None,
        seq: int | None = None,
        root: int | None = None,
        peer_bytes: tuple[int, int] | None = None,
        peer_splits: tuple[Sequence[int], Sequence[int]] | None = None,
        reduce_op: str | None = None,
        dtype: str = "float32",
    ) -> int:
        """Add a COMM_COLL node on group ``pg``; its sequence number is the next one of that group.
        ``root``: a rooted collective's root, as the capture records it (broadcast / scatter: ``comm_src``;
        reduce / gather: ``comm_dst``). ``peer_bytes``: an all_to_all's uneven splits as the capture records
        them, (bytes sent to the other members, bytes received from them); ``peer_splits``: (bytes sent to
        each member, bytes received from each), in group-rank order. ``reduce_op``: its ``skl_reduce_op``
        (none by default, as in a trace written before it). ``dtype``: its ``skl_dtype``, which its
        ``skl_numel`` counts in (``comm_bytes`` are its bytes)."""
        if seq is None:
            seq = self._seq[pg]
        self._seq[pg] = seq + 1
        attrs: dict[str, AttrValue] = {
            Attr.COMM_TYPE: int(comm_type),
            Attr.COMM_SIZE: comm_bytes,
            Attr.PG_NAME: pg,
            Attr.SEQ: seq,
            Attr.DTYPE: dtype,
            Attr.NUMEL: comm_bytes // (dtype_bytes(dtype) or 1),
        }
        if peer_bytes is not None:
            attrs[Attr.SEND_BYTES], attrs[Attr.RECV_BYTES] = peer_bytes
        if peer_splits is not None:
            attrs[Attr.SEND_SPLITS], attrs[Attr.RECV_SPLITS] = list(peer_splits[0]), list(peer_splits[1])
        if reduce_op is not None:
            attrs[Attr.REDUCE_OP] = reduce_op
        if root is not None:
            sends = comm_type in (CommType.BROADCAST, CommType.SCATTER)
            attrs[Attr.COMM_SRC if sends else Attr.COMM_DST] = root
        return self._add(
            name or f"c10d::{comm_type.name.lower()}_",
            NodeType.COMM_COLL,
            dur_ns=dur_ns,
            start_ns=start_ns,
            stream=stream,
            deps=deps,
            attrs=attrs,
        )

    def send(
        self,
        dst: int,
        comm_bytes: int,
        dur_ns: int,
        *,
        tag: int = 0,
        pg: str = DEFAULT_PG,
        start_ns: int | None = None,
        stream: int = 0,
        deps: tuple[int, ...] = (),
        batch: int = -1,
        return_ns: int | None = None,
    ) -> int:
        """Add a COMM_SEND node to global rank ``dst``. ``return_ns``: when its call returned
        (``skl_return_ns``, an asynchronous send's; none by default, as in a trace written before it)."""
        return self._add(
            "c10d::send",
            NodeType.COMM_SEND,
            dur_ns=dur_ns,
            start_ns=start_ns,
            stream=stream,
            deps=deps,
            attrs={
                Attr.COMM_SRC: self.rank,
                Attr.COMM_DST: dst,
                Attr.COMM_TAG: tag,
                Attr.COMM_SIZE: comm_bytes,
                Attr.PG_NAME: pg,
                **({Attr.BATCH: batch} if batch >= 0 else {}),
                **({Attr.RETURN_NS: return_ns} if return_ns is not None else {}),
            },
        )

    def recv(
        self,
        src: int,
        comm_bytes: int,
        dur_ns: int,
        *,
        tag: int = 0,
        pg: str = DEFAULT_PG,
        start_ns: int | None = None,
        stream: int = 0,
        deps: tuple[int, ...] = (),
        batch: int = -1,
        return_ns: int | None = None,
    ) -> int:
        """Add a COMM_RECV node from global rank ``src``. ``return_ns``: as :meth:`send`'s."""
        return self._add(
            "c10d::recv_",
            NodeType.COMM_RECV,
            dur_ns=dur_ns,
            start_ns=start_ns,
            stream=stream,
            deps=deps,
            attrs={
                Attr.COMM_SRC: src,
                Attr.COMM_DST: self.rank,
                Attr.COMM_TAG: tag,
                Attr.COMM_SIZE: comm_bytes,
                Attr.PG_NAME: pg,
                **({Attr.BATCH: batch} if batch >= 0 else {}),
                **({Attr.RETURN_NS: return_ns} if return_ns is not None else {}),
            },
        )


class RunBuilder:
    """A synthetic multi-rank run; ``groups`` maps group name to global ranks (default: one world group).
    ``first_node_id``: each rank's first node's id (the process-group node is 0): past 1, ids are not the
    rows' numbers, as in a converter's trace. ``descs``: a group's description (``mesh_dp``; default: its
    name, the world group's ``default_pg``)."""

    def __init__(
        self,
        world_size: int,
        groups: dict[str, tuple[int, ...]] | None = None,
        *,
        first_node_id: int = 1,
        descs: dict[str, str] | None = None,
    ) -> None:
        self.world_size = world_size
        self.groups = dict(groups or {DEFAULT_PG: tuple(range(world_size))})
        self.descs = dict(descs or {})
        self.ranks: dict[int, RankBuilder] = {}
        self.first_node_id = first_node_id

    def rank(self, r: int) -> RankBuilder:
        if r not in self.ranks:
            self.ranks[r] = RankBuilder(rank=r, groups=self.groups, _next_id=self.first_node_id)
        return self.ranks[r]

    def write(self, run_dir: str | Path, *, level: str = "collectives", source: str = "synthetic") -> Path:
        """Write ``rank-<r>.et`` for every rank plus the manifest; returns the run directory. ``source``: the
        manifest's (``capture``: stream 0 is the thread that marks steps, as a capture numbers them)."""
        d = Path(run_dir)
        groups = [
            ProcessGroupInfo(
                name=n,
                ranks=rs,
                desc=self.descs.get(n, "default_pg" if n == DEFAULT_PG else n),
                backend="gloo",
            )
            for n, rs in self.groups.items()
        ]
        steps: list[StepSpan] = []
        for r, rb in sorted(self.ranks.items()):
            meta_node = pg_init_node(groups)
            write_et(rank_file(d, r), [meta_node, *rb.nodes], {"rank": r, "world_size": self.world_size})
            spans: dict[int, list[int]] = {}
            for n in rb.nodes:
                st = n.attrs.get(Attr.STEP)
                if isinstance(st, int):
                    s = spans.setdefault(st, [n.start_ns, n.start_ns + n.dur_ns])
                    s[0] = min(s[0], n.start_ns)
                    s[1] = max(s[1], n.start_ns + n.dur_ns)
            steps.extend(
                StepSpan(rank=r, step=k, start_ns=v[0], end_ns=v[1]) for k, v in sorted(spans.items())
            )
        write_manifest(
            d,
            Manifest(
                world_size=self.world_size,
                ranks=tuple(sorted(self.ranks)),
                missing_ranks=tuple(r for r in range(self.world_size) if r not in self.ranks),
                process_groups=tuple(groups),
                backend="gloo",
                level=level,
                source=source,
                steps=tuple(steps),
            ),
        )
        return d
