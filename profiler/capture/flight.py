"""Collectives the Python hooks cannot see, from PyTorch's flight recorder (its JSON dump).

The hooks wrap ``torch.distributed``'s Python functions. Collectives issued elsewhere reach the process
group without passing them: functional collectives (``torch.ops._c10d_functional``: DTensor, tensor
parallelism, compiled graphs) and collectives issued from C++. The flight recorder, which every process
group of gloo and NCCL feeds from C++, sees them all: ``skewlens profile`` turns it on
(``TORCH_FR_BUFFER_SIZE``, unless the user set it) and each rank reads its entries back at the end of the
window through the JSON dump (never the pickle one: traces and dumps are untrusted input).

An entry the hooks did not record (no hooked collective on the same group was in flight when the entry was
created) becomes a collective of its own: group, sequence number, type, size and dtype from the entry; the
arrival is the entry's creation time (the moment the rank issued it). The flight recorder gives no end on
gloo (nor on NCCL without timing), so the call is an asynchronous one on the group's comm stream whose end
is the arrival, unless the ``ops`` level gives the real one (the ``gloo:*`` worker event or the NCCL kernel,
see :mod:`profiler.capture.build`). Its sequence number is the recorder's own per-group number plus
:data:`FR_SEQ_BASE`, identical on every member and apart from the hooks' numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from profiler.bounded import parse_json_bounded
from profiler.capture.build import Reach, step_of
from profiler.capture.records import CommRecord, StepRecord
from profiler.errors import SkewlensError
from profiler.vocab import NodeType, collective_from_op

#: Environment variable that sizes (and so enables) the flight recorder's ring buffer.
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
#: Entries kept when skewlens turns the recorder on.
FR_BUFFER_DEFAULT = 20_000
#: Added to the recorder's sequence numbers so that they never equal the hooks' own.
FR_SEQ_BASE = 1 << 40
#: Largest dump parsed (the ring buffer bounds it; this bounds a corrupt one).
MAX_DUMP_BYTES = 256 * 1024 * 1024

_DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
    "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
}  # fmt: skip
_DTYPE_NAMES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
    "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
    "ComplexFloat": "complex64", "ComplexDouble": "complex128",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class FrEntry:
    """One collective the flight recorder saw on this rank."""

    pg_name: str
    """Name of the process group (the same name the hooks record)."""
    seq: int
    """The recorder's per-group collective sequence number."""
    op: str
    """Its profiling name (``gloo:all_reduce``, ``nccl:_allgather_base``)."""
    created_ns: int
    """When the rank issued it (Unix-epoch ns, the hooks' clock)."""
    numel: int
    """Elements of the input tensors."""
    dtype: str
    """torch dtype name of the first input (``float32``), ``""`` if it had none."""
    size_bytes: int
    """numel x element size of the inputs."""


def parse_dump(text: str | bytes) -> list[FrEntry]:
    """The collective entries of a flight-recorder JSON dump (p2p entries are the hooks' to record).

    Malformed entries are skipped: the dump is the recorder's, but nothing in it is trusted.
    """
    try:
        data = parse_json_bounded(text, MAX_DUMP_BYTES, source="flight recorder dump", what="dump")
    except SkewlensError:
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    out: list[FrEntry] = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg, seq, name, created = (
            e.get("process_group"),
            e.get("collective_seq_id"),
            e.get("profiling_name"),
            (e.get("time_created_ns")),
        )
        if not (isinstance(pg, list) and pg and isinstance(pg[0], str)):
            continue
        if not (isinstance(seq, int) and isinstance(name, str) and isinstance(created, int) and created > 0):
            continue
        sizes, dtypes = e.get("input_sizes"), e.get("input_dtypes")
        numel, nbytes = 0, 0
        if isinstance(sizes, list) and isinstance(dtypes, list):
            for shape, dt in zip(sizes, dtypes, strict=False):
                if isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
                    n = math.prod(shape)
                    numel += n
                    nbytes += n * _DTYPE_BYTES.get(str(dt), 0)
        first = dtypes[0] if isinstance(dtypes, list) and dtypes else ""
        out.append(
            FrEntry(
                pg_name=pg[0],
                seq=seq,
                op=name,
                created_ns=created,
                numel=numel,
                dtype=_DTYPE_NAMES.get(str(first), str(first).lower()),
                size_bytes=nbytes,
            )
        )
    return out


def dump_entries() -> list[FrEntry]:
    """This process's flight-recorder entries (empty when the recorder is off or unavailable)."""
    try:
        import torch

        dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
        if dump is None:
            return []
        text = dump(True, False)  # collectives included, finished ones too
    except RuntimeError:
        return []
    return parse_dump(text)


def unhooked(
    entries: Sequence[FrEntry],
    comms: Sequence[CommRecord],
    steps: Sequence[StepRecord],
    *,
    thread: int,
    slack_ns: int = 200_000,
) -> list[CommRecord]:
    """Collectives the recorder saw inside the recorded steps that no hooked collective accounts for.

    A hooked collective on the same group accounts for the entries created while it was being issued
    (``[start - slack, issue end + slack]``: a call may create several, as coalesced ones do).
    """
    ordered = sorted(steps, key=lambda s: s.start_ns)
    starts = [s.start_ns for s in ordered]
    calls: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for c in comms:
        if c.node_type == NodeType.COMM_COLL:
            calls[c.pg_name].append((c.start_ns - slack_ns, c.issue_end_ns + slack_ns))
    hooked = {pg: Reach(iv) for pg, iv in calls.items()}
    out = []
    for e in sorted(entries, key=lambda e: e.created_ns):
        step = step_of(e.created_ns, starts, ordered)
        if step < 0:
            continue
        reach = hooked.get(e.pg_name)
        if reach is not None and reach(e.created_ns) >= e.created_ns:
            continue
        out.append(
            CommRecord(
                node_type=NodeType.COMM_COLL,
                op=e.op,
                comm_type=collective_from_op(e.op),
                pg_name=e.pg_name,
                seq=FR_SEQ_BASE + e.seq,
                src=-1,
                dst=-1,
                tag=0,
                numel=e.numel,
                dtype=e.dtype,
                size_bytes=e.size_bytes,
                start_ns=e.created_ns,
                issue_end_ns=e.created_ns,
                end_ns=e.created_ns,
                is_async=True,
                thread=thread,
                step=step,
            )
        )
    return out


def summary(records: Sequence[CommRecord]) -> str:
    """``"3 all_gather on group '0', 3 all_reduce on group '1'"`` for a manifest note."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for r in records:
        kind = r.comm_type.name.lower() if r.comm_type is not None else r.op
        counts[(kind, r.pg_name)] += 1
    return ", ".join(f"{n} {k} on group {g!r}" for (k, g), n in sorted(counts.items()))
