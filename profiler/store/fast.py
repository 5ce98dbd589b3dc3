"""A vectorised (numpy) decoder of Chakra ``.et`` files into the store's columns.

Decoding one protobuf ``Node`` at a time in Python costs tens of microseconds per node; this decoder
reads every node of a file at once instead. After one pass that splits the file into its
length-delimited messages, it walks all messages *in lockstep*: step ``k`` decodes the ``k``-th field of
every message still open, with numpy gathers over the file's bytes. Attribute submessages are decoded the
same way, packed dependency lists and ``int64_list`` attributes (an all_to_all's splits) by locating
varint terminators. Strings (node names, group names) are
gathered into one Arrow string array and dictionary-encoded by Arrow.

The input is untrusted: every varint is limited to 10 bytes, every field must end inside its message,
lengths are checked against the bytes left, and strings must be valid UTF-8. Anything this decoder does
not accept (a malformed message, a deprecated group wire type) raises :class:`FastDecodeError`; callers
then fall back to the per-node reference decoder, which names the exact file and byte offset. It also
declines files of fewer than ``MIN_NODES`` nodes, which the per-node decoder reads faster.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from skewlens.profiler.chakra_io import EMPTY_NODE, MAX_MESSAGE_BYTES, read_trace_bytes
from skewlens.profiler.errors import TraceFormatError

# Plain ndarray aliases: the decoder mixes dtypes freely and checks them at run time.
I64 = np.ndarray
U64 = np.ndarray
U8 = np.ndarray
Bool = np.ndarray

#: Lockstep steps before the decoder gives a file to the reference decoder (one step per field of the
#: longest message: a node with thousands of attributes would otherwise cost thousands of numpy passes).
MAX_FIELDS = 512
#: Files of fewer nodes than this go to the reference decoder: the lockstep walk has a fixed cost of about
#: 1.9 ms a file (a few hundred numpy calls, whatever the node count), the per-node decoder about 0.4 ms
#: plus 30 µs a node; they break even at 48-56 nodes (measured on compute and all_reduce files of 4-128
#: nodes). A run of 1,024 ranks of a few collectives each is 1,024 such files.
MIN_NODES = 48
#: Fewest bytes a message takes on average (length prefix included) in a file we decode: the smallest node
#: that means anything (an id, a short name, a type) takes about ten; a file of 3-byte nodes (one field
#: each) is a way to make the loader hold 50 times the file's size.
MIN_MEAN_MESSAGE_BYTES = 6
_PAD = 16  # zero bytes appended so that 8-byte gathers and 10-byte varints never read past the buffer

#: Floating-point values of integer attributes are truncated, NaN reads 0, and past ±9.2e18 (int64's range,
#: where a cast would wrap) the bound; the reference decoder reads them alike (``load.int64_of``).
FLOAT_INT_BOUND = 9.2e18


def float_ints(x: np.ndarray) -> I64:
    return np.clip(np.nan_to_num(x.astype(np.float64), nan=0.0), -FLOAT_INT_BOUND, FLOAT_INT_BOUND).astype(
        np.int64
    )


# Node fields (et_def.proto)
F_ID, F_NAME, F_TYPE, F_CTRL, F_DATA, F_START_US, F_DUR_US, F_INPUTS, F_OUTPUTS, F_ATTR = range(1, 11)
# AttributeProto value fields, by how their payload is decoded
_VARINT_INT = (7, 9, 11, 13, 27)  # int32, int64, uint32, uint64, bool
_INT32, _UINT32, _BOOL = 7, 11, 27
_ZIGZAG = (15, 17)  # sint32, sint64
_FIXED64_INT = (21, 25)  # fixed64, sfixed64
_FIXED32_INT = (19,)  # fixed32
_SFIXED32 = (23,)
_DOUBLE = 3
_FLOAT = 5
_STRING = 29
_INT64_LIST = 10

# Attribute names we turn into columns (all are at most 16 bytes, see _name_parts).
KNOWN_ATTRS = (
    "comm_type",
    "comm_size",
    "comm_src",
    "comm_dst",
    "comm_tag",
    "pg_name",
    "is_cpu_op",
    "stream",
    "skl_seq",
    "skl_start_ns",
    "skl_dur_ns",
    "skl_step",
    "tensor_size",
    "skl_host_op",
    "skl_batch",
    "skl_launch_ns",
    "skl_launched_in",
    "skl_return_ns",
    "skl_send_bytes",
    "skl_recv_bytes",
    "skl_send_splits",
    "skl_recv_splits",
    "skl_dtype",
)
#: The known attributes whose values are strings (``string_val``): the group's name and the communicated
#: tensor's dtype.
STRING_ATTRS = ("pg_name", "skl_dtype")
#: The known attributes whose values are int64 lists (``int64_list``): an all_to_all's per-member splits.
LIST_ATTRS = ("skl_send_splits", "skl_recv_splits")
#: The known attributes with integer values (all but the strings and the lists).
INT_ATTRS = tuple(a for a in KNOWN_ATTRS if a not in STRING_ATTRS and a not in LIST_ATTRS)


class FastDecodeError(TraceFormatError):
    """The vectorised decoder cannot (or, for a small file, need not) decode this file: callers fall back to
    the reference decoder."""


@dataclass(eq=False, slots=True)
class RawColumns:
    """What the decoder extracts from one file, before the store interprets it."""

    node_id: U64
    node_type: I64
    start_us: I64
    dur_us: I64
    names: pa.Array
    """Node names as a dictionary array (int32 indices)."""
    msg_offset: I64
    """Byte offset of each node's length prefix in the (decompressed) file."""
    attr_val: dict[str, I64]
    """Per known integer attribute: value per node (0 where absent)."""
    attr_has: dict[str, Bool]
    """Per known attribute: whether the node carries it."""
    pg_name: pa.Array
    """``pg_name`` per node as a dictionary array (null where absent)."""
    dtype: pa.Array
    """``skl_dtype`` per node as a dictionary array (null where absent)."""
    dep_node: I64
    """Row of the node owning each dependency entry (sorted by row, ctrl before data)."""
    dep_id: U64
    """Node id each dependency entry points to."""
    dep_kind: np.ndarray
    """0 ctrl, 1 data (int8)."""
    metadata_msgs: list[tuple[int, bytes]]
    """(row, raw message) of METADATA nodes, decoded with protobuf by the caller."""
    global_metadata: bytes
    """The raw GlobalMetadata message."""
    attr_lists: dict[str, tuple[I64, I64]] = field(default_factory=dict)
    """Per list attribute (``LIST_ATTRS``) some node carries: (row of each value, value), by row then
    position in the list; an empty list leaves no entry."""


