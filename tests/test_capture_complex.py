"""Complex tensors captured end to end on 2 gloo ranks: torch passes a complex tensor to the process group
as real (``view_as_real``: ``float32`` with twice the elements for ``complex64``), so the flight recorder's
entry has the real dtype; the trace keeps the program's (``skl_dtype``, ``skl_numel``), the Parquet export
carries it, and a real replay re-issues the collectives with it and the same bytes."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from capture_helpers import profile_script
from rich.console import Console

from skewlens.cli.store import export_main
from skewlens.profiler.chakra_io import iter_nodes, node_attrs
from skewlens.profiler.vocab import Attr, CommType
from skewlens.replay.config import RealConfig
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.real.api import real_replay

SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
w = torch.nn.Parameter(torch.randn(8, 8))
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(5):
    (torch.randn(4, 8) @ w).sum().backward()
    opt.step()
    opt.zero_grad()
    dist.all_to_all_single(torch.empty(16, dtype=torch.complex64), torch.ones(16, dtype=torch.complex64))
    dist.all_reduce(torch.ones(10, dtype=torch.complex128))
dist.destroy_process_group()
"""

#: Per collective type: (skl_dtype, skl_numel, comm_size) as the program issued it.
WANT = {CommType.ALL_TO_ALL: ("complex64", 16, 128), CommType.ALL_REDUCE: ("complex128", 10, 160)}


def _comms(run_dir: Path) -> dict[int, list[tuple[object, ...]]]:
    """Per rank, each collective's (comm_type, skl_dtype, skl_numel, comm_size) in file order."""
    return {
        r: [
            (a["comm_type"], a.get(Attr.DTYPE), a.get(Attr.NUMEL), a.get("comm_size"))
            for a in (node_attrs(n) for _o, n in iter_nodes(run_dir / f"rank-{r}.et"))
            if a.get("comm_type") in WANT
        ]
        for r in range(2)
    }


@pytest.mark.slow
def test_complex_collectives_keep_the_programs_dtype_in_the_trace_the_export_and_a_real_replay(
    tmp_path: Path,
) -> None:
    # before: at the collectives level (the lean path, sizes from the recorder) the all_to_all of 16
    # complex64 was recorded as 32 float32 and the all_reduce of 10 complex128 as 20 float64 (bytes right)
    run_dir, res = profile_script(tmp_path, SCRIPT, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    captured = _comms(run_dir)
    for nodes in captured.values():
        assert len(nodes) == 6
        assert all((dt, n, b) == WANT[CommType(t)] for t, dt, n, b in nodes)
    assert (
        export_main([str(run_dir), "--workers", "1", "--no-progress"], console=Console(file=io.StringIO()))
        == 0
    )
    rows = pq.read_table(run_dir / "parquet" / "collectives.parquet").to_pylist()
    assert sorted({(r["dtype"], r["comm_bytes"]) for r in rows}) == [("complex128", 160), ("complex64", 128)]
    # a real replay issues them with that dtype (before: uint8, 128 and 160 elements) and the same bytes
    real_replay(run_dir=run_dir, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=RealConfig(timeout_s=20))
    assert _comms(tmp_path / "out" / "run") == captured


def test_the_lean_paths_look_names_a_complex_first_input_of_a_tensor_or_a_list_and_nothing_else() -> None:
    import torch

    from skewlens.profiler.capture.hooks import _complex_dtype

    z, w, r = (torch.zeros(3, dtype=d) for d in (torch.complex64, torch.complex128, torch.float32))
    first = ("tensor", 0)
    assert _complex_dtype((z,), {}, first) == "complex64"
    assert _complex_dtype((), {"tensor": w}, first) == "complex128"  # by name
    assert _complex_dtype(([w, r],), {}, first) == "complex128"  # a list's first tensor
    assert _complex_dtype(((r, z),), {}, first) == ""
    assert _complex_dtype(([],), {}, first) == ""
    assert _complex_dtype((r,), {}, first) == ""
    assert _complex_dtype((z,), {}, None) == ""  # a call without inputs (a barrier)


def test_a_real_replay_sizes_complex_elements_as_torch_does() -> None:
    import torch

    from skewlens.replay.real.plan import element_bytes, normalise_dtype

    for dtype in (torch.complex64, torch.complex128):
        name = str(dtype).removeprefix("torch.")
        assert normalise_dtype(name) == name  # not uint8, a dtype the worker allocates
        assert element_bytes(name) == torch.zeros(1, dtype=dtype).element_size()
