"""Chakra ``Node`` messages encoded straight to bytes: the importer's writing hot path.

:func:`skewlens.profiler.chakra_io.to_proto` builds one protobuf message per node and one per attribute,
which costs more than everything else the importer does per node. :class:`NodeEncoder` writes the same
bytes directly: the protobuf wire format of ``Node`` (fields in number order, packed dependency lists,
each attribute a length-delimited ``AttributeProto``), with the parts that repeat from node to node (a
name, ``is_cpu_op = true``, a stream, a step) encoded once and reused. The result is byte for byte what
``encode_message(to_proto(node))`` gives (the tests compare the two on varied nodes); values it does not
encode itself (lists, floats, integers outside int64, text that is not valid UTF-8, and the attributes
Chakra reads as int32: ``CHAKRA_INT32_ATTRS``) go through
``chakra_io`` and protobuf, which then also raise what they raise. :func:`id_and_time_fields` encodes the
fields every node has (its id; its start and duration, in micros and as ``skl_start_ns``/``skl_dur_ns``) of
a whole rank at once with numpy, for :meth:`NodeEncoder.encode` to take as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.chakra_io import AttrValue, TraceNode, encode_message, set_attr, to_proto
from skewlens.profiler.vocab import CHAKRA_INT32_ATTRS, Attr, NodeType

_INT64 = 1 << 63
_UINT64 = 1 << 64
#: Varints of 0 .. 2**14 - 1 (ids, dependencies, streams, steps), made once.
_SMALL = [bytes([v]) for v in range(0x80)] + [bytes([(v & 0x7F) | 0x80, v >> 7]) for v in range(0x80, 0x4000)]
#: The two bytes a 14-bit group of a larger varint takes (both with the continuation bit).
_GROUP = [bytes([(v & 0x7F) | 0x80, (v >> 7) | 0x80]) for v in range(0x4000)]
#: Attributes whose values rarely repeat (not worth a cache entry).
_UNCACHED = frozenset({Attr.START_NS, Attr.DUR_NS, Attr.LAUNCH_NS, Attr.RF_ID, Attr.SEQ})
#: Most cached attribute encodings before the cache is emptied (a bound for traces of many distinct values).
_CACHE_LIMIT = 1 << 16


def varint(v: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer below 2**64 (14 bits per table look-up)."""
    if 0 <= v < 0x4000:
        return _SMALL[v]
    if v < 0:  # not a negative index into the tables: another value's bytes
        raise ValueError(f"{v} is negative: no varint")
    if v < 1 << 28:
        return _GROUP[v & 0x3FFF] + _SMALL[v >> 14]
    if v < 1 << 42:
        return _GROUP[v & 0x3FFF] + _GROUP[(v >> 14) & 0x3FFF] + _SMALL[v >> 28]
    if v < 1 << 56:
        return _GROUP[v & 0x3FFF] + _GROUP[(v >> 14) & 0x3FFF] + _GROUP[(v >> 28) & 0x3FFF] + _SMALL[v >> 42]
    if v >= _UINT64:
        raise ValueError(f"{v} does not fit a 64-bit varint")
    g = _GROUP[v & 0x3FFF] + _GROUP[(v >> 14) & 0x3FFF] + _GROUP[(v >> 28) & 0x3FFF]
    return g + _GROUP[(v >> 42) & 0x3FFF] + _SMALL[v >> 56]


def _int64(v: int) -> bytes:
    """Varint of an int64 (negative values as their two's complement, as protobuf writes them)."""
    if not -_INT64 <= v < _INT64:
        raise ValueError(f"{v} does not fit int64")
    return varint(v) if v >= 0 else varint(v + _UINT64)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + varint(len(payload)) + payload


def _packed(tag: bytes, values: Iterable[int]) -> bytes:
    return _field(tag, b"".join([varint(v) for v in values]))