def split_messages(
    data: bytes | memoryview, path: Path, buf: TraceBytes | None = None
) -> tuple[I64, I64, I64]:
    """Byte offset of each length-delimited message's length prefix, and the start and length of its body
    (bounds-checked), in file order (``buf``: the same bytes as :class:`TraceBytes`, where the caller has
    them).

    The one pass in Python only steps from each length prefix to the next (the chain is sequential); the
    prefixes' values (:meth:`TraceBytes.varint`) and every check are then computed with numpy."""
    # 8 bytes a message: a list held a Python int per message (36 bytes: 10 MB for 287,000 nodes)
    prefixes = array.array("q")
    append = prefixes.append
    n = len(data)
    pos = 0
    last = n - 1
    while pos < n:
        append(pos)
        b = data[pos]
        if 0 < b < 0x80:
            pos += b + 1
        elif b == 0:  # an empty message: the GlobalMetadata may be (no version), a node may not
            if pos:
                raise TraceFormatError(f"{path}: {EMPTY_NODE} at byte offset {pos}")
            pos = 1
        elif pos < last and data[pos + 1] < 0x80:  # two-byte prefix: nodes of 128 B to 16 KiB
            pos += 2 + ((b & 0x7F) | (data[pos + 1] << 7))
        else:
            size = b & 0x7F
            shift = 7
            q = pos + 1
            while True:
                if q >= n:
                    raise TraceFormatError(f"{path}: truncated length prefix at byte offset {pos}")
                c = data[q]
                q += 1
                size |= (c & 0x7F) << shift
                if c < 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise TraceFormatError(f"{path}: corrupt length prefix at byte offset {pos}")
            pos = q + size
    if len(prefixes) > 1 and n < MIN_MEAN_MESSAGE_BYTES * len(prefixes):
        raise TraceFormatError(
            f"{path}: {len(prefixes):,} messages in {n:,} bytes: fewer than {MIN_MEAN_MESSAGE_BYTES} bytes a "
            "node on average, which no trace holds (a node has an id, a name and a type)"
        )
    at = np.frombuffer(prefixes, dtype=np.int64) if prefixes else np.empty(0, dtype=np.int64)
    # every prefix lies whole inside the file and is at most 10 bytes long (checked above)
    size_u, body = (buf if buf is not None else TraceBytes(data)).varint(at)
    over = np.flatnonzero(size_u > np.uint64(MAX_MESSAGE_BYTES))
    if over.size:
        i = int(over[0])
        raise TraceFormatError(
            f"{path}: message at byte offset {at[i]} claims {int(size_u[i])} bytes "
            f"(limit {MAX_MESSAGE_BYTES})"
        )
    if pos > n:  # only the last message can run past the end of the file
        raise TraceFormatError(
            f"{path}: truncated message at byte offset {at[-1]}: needs {int(size_u[-1])} bytes, "
            f"{n - int(body[-1])} left"
        )
    return at, body, size_u.astype(np.int64)


