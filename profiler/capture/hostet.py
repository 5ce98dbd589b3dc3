"""The host execution trace (torch.profiler.ExecutionTraceObserver, full level): schemas and tensor ids.

The observer's JSON is read with bounds (file size, node count); a node's tensors are
``[tensor_id, storage_id, offset, numel, element_size, device]`` lists in ``inputs.values`` /
``outputs.values``. Facts are keyed by record-function id (the ``rf_id`` attribute), which joins them to
Kineto's ``Record function id``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skewlens.profiler.bounded import read_json_bounded
from skewlens.profiler.capture.build import HostOpInfo
from skewlens.profiler.errors import CaptureError

MAX_HOST_ET_BYTES = 2 * 1024 * 1024 * 1024
MAX_HOST_ET_NODES = 20_000_000


def _tensor_ids(values: Any, types: Any) -> tuple[int, ...]:
    out: list[int] = []
    if not isinstance(values, list) or not isinstance(types, list):
        return ()
    for v, t in zip(values, types, strict=False):
        if (
            isinstance(t, str)
            and t.startswith("Tensor(")
            and isinstance(v, list)
            and v
            and isinstance(v[0], int)
        ):
            out.append(v[0])
        elif isinstance(t, str) and t.startswith("GenericList[Tensor") and isinstance(v, list):
            out.extend(x[0] for x in v if isinstance(x, list) and x and isinstance(x[0], int))
    return tuple(out)


def parse_host_et(path: Path) -> dict[int, HostOpInfo]:
    """Record-function id -> :class:`HostOpInfo` for every operator node of a host execution trace."""
    data = read_json_bounded(path, MAX_HOST_ET_BYTES, error=CaptureError, what="host execution trace")
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        raise CaptureError(f"{path}: host execution trace has no 'nodes' list")
    if len(nodes) > MAX_HOST_ET_NODES:
        raise CaptureError(f"{path}: host execution trace has {len(nodes)} nodes (limit {MAX_HOST_ET_NODES})")
    out: dict[int, HostOpInfo] = {}
    for n in nodes:
        if not isinstance(n, dict):
            continue
        attrs = {a.get("name"): a.get("value") for a in n.get("attrs", []) if isinstance(a, dict)}
        rf = attrs.get("rf_id")
        if not isinstance(rf, int):
            continue
        ins_raw, outs_raw = n.get("inputs"), n.get("outputs")
        ins: dict[str, Any] = ins_raw if isinstance(ins_raw, dict) else {}
        outs: dict[str, Any] = outs_raw if isinstance(outs_raw, dict) else {}
        out[rf] = HostOpInfo(
            schema=str(attrs.get("op_schema") or ""),
            inputs=_tensor_ids(ins.get("values"), ins.get("types")),
            outputs=_tensor_ids(outs.get("values"), outs.get("types")),
            shapes=json.dumps(ins.get("shapes", [])),
            types=json.dumps(ins.get("types", [])),
        )
    return out