class NodeEncoder:
    """Encodes importer nodes as length-prefixed Chakra ``Node`` messages (one encoder per rank)."""

    def __init__(self) -> None:
        self._names: dict[str, bytes] = {}
        self._attrs: dict[tuple[str, type, AttrValue], bytes] = {}
        self._keys: dict[str, bytes] = {}
        self._start_key = self._key(Attr.START_NS) + b"\x48"
        self._dur_key = self._key(Attr.DUR_NS) + b"\x48"

    def encode(
        self,
        *,
        node_id: int,
        name: str,
        node_type: NodeType,
        start_ns: int,
        dur_ns: int,
        ctrl_deps: Sequence[int],
        data_deps: Sequence[int],
        attrs: Mapping[str, AttrValue],
        extra: Sequence[tuple[str, AttrValue]] = (),
        fields: tuple[bytes, bytes] | None = None,
    ) -> bytes:
        """One node, length prefix included (``extra`` attributes follow ``attrs``; ``fields``: the node's
        id field and time fields from :func:`id_and_time_fields`, else encoded here)."""
        try:
            parts = [fields[0] if fields is not None else b"\x08" + varint(node_id) if node_id else b""]
            if name:
                nb = self._names.get(name)
                if nb is None:
                    nb = self._names[name] = _field(b"\x12", name.encode())
                parts.append(nb)
            if node_type:
                parts.append(b"\x18" + _SMALL[node_type])
            if ctrl_deps:
                deps = b"".join([varint(v) for v in ctrl_deps])
                parts.append(b"\x22" + varint(len(deps)) + deps)
            if data_deps:
                parts.append(_packed(b"\x2a", data_deps))
            if fields is not None:
                parts.append(fields[1])
            else:
                if start_ns >= 1000:
                    parts.append(b"\x30" + varint(start_ns // 1000))
                if dur_ns >= 1000:
                    parts.append(b"\x38" + varint(dur_ns // 1000))
                a = self._start_key + _int64(start_ns)
                parts.append(b"\x52" + _SMALL[len(a)] + a)
                a = self._dur_key + _int64(dur_ns)
                parts.append(b"\x52" + _SMALL[len(a)] + a)
            cache, keys, add = self._attrs, self._keys, parts.append
            for k, v in (*attrs.items(), *extra) if extra else attrs.items():
                t = type(v)
                if t is int and k in _UNCACHED:  # the common case inline: a per-node integer
                    n: int = v  # type: ignore[assignment]
                    a = (
                        (keys.get(k) or self._key(k))
                        + b"\x48"
                        + (varint(n) if 0 <= n < _INT64 else _int64(n))
                    )
                    add(b"\x52" + _SMALL[len(a)] + a)  # an int64 attribute is shorter than 2**14 bytes
                    continue
                hit = cache.get((k, t, v)) if t is not list else None
                add(hit if hit is not None else self._attr(k, v))
        except (ValueError, OverflowError, UnicodeEncodeError, IndexError, TypeError):
            # what protobuf refuses, it refuses in its own words
            node = TraceNode(
                node_id=node_id,
                name=name,
                node_type=node_type,
                start_ns=start_ns,
                dur_ns=dur_ns,
                ctrl_deps=tuple(ctrl_deps),
                data_deps=tuple(data_deps),
                attrs={**attrs, **dict(extra)},
            )
            return encode_message(to_proto(node))
        body = b"".join(parts)
        return varint(len(body)) + body

    def _key(self, name: str) -> bytes:
        kb = self._keys.get(name)
        if kb is None:
            kb = self._keys[name] = _field(b"\x0a", name.encode())
        return kb

    def _attr(self, name: str, value: AttrValue) -> bytes:
        """``attr`` field (number 10) holding one ``AttributeProto``."""
        kind = type(value)
        if kind is int and name in _UNCACHED:
            return self._int_attr(name, value)  # type: ignore[arg-type]
        key = (name, kind, value)
        try:
            hit = self._attrs.get(key)
        except TypeError:  # a list: not hashable, not cached
            return self._slow_attr(name, value)
        if hit is not None:
            return hit
        if kind is bool:
            enc = _field(b"\x52", self._key(name) + (b"\xd8\x01\x01" if value else b"\xd8\x01\x00"))
        elif kind is int and name in CHAKRA_INT32_ATTRS:  # int32 where it fits: chakra_io's rule, not copied
            enc = self._slow_attr(name, value)
        elif kind is int:
            enc = self._int_attr(name, value)  # type: ignore[arg-type]
        elif kind is str:
            enc = _field(b"\x52", self._key(name) + _field(b"\xea\x01", value.encode()))  # type: ignore[union-attr]
        else:
            enc = self._slow_attr(name, value)
        if len(self._attrs) >= _CACHE_LIMIT:
            self._attrs.clear()
        self._attrs[key] = enc
        return enc

    def _int_attr(self, name: str, value: int) -> bytes:
        return _field(b"\x52", self._key(name) + b"\x48" + _int64(value))

    def _slow_attr(self, name: str, value: AttrValue) -> bytes:
        node = pb.Node()
        set_attr(node, name, value)
        return _field(b"\x52", node.attr[0].SerializeToString())


_START_KEY = _field(b"\x0a", Attr.START_NS.encode())
_DUR_KEY = _field(b"\x0a", Attr.DUR_NS.encode())


def _varints(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of a uint64 array: a (n, 10) byte matrix (row k's first ``lens[k]`` bytes) and ``lens``."""
    out = np.empty((len(v), 10), dtype=np.uint8)
    lens = np.ones(len(v), dtype=np.int64)
    rest = v.copy()
    for k in range(10):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest >>= np.uint64(7)
        more = rest != 0
        out[:, k] = low | (more.astype(np.uint8) << 7)
        lens += more
    return out, lens


class _Rows:
    """Rows of bytes of different lengths, built as segments at fixed columns of a padded byte matrix with a
    mask of the bytes each row has: the masked bytes in row-major order are the rows, one after the other."""

    def __init__(self, n: int, width: int) -> None:
        self.buf = np.zeros((n, width), dtype=np.uint8)
        self.keep = np.zeros((n, width), dtype=bool)
        self.col = 0

    def add(self, present: np.ndarray, prefix: np.ndarray, mat: np.ndarray, lens: np.ndarray) -> None:
        """Append, to the rows where ``present``, their ``prefix`` row (same length for all) and the first
        ``lens`` bytes of their ``mat`` row."""
        c, w, m = self.col, prefix.shape[1], mat.shape[1]
        self.buf[:, c : c + w] = prefix
        self.keep[:, c : c + w] = present[:, None]
        self.buf[:, c + w : c + w + m] = mat
        self.keep[:, c + w : c + w + m] = (np.arange(m)[None, :] < lens[:, None]) & present[:, None]
        self.col = c + w + m

    def split(self) -> list[bytes]:
        data = self.buf[self.keep].tobytes()
        ends = np.cumsum(self.keep.sum(axis=1)).tolist()
        return [data[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _const(n: int, prefix: bytes) -> np.ndarray:
    return np.broadcast_to(np.frombuffer(prefix, dtype=np.uint8), (n, len(prefix)))


def id_and_time_fields(
    node_ids: Sequence[int], start_ns: Sequence[int] | np.ndarray, dur_ns: Sequence[int] | np.ndarray
) -> list[tuple[bytes, bytes]] | None:
    """Per node, its id field and its time fields (``start_time_micros``, ``duration_micros``, then the
    ``skl_start_ns`` and ``skl_dur_ns`` attributes), as :meth:`NodeEncoder.encode` would write them;
    None where a value does not fit int64 (the nodes are then encoded one by one, and refused there)."""
    n = len(node_ids)
    try:
        ids = np.asarray(node_ids, dtype=np.int64)
        start = np.asarray(start_ns, dtype=np.int64)
        dur = np.asarray(dur_ns, dtype=np.int64)
    except OverflowError:
        return None
    if n == 0:
        return []
    if (ids < 0).any():
        return None
    everyone = np.ones(n, dtype=bool)
    head = _Rows(n, 11)
    head.add(ids != 0, _const(n, b"\x08"), *_varints(ids.astype(np.uint64)))
    times = _Rows(n, 2 * 11 + 2 * (2 + max(len(_START_KEY), len(_DUR_KEY)) + 11))
    for tag, v in ((b"\x30", start), (b"\x38", dur)):
        micros = np.maximum(v, 0) // 1000
        times.add(micros != 0, _const(n, tag), *_varints(micros.astype(np.uint64)))
    for key, v in ((_START_KEY, start), (_DUR_KEY, dur)):
        mat, lens = _varints(v.view(np.uint64))  # two's complement of negatives, as protobuf's int64
        prefix = np.empty((n, 2 + len(key) + 1), dtype=np.uint8)
        prefix[:] = np.frombuffer(b"\x52\x00" + key + b"\x48", dtype=np.uint8)
        prefix[:, 1] = len(key) + 1 + lens  # the attribute's length: < 128, one byte
        times.add(everyone, prefix, mat, lens)
    return list(zip(head.split(), times.split(), strict=True))