class TraceBytes:
    """The file's bytes with gathers of single bytes, 8-byte words and varints at many offsets.

    They are copied once, padded: a caller that keeps them for the reference decoder keeps ``view`` (the
    same bytes, unpadded), not what it read, or a file is held twice while it is decoded."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.u8: U8 = np.frombuffer(bytes(data) + b"\0" * _PAD, dtype=np.uint8)
        self.n = len(data)
        self.view: memoryview = self.u8.data[: self.n]
        # an overlapping, unaligned view: word[i] is the little-endian uint64 at byte i
        self.word = np.ndarray(shape=(self.n + _PAD - 7,), dtype="<u8", buffer=self.u8, strides=(1,))

    def varint(self, pos: I64) -> tuple[U64, I64]:
        """Varint values at ``pos`` and the positions after them (limited to 10 bytes)."""
        b = self.u8[pos]
        more = np.flatnonzero(b >= 0x80)
        if more.size == 0:  # the common case for tags and short lengths
            return b.astype(np.uint64), pos + 1
        val = (b & 0x7F).astype(np.uint64)
        after = pos + 1
        k = 1
        while more.size:
            if k >= 10:
                raise FastDecodeError("varint longer than 10 bytes")
            c = self.u8[pos[more] + k]
            val[more] |= (c & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            after[more] += 1
            more = more[c >= 0x80]
            k += 1
        return val, after

    def gather_strings(self, start: I64, length: I64) -> pa.Array:
        """The byte ranges ``[start, start+length)`` as an Arrow string array (UTF-8 checked)."""
        offsets = np.zeros(start.shape[0] + 1, dtype=np.int64)
        np.cumsum(length, out=offsets[1:])
        total = int(offsets[-1])
        idx = np.repeat(start - offsets[:-1], length) + np.arange(total, dtype=np.int64)
        buf = self.u8[idx]
        arr = pa.Array.from_buffers(
            pa.large_string(), start.shape[0], [None, pa.py_buffer(offsets), pa.py_buffer(buf)]
        )
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            raise FastDecodeError("string is not valid UTF-8") from None
        return arr


@dataclass(slots=True)
class _Fields:
    """Fields found by one lockstep walk: per wire type, (message index, field number, payload)."""

    v_msg: list[I64]
    v_field: list[I64]
    v_val: list[U64]
    l_msg: list[I64]
    l_field: list[I64]
    l_start: list[I64]
    l_len: list[I64]
    f_msg: list[I64]
    f_field: list[I64]
    f_pos: list[I64]
    f_wide: list[Bool]


def _walk(b: TraceBytes, start: I64, end: I64) -> _Fields:
    """Decode the fields of every message ``[start[i], end[i])`` in lockstep."""
    out = _Fields([], [], [], [], [], [], [], [], [], [], [])
    pos = start.copy()
    live = np.flatnonzero(pos < end)
    steps = 0
    while live.size:
        steps += 1
        if steps > MAX_FIELDS:
            raise FastDecodeError(f"a message has more than {MAX_FIELDS} fields")
        tag, p = b.varint(pos[live])
        tag_i = tag.view(np.int64)
        field = tag_i >> 3
        wire = tag_i & 7
        e = end[live]
        if (field <= 0).any():
            raise FastDecodeError("field number 0 (or a corrupt tag)")
        if (wire == 2).all():  # the common step: every live message is at an attribute / a string
            newp = _length_delimited(b, out, live=live, field=field, p=p, e=e)
        else:
            newp = _mixed_step(b, out, live=live, field=field, wire=wire, p=p, e=e)
        if (newp > e).any():
            raise FastDecodeError("field runs past the end of its message")
        pos[live] = newp
        live = live[newp < e]
    return out


def _length_delimited(b: TraceBytes, out: _Fields, *, live: I64, field: I64, p: I64, e: I64) -> I64:
    ln, after = b.varint(p)
    if (ln > (e - after).clip(0).astype(np.uint64)).any():
        raise FastDecodeError("length-delimited field runs past the end of its message")
    ln_i = ln.astype(p.dtype)  # fits: checked against the bytes left above
    out.l_msg.append(live)
    out.l_field.append(field)
    out.l_start.append(after)
    out.l_len.append(ln_i)
    return after + ln_i


def _mixed_step(b: TraceBytes, out: _Fields, *, live: I64, field: I64, wire: I64, p: I64, e: I64) -> I64:
    newp = np.empty_like(p)
    m0 = wire == 0
    if m0.any():
        val, after = b.varint(p[m0])
        newp[m0] = after
        out.v_msg.append(live[m0])
        out.v_field.append(field[m0])
        out.v_val.append(val)
    m2 = wire == 2
    if m2.any():
        newp[m2] = _length_delimited(b, out, live=live[m2], field=field[m2], p=p[m2], e=e[m2])
    m1 = wire == 1
    m5 = wire == 5
    if m1.any() or m5.any():
        mf = m1 | m5
        newp[m1] = p[m1] + 8
        newp[m5] = p[m5] + 4
        out.f_msg.append(live[mf])
        out.f_field.append(field[mf])
        out.f_pos.append(p[mf])
        out.f_wide.append(m1[mf])
    if (~(m0 | m1 | m2 | m5)).any():
        raise FastDecodeError("unsupported wire type (3, 4, 6 or 7)")
    return newp


def _cat(parts: Sequence[np.ndarray], dtype: type) -> np.ndarray:
    """The parts joined (one part: itself, not a copy: a file's one long list is not held twice)."""
    if len(parts) == 1:
        return parts[0].astype(dtype, copy=False)
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype=dtype)


#: Packed bytes :func:`_packed_varints` decodes at a time. Its temporaries take about 60 bytes a packed byte
#: (90 past one batch, each batch's values then copied into the output): decoding all of a file's lists at
#: once let a 50 MB list of one-byte values hold 3 GB. In batches of 64 KiB they take 4 to 6 MB, and a long
#: list decodes 3 times faster than at once (the temporaries stay in the cache); lists as traces write them
#: (a few bytes a node, 20 KB a rank of 10,000 nodes) fit in one batch.
PACKED_BATCH_BYTES = 1 << 16


#: Bytes of node messages :func:`decode_file` decodes at a time. The lockstep walk's and the attributes'
#: temporaries take about 8 bytes of memory a byte of the file (one array per field, several per
#: attribute): a 56 MiB rank of 277,000 ``full``-level nodes held 450 MiB of them at once above its bytes
#: and columns. In batches of 2 MiB they take about 16 MiB whatever the file's size; a rank of 10,000
#: nodes (about 1 MB) is one batch, as before, and a batch's fixed cost (about 2 ms) is under 5% of it.
NODE_BATCH_BYTES = 1 << 21


