"""A trace read the way Chakra's tools read it: Chakra's ``protolib`` into Chakra's own ``et_def_pb2``."""

from __future__ import annotations

from pathlib import Path

from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd


def read_with_chakra(path: Path) -> tuple[GlobalMetadata, list[Node]]:
    """The global metadata and the nodes of ``path``, decoded by Chakra's reader."""
    fh = openFileRd(str(path))
    try:
        gm = GlobalMetadata()
        assert decodeMessage(fh, gm), f"{path}: no global metadata"
        nodes = []
        node = Node()
        while decodeMessage(fh, node):
            nodes.append(node)
            node = Node()
    finally:
        fh.close()
    return gm, nodes
