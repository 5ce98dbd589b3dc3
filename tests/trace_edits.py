"""Written traces edited for the tests: a trace as an older capture wrote it, without an attribute."""

from __future__ import annotations

from pathlib import Path

from skewlens.profiler.chakra_io import node_attrs, read_et, write_et
from skewlens.profiler.vocab import Attr, CommType


def without_dtype(run: Path, comm_types: frozenset[CommType] | None = None, files: str = "*.et") -> Path:
    """``run`` with ``skl_dtype`` taken off its collectives of ``comm_types`` (all of them where None), as a
    capture that recorded none wrote them; each rank file (of those ``files`` matches) rewritten in place."""
    for path in sorted(run.glob(files)):
        et = read_et(path)
        for node in et.nodes:
            ctype = node_attrs(node).get(Attr.COMM_TYPE)
            if ctype is not None and (comm_types is None or CommType(ctype) in comm_types):
                kept = [a for a in node.attr if a.name != Attr.DTYPE]
                del node.attr[:]
                node.attr.extend(kept)
        write_et(path, et.nodes, et.metadata)
    return run
