"""The full level's host facts from torch.profiler itself: operator schemas and data dependencies.

PyTorch's ExecutionTraceObserver formats every operator's inputs and outputs as JSON while the program
runs (about 30 µs per operator on a small CPU model: +40% step time for the bundled example). The
profiler that the ``ops`` level runs anyway can record the same facts far more cheaply when asked for
inputs (``record_shapes``), allocations (``profile_memory``) and overload names; its operator tree then
gives, after the window:

- the **schema** of an operator: its name and overload name looked up in the dispatcher
  (``torch._C._get_schema``), the string the observer writes (``aten::add_.Tensor(Tensor(a!) self, ...)``);
- what it **reads**: the storage (allocation id) of each tensor input, so views of one buffer are the same
  data, as they are for the dependency;
- what it **writes**: storages allocated inside it (its results and temporaries) and inputs its schema
  marks as written (``Tensor(a!)``: in-place and ``out=`` variants), also those of the operators it calls;
  a ``c10d::`` collective writes its ``tensors`` / ``output*`` arguments (their schemas carry no alias
  annotation), except ``send``.

Limits (also in docs/capture.md): arguments the profiler does not record as tensors (nested tensor
lists such as ``all_gather``'s ``Tensor[][]`` outputs) are not seen; scalar values are not kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from skewlens.profiler.capture.build import HostOpInfo

#: Readable names of dtypes as PyTorch's execution trace writes them (``Tensor(float)``).
_C10_NAMES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "int64": "long int",
    "int32": "int",
    "int16": "short int",
    "int8": "signed char",
    "uint8": "unsigned char",
    "bool": "bool",
    "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>",
}


@cache
def schema_of(name: str, overload: str) -> tuple[str, frozenset[int]]:
    """``(schema string, indexes of the arguments it writes)`` of a dispatcher operator; ``("", {})``
    for names the dispatcher does not know (scopes such as ``DistributedDataParallel.forward``)."""
    import torch

    try:
        schema = torch._C._get_schema(name, overload)
    except RuntimeError:
        return "", frozenset()
    args = list(schema.arguments)
    if name.startswith("c10d::"):
        written = (
            frozenset()
            if name == "c10d::send"
            else frozenset(
                i for i, a in enumerate(args) if a.name == "tensors" or a.name.startswith("output")
            )
        )
    else:
        written = frozenset(
            i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write
        )
    return str(schema), written


def _is_tensor(v: Any) -> bool:
    return hasattr(v, "allocation_id") and hasattr(v, "sizes")


def _storages(v: Any) -> list[int]:
    """Allocation ids of a tensor input or a list of them."""
    items = v if isinstance(v, list) else [v]
    out = []
    for t in items:
        if _is_tensor(t):
            a = t.allocation_id
            if a is not None:
                out.append(int(a))
    return out


def _type_of(v: Any, recorded: str) -> str:
    if _is_tensor(v):
        dtype = str(v.dtype).removeprefix("torch.")
        return f"Tensor({_C10_NAMES.get(dtype, dtype)})"
    if isinstance(v, list):
        return "GenericList[" + ",".join(_type_of(t, "") for t in v) + "]"
    if isinstance(v, bool):
        return "Bool"
    if isinstance(v, int):
        return "Int"
    if isinstance(v, float):
        return "Double"
    if isinstance(v, complex):
        return "ComplexDouble"
    return "ScalarList" if recorded == "ScalarList" else "None"


def _shape_of(v: Any) -> Any:
    if _is_tensor(v):
        return list(v.sizes)
    if isinstance(v, list):
        return [_shape_of(t) for t in v]
    return []


def _tag(ev: Any) -> str:
    return str(getattr(ev.tag, "name", ev.tag))


def host_facts(
    roots: Iterable[Any], recorded_types: Mapping[int, Sequence[str]] | None = None
) -> dict[int, HostOpInfo]:
    """Correlation id -> :class:`HostOpInfo` for every operator of the profiler's event tree.

    ``roots`` are the tree's top events (``kineto_results.experimental_event_tree()``);
    ``recorded_types`` the profiler's per-input type names by correlation id (``KinetoEvent.dtypes()``),
    which tell a list of scalars from a missing argument.
    """
    types_by_corr = recorded_types or {}
    out: dict[int, HostOpInfo] = {}
    # iterative post-order walk: a node's writes include those of everything it called
    stack: list[tuple[Any, bool]] = [(r, False) for r in roots]
    writes: dict[int, set[int]] = {}
    while stack:
        ev, done = stack.pop()
        if not done:
            stack.append((ev, True))
            stack.extend((c, False) for c in ev.children)
            continue
        if _tag(ev) != "TorchOp":
            continue
        fields = ev.extra_fields
        inputs = list(fields.inputs)
        schema, written = schema_of(ev.name, ev.overload_name)
        reads: list[int] = []
        for v in inputs:
            reads.extend(_storages(v))
        wrote: set[int] = set()
        for i in written:
            if i < len(inputs):
                wrote.update(_storages(inputs[i]))
        for child in ev.children:
            tag = _tag(child)
            if tag == "TorchOp":
                wrote |= writes.pop(int(child.correlation_id), set())
            elif tag == "Allocation":
                alloc = child.extra_fields
                if alloc.alloc_size > 0 and alloc.allocation_id is not None:
                    wrote.add(int(alloc.allocation_id))
        writes[int(ev.correlation_id)] = wrote
        recorded = list(types_by_corr.get(ev.correlation_id, ()))
        recorded += [""] * (len(inputs) - len(recorded))
        out[int(ev.correlation_id)] = HostOpInfo(
            schema=schema,
            inputs=tuple(dict.fromkeys(reads)),
            outputs=tuple(sorted(wrote)),
            shapes=json.dumps([_shape_of(v) for v in inputs]),
            types=json.dumps([_type_of(v, r) for v, r in zip(inputs, recorded, strict=False)]),
        )
    return out
