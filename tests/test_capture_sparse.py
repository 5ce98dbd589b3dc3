"""gloo's all_reduce of a sparse gradient (DDP over an ``EmbeddingBag(sparse=True)``, a recommender's tables).

gloo's flight recorder names it ``gloo:sparse_all_reduce`` and gives the dense tensor's size; gloo runs it
as all_gathers of each rank's coalesced indices and values. Before, the capture wrote it with comm_type -1,
and ``skewlens check``, ``analyze``, ``export`` and ``replay`` refused the run (``unknown comm_type -1``, one
error per step); now it is an all_reduce of the size the recorder gave, and a note says what gloo moves.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from capture_helpers import ONE_GLOO_RANK, profile_script
from test_capture_hooks import run_script

from skewlens.profiler.capture.flight import sparse_all_reduce_note
from skewlens.profiler.capture.records import CommRecord
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.store.issues import format_bytes
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import Attr, CommType, NodeType, collective_from_op


def _record(op: str, size_bytes: int) -> CommRecord:
    return CommRecord(
        node_type=NodeType.COMM_COLL, op=op, comm_type=collective_from_op(op), pg_name="0", seq=1, src=-1,
        dst=-1, tag=0, numel=size_bytes // 4, dtype="float32", size_bytes=size_bytes, start_ns=0,
        issue_end_ns=0, end_ns=1, is_async=True, thread=1, step=2,
    )  # fmt: skip


def test_gloos_sparse_all_reduce_is_an_all_reduce_not_an_unknown_collective() -> None:
    assert collective_from_op("gloo:sparse_all_reduce") == CommType.ALL_REDUCE


def test_a_sparse_all_reduce_is_noted_as_recorded_at_the_dense_size() -> None:
    dense = _record("gloo:all_reduce", 4096)
    assert sparse_all_reduce_note([dense]) == ""
    note = sparse_all_reduce_note([_record("gloo:sparse_all_reduce", 5_120_000)] * 3 + [dense])
    assert note.startswith("3 sparse all_reduce(s) (gloo:sparse_all_reduce")
    assert "dense tensor's size (4.9 MiB)" in note
    assert "all_gathers each rank's coalesced indices and values" in note
    # a hooked call on a sparse tensor (the full level's path): op c10d::allreduce_, the tensor's dense size
    hooked = replace(_record("c10d::allreduce_", 32_000), sparse=True)
    assert sparse_all_reduce_note([hooked, dense]).startswith("1 sparse all_reduce(s)")


def test_sparse_all_reduces_of_several_sizes_are_noted_with_the_range_of_their_dense_sizes() -> None:
    # two sparse=True tables, 1,000 x 8 and 5,000 x 256 float32: the note gives the smallest to the largest
    small, large = 1000 * 8 * 4, 5000 * 256 * 4
    note = sparse_all_reduce_note([_record("gloo:sparse_all_reduce", b) for b in (large, small, large)])
    assert note.startswith("3 sparse all_reduce(s)")
    assert f"dense tensor's size ({format_bytes(small)}-{format_bytes(large)})" in note


HOOKED = (
    ONE_GLOO_RANK
    + """
from skewlens.profiler.capture import flight, hooks as H
hooks = H.CommHooks(lambda: True, lambda: 0, ddp=False)
hooks.install()
table = torch.sparse_coo_tensor([[1, 7]], torch.ones(2, 8), (1000, 8)).coalesce()
dist.all_reduce(table)                                # a sparse=True embedding's gradient
dist.all_reduce(torch.ones(300))
dist.barrier()                                        # no tensor at all
recs = hooks.flush()
hooks.uninstall()
print(json.dumps({"calls": [[r.op, r.size_bytes, r.sparse] for r in recs],
                  "note": flight.sparse_all_reduce_note(recs)}))
dist.destroy_process_group()
"""
)


def test_a_hooked_all_reduce_of_a_sparse_tensor_and_only_it_is_marked_sparse_and_noted() -> None:
    # the full level's path: the hooks see c10d::allreduce_ with the sparse tensor's dense size
    data = run_script(HOOKED)
    dense = 1000 * 8 * 4
    assert data["calls"] == [
        ["c10d::allreduce_", dense, True],
        ["c10d::allreduce_", 300 * 4, False],
        ["c10d::barrier", 0, False],
    ]
    assert data["note"].startswith("1 sparse all_reduce(s) (gloo:sparse_all_reduce, a sparse=True")
    assert f"dense tensor's size ({format_bytes(dense)})" in data["note"]


def test_the_sparse_note_reads_an_ops_base_name_as_its_collective_type_does() -> None:
    # spelled as c10d spells its ops (a trailing _, capitals): an all_reduce by collective_from_op, so a
    # sparse one by the note too
    for op in ("gloo:sparse_all_reduce_", "gloo:Sparse_All_Reduce"):
        record = _record(op, 5_120_000)
        assert record.comm_type == CommType.ALL_REDUCE
        assert sparse_all_reduce_note([record]).startswith("1 sparse all_reduce(s)"), op


SCRIPT = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
r = dist.get_rank()
emb = DDP(torch.nn.EmbeddingBag(1000, 8, mode="sum", sparse=True))
opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)
for step in range(4):
    g = torch.Generator().manual_seed(10 * step + r)
    idx = torch.randint(0, 1000, ((r + 1) * 20,), generator=g)  # rank 1 looks up twice as many rows
    emb(idx, torch.tensor([0, 5])).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("level", ["collectives", "full"])
def test_a_ddp_sparse_embeddings_all_reduce_is_captured_as_an_all_reduce_the_run_check_accepts(
    tmp_path: Path, level: str
) -> None:
    # collectives (and ops): the flight recorder's gloo:sparse_all_reduce, before comm_type -1; full: the
    # hooked c10d::allreduce_ through DDP's allreduce_hook, before a dense all_reduce with no note
    run, res = profile_script(tmp_path, SCRIPT, nproc=2, steps="1:1:2", level=level)
    assert res.returncode == 0, res.stderr[-3000:]
    name = "gloo:sparse_all_reduce" if level == "collectives" else "c10d::allreduce_"
    for r in (0, 1):
        sparse = [a for n in read_et(run / f"rank-{r}.et").nodes if n.name == name for a in [node_attrs(n)]]
        # one per recorded step (2, 3), the dense table's 1000 x 8 float32 on both ranks
        assert [(a[Attr.COMM_TYPE], a[Attr.COMM_SIZE]) for a in sparse] == [
            (int(CommType.ALL_REDUCE), 32_000)
        ] * 2
    notes = read_manifest(run).notes
    assert notes["rank 0 communication sizes"].startswith("2 sparse all_reduce(s)")
    # before: ValidationError "collective node ... has unknown comm_type -1", one per recorded step
    trace = load_validated(run)
    assert sorted(i.comm_type for i in trace.collectives) == [CommType.ALL_REDUCE] * 2