def _packed_varints(
    b: TraceBytes, owner: I64, start: I64, length: I64, *, batch_bytes: int = PACKED_BATCH_BYTES
) -> tuple[I64, U64]:
    """Decode packed varint lists: (owner of each value, value).

    The lists' bytes, laid end to end, are decoded ``batch_bytes`` at a time (at least 16, so that a batch
    without a terminator holds a varint longer than 10 bytes); a batch ending inside a varint leaves that
    varint to the next. Past one batch, the outputs are allocated for one value a byte, the most there can
    be, and shrunk to the values found: their pages never written are never touched."""
    total = int(length.sum())
    if total == 0:
        return np.empty(0, np.int64), np.empty(0, np.uint64)
    offsets = np.zeros(start.shape[0] + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    batch_bytes = max(batch_bytes, 16)
    out_owner = out_val = np.empty(0)
    n_out = 0
    lo = 0
    while lo < total:
        hi = min(lo + batch_bytes, total)
        # the lists (some only in part) whose bytes lie in [lo, hi) of the concatenation
        r0 = int(np.searchsorted(offsets[1:], lo, side="right"))
        r1 = int(np.searchsorted(offsets[:-1], hi, side="left"))
        e = offsets[r0 + 1 : r1 + 1]
        ln = np.minimum(e, hi) - np.maximum(offsets[r0:r1], lo)
        idx = np.repeat(start[r0:r1] - (offsets[r0:r1] - lo), ln)
        idx += np.arange(hi - lo, dtype=np.int64)
        byte = b.u8[idx]
        term = byte < 0x80
        region_end = e[(e <= hi) & (ln > 0)] - (lo + 1)  # the last byte of each list ending in the batch
        if not term[region_end].all():
            raise FastDecodeError("packed list ends inside a varint")
        ends = np.flatnonzero(term)
        if ends.size == 0 or (hi - lo) - 1 - ends[-1] >= 10:  # 10 bytes >= 0x80 and no end
            raise FastDecodeError("varint longer than 10 bytes")
        firsts = np.empty_like(ends)
        firsts[0] = 0
        firsts[1:] = ends[:-1] + 1
        nbytes = ends - firsts + 1
        if (nbytes > 10).any():
            raise FastDecodeError("varint longer than 10 bytes")
        used = int(ends[-1]) + 1  # bytes after the last terminator: a varint the next batch reads whole
        k = np.arange(used, dtype=np.int64) - np.repeat(firsts, nbytes)
        parts = (byte[:used] & 0x7F).astype(np.uint64) << (np.uint64(7) * k.astype(np.uint64))
        vals = np.bitwise_or.reduceat(parts, firsts)
        owners = owner[np.repeat(np.arange(r0, r1), ln)[ends]]
        if used == total:  # all in one batch
            return owners, vals
        if lo == 0:
            out_owner = np.empty(total, dtype=np.int64)
            out_val = np.empty(total, dtype=np.uint64)
        n = ends.size
        out_owner[n_out : n_out + n] = owners
        out_val[n_out : n_out + n] = vals
        n_out += n
        lo += used
    out_owner.resize(n_out, refcheck=False)
    out_val.resize(n_out, refcheck=False)
    return out_owner, out_val


def _read_words(b: TraceBytes, pos: I64, wide: Bool) -> U64:
    w = b.word[pos]
    return np.where(wide, w, w & np.uint64(0xFFFFFFFF))


_HIGH_BITS = np.uint64(0x8080808080808080)
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _name_parts(b: TraceBytes, start: I64, length: I64) -> tuple[U64, U64]:
    """First and last 8 bytes of each name (zero-masked beyond the name): exact for names <= 16 bytes."""
    first = b.word[start] & _MASKS[np.minimum(length, 8)]
    last = b.word[start + np.maximum(length - 8, 0)]
    last[length <= 8] = 0
    return first, last


def _known_table() -> tuple[U64, I64, U64, I64]:
    raw = [n.encode() for n in KNOWN_ATTRS]
    blob = TraceBytes(b"".join(raw))
    lengths = np.array([len(r) for r in raw], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    first, last = _name_parts(blob, starts, lengths)
    order = np.lexsort((last, first))
    if np.unique(first, return_counts=True)[1].max() > _SAME_FIRST:
        raise AssertionError(f"at most {_SAME_FIRST} known attribute names may share their first 8 bytes")
    return first[order], order, last, lengths


#: How many known names may share their first 8 bytes (``skl_send_bytes``, ``skl_send_splits``).
_SAME_FIRST = 2
_KNOWN_FIRST, _KNOWN_ORDER, _KNOWN_LAST, _KNOWN_LEN = _known_table()


def known_attr_index(first: U64, last: U64, length: I64) -> I64:
    """Index into ``KNOWN_ATTRS`` of each attribute name, -1 for other names (exact comparison), from the
    names' :func:`_name_parts` and lengths."""
    found = np.full(first.shape[0], -1, dtype=np.int64)
    left = np.searchsorted(_KNOWN_FIRST, first)
    for k in range(_SAME_FIRST):  # the names sharing a first word lie side by side
        pos = np.minimum(left + k, len(KNOWN_ATTRS) - 1)
        idx = _KNOWN_ORDER[pos]
        exact = (_KNOWN_FIRST[pos] == first) & (_KNOWN_LAST[idx] == last) & (_KNOWN_LEN[idx] == length)
        found = np.where(exact, idx, found)
    return found


@dataclass(eq=False, slots=True)
class _Attrs:
    """Per attribute: its name's bytes, its integer value (if numeric), its string value (if a string)."""

    name_start: I64
    name_len: I64
    value: I64
    is_int: Bool
    str_start: I64
    str_len: I64
    is_str: Bool
    list_start: I64
    """Where an ``int64_list`` value's Int64List message starts (its length in ``list_len``)."""
    list_len: I64
    is_list: Bool

    @staticmethod
    def empty(n: int) -> _Attrs:
        z = np.zeros(n, dtype=np.int64)
        f = np.zeros(n, dtype=np.bool_)
        return _Attrs(z, z.copy(), z.copy(), f, z.copy(), z.copy(), f.copy(), z.copy(), z.copy(), f.copy())

    def fill(self, rows: I64, other: _Attrs) -> None:
        for name in self.__slots__:
            getattr(self, name)[rows] = getattr(other, name)


# How an AttributeProto value field's payload becomes an integer, by field number.
_K_NONE, _K_VARINT, _K_ZIGZAG, _K_FIXED, _K_SFIXED32, _K_DOUBLE, _K_FLOAT, _K_NARROW = range(8)
_KIND = np.zeros(64, dtype=np.int8)
_KIND[list(_VARINT_INT)] = _K_VARINT
_KIND[[_INT32, _UINT32, _BOOL]] = _K_NARROW  # varints read narrower (see _int_values)
_KIND[list(_ZIGZAG)] = _K_ZIGZAG
_KIND[list(_FIXED64_INT + _FIXED32_INT)] = _K_FIXED
_KIND[list(_SFIXED32)] = _K_SFIXED32
_KIND[_DOUBLE] = _K_DOUBLE
_KIND[_FLOAT] = _K_FLOAT


def _low_int32(v: I64) -> I64:
    return v.astype(np.int32).astype(np.int64)


def _low_uint32(v: I64) -> I64:
    return v & 0xFFFFFFFF


def _nonzero(v: I64) -> I64:
    return (v != 0).astype(np.int64)


def _int_values(field: I64, raw: U64, wire0: Bool) -> tuple[I64, Bool]:
    """Integer value of numeric attribute payloads (varint payloads where ``wire0``, else fixed words)."""
    kind = _KIND[np.minimum(field, 63)]
    kind[field > 63] = _K_NONE
    val = raw.view(np.int64).copy()
    narrow = kind == _K_NARROW
    varint = wire0 & ((kind == _K_VARINT) | narrow)
    nz = np.flatnonzero(narrow & wire0)
    if nz.size:  # as protobuf reads these varints: int32, uint32 keep their low 32 bits, a bool is 0/1
        f = field[nz]
        for code, conv in ((_INT32, _low_int32), (_UINT32, _low_uint32), (_BOOL, _nonzero)):
            sel = nz[f == code]
            val[sel] = conv(val[sel])
    ok = varint | (wire0 & (kind == _K_ZIGZAG)) | (~wire0 & (kind >= _K_FIXED) & (kind <= _K_FLOAT))
    if not (varint | ~ok).all():  # rare encodings: zigzag, fixed-width, floating point
        for k, conv in (
            (_K_ZIGZAG, lambda w: (w >> np.uint64(1)).view(np.int64) ^ -(w & np.uint64(1)).view(np.int64)),
            (_K_SFIXED32, lambda w: w.astype(np.uint32).view(np.int32).astype(np.int64)),
            (_K_DOUBLE, lambda w: float_ints(w.view(np.float64))),
            (_K_FLOAT, lambda w: float_ints(w.astype(np.uint32).view(np.float32))),
        ):
            m = ok & (kind == k)
            val[m] = conv(raw[m])
    return val, ok


def _int_value(out: _Attrs, rows: I64, field: I64, raw: U64, wire0: Bool) -> None:
    """Store the integer values of ``rows`` into ``out`` (see :func:`_int_values`)."""
    val, ok = _int_values(field, raw, wire0)
    out.value[rows[ok]] = val[ok]
    out.is_int[rows[ok]] = True


def _decode_attrs_generic(b: TraceBytes, a_start: I64, a_end: I64) -> _Attrs:
    """Any AttributeProto layout, by the lockstep walk."""
    out = _Attrs.empty(a_start.shape[0])
    af = _walk(b, a_start, a_end)
    l_msg = _cat(af.l_msg, np.int64)
    l_field = _cat(af.l_field, np.int64)
    l_start = _cat(af.l_start, np.int64)
    l_len = _cat(af.l_len, np.int64)
    m = l_field == 1
    out.name_start[l_msg[m]] = l_start[m]
    out.name_len[l_msg[m]] = l_len[m]
    m = l_field == _STRING
    out.str_start[l_msg[m]] = l_start[m]
    out.str_len[l_msg[m]] = l_len[m]
    out.is_str[l_msg[m]] = True
    m = l_field == _INT64_LIST
    out.list_start[l_msg[m]] = l_start[m]
    out.list_len[l_msg[m]] = l_len[m]
    out.is_list[l_msg[m]] = True
    v_msg = _cat(af.v_msg, np.int64)
    v_field = _cat(af.v_field, np.int64)
    f_msg = _cat(af.f_msg, np.int64)
    f_field = _cat(af.f_field, np.int64)
    # fields 3-32 are AttributeProto's one value (a oneof): protobuf keeps the last of several, the reference
    # decoder does that
    valued = np.concatenate(
        [m[(fs >= 3) & (fs <= 32)] for m, fs in ((l_msg, l_field), (v_msg, v_field), (f_msg, f_field))]
    )
    if valued.size and np.bincount(valued).max() > 1:
        raise FastDecodeError("an attribute with several values")
    _int_value(out, v_msg, v_field, _cat(af.v_val, np.uint64), np.ones(v_msg.shape, bool))
    if f_msg.size:
        words = _read_words(b, _cat(af.f_pos, np.int64), _cat(af.f_wide, np.bool_))
        _int_value(out, f_msg, f_field, words, np.zeros(f_msg.shape, bool))
    return out


def _decode_attrs(b: TraceBytes, a_start: I64, a_end: I64) -> _Attrs:
    """Attributes laid out as writers write them (name, then one value) in one pass; others walked.

    Works on whole arrays (no subsetting) so that the common case, where every attribute has that
    layout, costs a few dozen numpy passes; attributes that do not fit go to the lockstep walk.
    """
    u8 = b.u8
    na = a_start.shape[0]
    nlen = u8[a_start + 1].astype(a_start.dtype)
    vpos = a_start + 2 + nlen
    ok = (u8[a_start] == 0x0A) & (nlen < 0x80) & (vpos < a_end)
    if not ok.all():
        vpos = np.where(ok, vpos, a_start)
    t0 = u8[vpos]
    tag = t0.astype(np.int32)
    two = t0 >= 0x80
    if two.any():
        t1 = u8[vpos + 1].astype(np.int32)
        ok &= ~two | (t1 < 0x80)
        tag = np.where(two, (tag & 0x7F) | (t1 << 7), tag)
    p = vpos + 1 + two
    field = tag >> 3
    wire = tag & 7
    raw = np.zeros(na, dtype=np.uint64)
    after = np.zeros(na, dtype=a_start.dtype)  # stays 0 (never equal to a_end) for unsupported layouts
    m0 = np.flatnonzero(ok & (wire == 0))
    raw[m0], after[m0] = b.varint(p[m0])
    m2 = np.flatnonzero(ok & (wire == 2))
    slen, sbody = b.varint(p[m2])
    slen_i = np.minimum(slen, np.uint64(MAX_MESSAGE_BYTES)).astype(a_start.dtype)
    after[m2] = sbody + slen_i
    mw = np.flatnonzero(ok & ((wire == 1) | (wire == 5)))
    if mw.size:
        wide = wire[mw] == 1
        raw[mw] = _read_words(b, p[mw], wide)
        after[mw] = p[mw] + np.where(wide, 8, 4)
    ok &= (after == a_end) & (field > 0)
    str_start = np.zeros(na, dtype=np.int64)
    str_len = np.zeros(na, dtype=np.int64)
    str_start[m2] = sbody
    str_len[m2] = slen_i
    is_str = ok & (field == _STRING) & (wire == 2)
    is_list = ok & (field == _INT64_LIST) & (wire == 2)
    value, is_int = _int_values(field, raw, wire == 0)
    is_int &= ok
    out = _Attrs(
        name_start=np.where(ok, a_start + 2, 0),
        name_len=np.where(ok, nlen, 0),
        value=np.where(is_int, value, 0),
        is_int=is_int,
        str_start=np.where(is_str, str_start, 0),
        str_len=np.where(is_str, str_len, 0),
        is_str=is_str,
        list_start=np.where(is_list, str_start, 0),
        list_len=np.where(is_list, str_len, 0),
        is_list=is_list,
    )
    rest = np.flatnonzero(~ok)
    if rest.size:
        out.fill(rest, _decode_attrs_generic(b, a_start[rest], a_end[rest]))
    return out


def decode_file(
    path: str | Path,
    *,
    min_nodes: int = MIN_NODES,
    data: bytes | TraceBytes | None = None,
    batch_bytes: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> RawColumns:
    """Decode one ``.et`` file into raw columns (raises :class:`FastDecodeError` on anything odd, and on
    a file of fewer than ``min_nodes`` nodes; ``data``: the file's bytes where the caller has read them,
    as :class:`TraceBytes` where it keeps them for the reference decoder).

    Nodes are decoded ``batch_bytes`` of messages at a time (a node is never split; by default
    ``NODE_BATCH_BYTES``) into columns of the file's node count, so what the decoder holds is the file's
    bytes, its columns and one batch's temporaries; ``on_batch`` is called with the nodes of each batch
    once it is decoded. The columns are the same whatever the batch size (tested)."""
    p = Path(path)
    if data is None:
        data = read_trace_bytes(p)
    b = data if isinstance(data, TraceBytes) else TraceBytes(data)
    del data  # read through the padded copy: the bytes read are let go where the caller holds no other
    view = b.view
    prefix_at, starts, sizes = split_messages(view, p, b)
    if starts.size == 0:
        raise TraceFormatError(f"{p}: empty file, expected a Chakra GlobalMetadata message")
    if starts.size - 1 < min_nodes:
        raise FastDecodeError(f"{p}: {starts.size - 1} node(s), fewer than {min_nodes}: read per node")
    gm = bytes(view[starts[0] : starts[0] + sizes[0]])
    # int32 offsets where the file allows: half the memory traffic of every gather and comparison
    idx_t = np.int32 if b.n + _PAD < (1 << 31) else np.int64
    n_start = starts[1:].astype(idx_t)
    n_end = n_start + sizes[1:].astype(idx_t)
    del starts, sizes
    n = n_start.shape[0]
    acc = _Columns.empty(n)
    step = max(batch_bytes if batch_bytes is not None else NODE_BATCH_BYTES, 1)
    lo = 0
    while lo < n:
        hi = max(int(np.searchsorted(n_start, int(n_start[lo]) + step, side="left")), lo + 1)
        _decode_nodes(b, n_start[lo:hi], n_end[lo:hi], acc, row0=lo, idx_t=idx_t)
        if on_batch is not None:
            on_batch(hi - lo)
        lo = hi
    # gathered a batch at a time (8 bytes of index a byte of name), dictionary-encoded once
    names = pc.dictionary_encode(pa.concat_arrays(acc.names).cast(pa.string()))
    acc.names.clear()
    zero = np.zeros(n, dtype=np.int64)
    none = np.zeros(n, dtype=np.bool_)
    zero.flags.writeable = none.flags.writeable = False  # shared by every absent attribute
    attr_val: dict[str, I64] = dict.fromkeys(KNOWN_ATTRS, zero)
    attr_has: dict[str, Bool] = dict.fromkeys(KNOWN_ATTRS, none)
    for a in KNOWN_ATTRS:  # in KNOWN_ATTRS' order, as the columns were made before batches
        if a in acc.ints:
            attr_val[a], attr_has[a] = acc.ints[a]
    strings = {a: _string_column(b, *acc.strings[a]) for a in STRING_ATTRS}
    for name, col in strings.items():
        attr_has[name] = col.is_valid().to_numpy(zero_copy_only=False)
    meta_rows = np.flatnonzero(acc.node_type == 1)
    metadata_msgs = [(int(r), bytes(view[n_start[r] : n_end[r]])) for r in meta_rows.tolist()]
    attr_lists = {a: (_cat(rows, np.int64), _cat(vals, np.int64)) for a, (rows, vals) in acc.lists.items()}
    return RawColumns(
        node_id=acc.node_id,
        node_type=acc.node_type,
        start_us=acc.start_us,
        dur_us=acc.dur_us,
        names=names,
        msg_offset=prefix_at[1:],
        attr_val=attr_val,
        attr_has=attr_has,
        pg_name=strings["pg_name"],
        dtype=strings["skl_dtype"],
        dep_node=_cat(acc.dep_node, np.int64),
        dep_id=_cat(acc.dep_id, np.uint64),
        dep_kind=_cat(acc.dep_kind, np.int8),
        metadata_msgs=metadata_msgs,
        global_metadata=gm,
        attr_lists={a: v for a, v in attr_lists.items() if v[0].size},
    )


@dataclass(eq=False, slots=True)
class _Columns:
    """The columns :func:`decode_file` fills a batch of nodes at a time: per node, or per batch (lists)."""

    node_id: U64
    node_type: I64
    start_us: I64
    dur_us: I64
    names: list[pa.Array]
    """Each batch's node names (a string array)."""
    ints: dict[str, tuple[I64, Bool]]
    """Per known integer attribute some node carries: its value per node (0 where absent), and whether the
    node carries it."""
    strings: dict[str, tuple[I64, I64, Bool]]
    """Per string attribute: where its value starts, its length, whether the node has it."""
    dep_node: list[I64]
    dep_id: list[U64]
    dep_kind: list[np.ndarray]
    lists: dict[str, tuple[list[I64], list[I64]]]

    @staticmethod
    def empty(n: int) -> _Columns:
        def z() -> I64:
            return np.zeros(n, dtype=np.int64)

        return _Columns(
            node_id=np.zeros(n, dtype=np.uint64),
            node_type=z(),
            start_us=z(),
            dur_us=z(),
            names=[],
            ints={},
            strings={a: (z(), z(), np.zeros(n, dtype=np.bool_)) for a in STRING_ATTRS},
            dep_node=[],
            dep_id=[],
            dep_kind=[],
            lists={a: ([], []) for a in LIST_ATTRS},
        )


def _decode_nodes(b: TraceBytes, n_start: I64, n_end: I64, acc: _Columns, *, row0: int, idx_t: type) -> None:
    """Decode the nodes ``[n_start[i], n_end[i])`` (rows ``row0 + i``) into ``acc``."""
    n = acc.node_id.shape[0]
    fl = _walk(b, n_start, n_end)

    # varint fields of Node
    v_msg = _cat(fl.v_msg, np.int64)
    v_msg += row0
    v_field = _cat(fl.v_field, np.int64)
    v_val = _cat(fl.v_val, np.uint64)
    for f, col in (
        (F_ID, acc.node_id),
        (F_TYPE, acc.node_type),
        (F_START_US, acc.start_us),
        (F_DUR_US, acc.dur_us),
    ):
        m = v_field == f
        col[v_msg[m]] = v_val[m].astype(col.dtype)

    # length-delimited fields of Node
    l_msg = _cat(fl.l_msg, np.int64)
    l_msg += row0
    l_field = _cat(fl.l_field, np.int64)
    l_start = _cat(fl.l_start, idx_t)
    l_len = _cat(fl.l_len, idx_t)
    del fl
    m = l_field == F_NAME
    name_start = np.zeros(n_start.shape[0], dtype=np.int64)
    name_len = np.zeros(n_start.shape[0], dtype=np.int64)
    name_start[l_msg[m] - row0] = l_start[m]
    name_len[l_msg[m] - row0] = l_len[m]
    acc.names.append(b.gather_strings(name_start, name_len))
    del name_start, name_len

    # dependencies: packed (wire 2) or one value per field (wire 0). A value may take one byte, so a file's
    # lists can hold 16 bytes a byte of the file: each part is let go once joined, each column sorted alone
    dep_parts_node: list[I64] = []
    dep_parts_id: list[U64] = []
    per_kind: list[int] = []
    for f in (F_CTRL, F_DATA):
        m = l_field == f
        owner, ids = _packed_varints(b, l_msg[m], l_start[m], l_len[m])
        mv = v_field == f
        dep_parts_node += [owner, v_msg[mv]]
        dep_parts_id += [ids, v_val[mv]]
        per_kind.append(owner.shape[0] + int(mv.sum()))
    del owner, ids, v_msg, v_field, v_val
    dep_node = np.concatenate(dep_parts_node)
    dep_parts_node.clear()
    dep_id = np.concatenate(dep_parts_id)
    dep_parts_id.clear()
    dep_kind = np.repeat(np.arange(2, dtype=np.int8), per_kind)
    key = dep_node * 2
    key += dep_kind
    order = np.argsort(key, kind="stable") if key.size > 1 and not bool((key[1:] >= key[:-1]).all()) else None
    del key  # usually in order already
    if order is not None:
        dep_node = dep_node[order]
        dep_id = dep_id[order]
        dep_kind = dep_kind[order]
        del order
    acc.dep_node.append(dep_node)
    acc.dep_id.append(dep_id)
    acc.dep_kind.append(dep_kind)

    # inputs and outputs (IOInfo: values, shapes, types, strings) are not read, but protobuf parses them:
    # their wire format and strings are checked as it checks them, or a corrupt one reads differently
    m = (l_field == F_INPUTS) | (l_field == F_OUTPUTS)
    if m.any():
        io_start = l_start[m].astype(np.int64)
        io = _walk(b, io_start, io_start + l_len[m].astype(np.int64))
        io_field = _cat(io.l_field, np.int64)
        text = (io_field >= 1) & (io_field <= 3)
        if text.any():
            _check_utf8(b, _cat(io.l_start, np.int64)[text], _cat(io.l_len, np.int64)[text])
        del io, io_field, text

    # attributes
    m = l_field == F_ATTR
    a_node = l_msg[m]
    a_start = l_start[m]
    a_end = a_start + l_len[m]
    del l_msg, l_field, l_start, l_len, m
    at = _decode_attrs(b, a_start, a_end)
    del a_start, a_end
    first, last = _name_parts(b, at.name_start, at.name_len)
    which = known_attr_index(first, last, at.name_len)
    # other attributes are not read, but protobuf checks their names and string values too: a name
    # corrupted into invalid UTF-8 was dropped here (its node read on without it) and refused there
    other = np.flatnonzero(which < 0)
    if other.size:
        _check_utf8(b, at.name_start[other], at.name_len[other], first[other], last[other])
        texts = other[at.is_str[other]]
        if texts.size:
            _check_utf8(b, at.str_start[texts], at.str_len[texts])
    del first, last, other
    # the known integer attributes: a column of the file's nodes for each that some node carries
    sel = np.flatnonzero((which >= 0) & at.is_int)
    w_sel = which[sel]
    for k in np.flatnonzero(np.bincount(w_sel, minlength=len(KNOWN_ATTRS))).tolist():
        name = KNOWN_ATTRS[k]
        if name not in acc.ints:
            acc.ints[name] = (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_))
        val, has = acc.ints[name]
        s = sel[w_sel == k]
        val[a_node[s]] = at.value[s]
        has[a_node[s]] = True
    for name, (start, length, present) in acc.strings.items():
        s = np.flatnonzero(at.is_str & (which == KNOWN_ATTRS.index(name)))
        start[a_node[s]] = at.str_start[s]  # a node that repeats the attribute: its last, as the reference
        length[a_node[s]] = at.str_len[s]  # decoder reads
        present[a_node[s]] = True
    for name, (rows, vals) in acc.lists.items():
        r, v = _int64_lists(b, at, np.flatnonzero(at.is_list & (which == KNOWN_ATTRS.index(name))), a_node)
        rows.append(r)
        vals.append(v)


def _check_utf8(
    b: TraceBytes, start: I64, length: I64, first: U64 | None = None, last: U64 | None = None
) -> None:
    """:class:`FastDecodeError` unless every byte range is UTF-8. A range of at most 16 bytes without a byte
    of 0x80 or more is ASCII, so UTF-8: that is read from its first and last 8 bytes (:func:`_name_parts`,
    given where the caller has them), without gathering it; the others (names are seldom either) are
    gathered and checked by Arrow."""
    if first is None or last is None:
        first, last = _name_parts(b, start, length)
    short = length <= 16
    ascii_ = ((first | last) & _HIGH_BITS) == 0
    idx = np.flatnonzero(~(short & ascii_))
    if idx.size:
        b.gather_strings(start[idx], length[idx])


def _string_column(b: TraceBytes, start: I64, length: I64, present: Bool) -> pa.Array:
    """The ``string_val`` attribute at ``[start, start+length)`` of each row that has one (``present``) as one
    dictionary array, null in rows without."""
    strings = b.gather_strings(start, length).cast(pa.string())
    return pc.dictionary_encode(pc.if_else(pa.array(present), strings, pa.scalar(None, pa.string())))


def _int64_lists(b: TraceBytes, at: _Attrs, sel: I64, a_node: I64) -> tuple[I64, I64]:
    """(row, value) of the ``int64_list`` attributes ``sel`` (rows ``a_node[sel]``), by row. Each Int64List
    must be one packed ``values`` field (what protobuf writes), and a node must carry the attribute once:
    anything else is left to the reference decoder. What is allocated is bounded by the bytes: a value
    takes at least one."""
    owner = a_node[sel].astype(np.int64)
    if owner.size and np.unique(owner).size != owner.size:
        raise FastDecodeError("a list attribute repeated on one node")
    start = at.list_start[sel].astype(np.int64)
    length = at.list_len[sel].astype(np.int64)
    full = length > 0
    s, ln, own = start[full], length[full], owner[full]
    if (b.u8[s] != 0x0A).any():
        raise FastDecodeError("an Int64List that is not one packed values field")
    body_len, body = b.varint(s + 1)
    body_len_i = np.minimum(body_len, np.uint64(MAX_MESSAGE_BYTES)).astype(np.int64)
    if (body + body_len_i != s + ln).any():
        raise FastDecodeError("an Int64List that is not one packed values field")
    by_row = np.argsort(own)  # a row has one list at most: its values come out in row order, unsorted
    rows, vals = _packed_varints(b, own[by_row], body.astype(np.int64)[by_row], body_len_i[by_row])
    return rows, vals.view(np.int64)
