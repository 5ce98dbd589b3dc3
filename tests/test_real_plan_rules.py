"""The real replay's plan, rule by rule (in-process, no torch ranks): each test holds one rule of
``skewlens.replay.real.plan`` that no other test held (mutation round 42)."""

from __future__ import annotations

from pathlib import Path

from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.real.plan import KIND_COLL, KIND_NESTED, ReplayOp, rank_plan

MS = 1_000_000


def test_communication_that_ends_the_rank_is_re_issued_as_a_blocking_call(tmp_path: Path) -> None:
    # no op follows the all_reduce: the rank ends when it completes, so it is issued blocking, as the one
    # after it (which the next op does not wait for) is not
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 2 * MS, start_ns=0)
        first = rb.collective(CommType.ALL_REDUCE, 1024, 5 * MS, start_ns=2 * MS, stream=1000)
        rb.compute("aten::add", MS, start_ns=3 * MS)
        rb.collective(CommType.ALL_REDUCE, 1024, MS, start_ns=8 * MS, deps=(first,))
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert [(o.name, o.blocking) for o in ops if o.kind == KIND_COLL] == [
        ("c10d::all_reduce_", False),
        ("c10d::all_reduce_", True),
    ]
    assert ops[-1].kind == KIND_COLL


def test_each_recorded_dtype_is_issued_as_the_torch_dtype_it_names_and_one_the_worker_lacks_as_bytes(
    tmp_path: Path,
) -> None:
    # Kineto names element types Float, Long, Byte (the shared nccl_2gpu trace records all three, which an
    # imported run keeps): the plan took them for names the worker lacks and issued every such collective
    # as uint8; a capture writes float32, a hand-made trace may write torch.bfloat16
    recorded = ["torch.bfloat16", "float8_e4m3fn", "Float", "Long", "Byte", ""]
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        for k, dtype in enumerate(recorded):
            rb.collective(CommType.ALL_REDUCE, 4096 * (k + 1), MS, start_ns=2 * k * MS, dtype=dtype)
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[1], run, NO_EFFECTS)
    assert [(o.dtype, o.comm_bytes) for o in ops] == [
        ("bfloat16", 4096),
        ("uint8", 8192),  # float8: no dtype of the worker's, its bytes are what the replay moves
        ("float32", 12288),
        ("int64", 16384),
        ("uint8", 20480),
        ("float32", 24576),  # none recorded
    ]


def test_a_kernel_launched_after_two_host_ops_is_planned_at_the_later_launch_call(tmp_path: Path) -> None:
    # the kernel depends on aten::mm (0-10 ms, its launch call at 15 ms clipped to mm's end: 10 ms) and on
    # aten::copy_ (12-20 ms on another thread, the call at 15 ms inside it): keyed by the later of the two
    # (15 ms), it comes after aten::add, which started at 13 ms, not right after aten::copy_ (at 10 ms)
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    mm = rb.compute("aten::mm", 10 * MS, start_ns=0)
    cp = rb.compute("aten::copy_", 8 * MS, start_ns=12 * MS, stream=1)
    rb.compute("aten::add", MS, start_ns=13 * MS, stream=2)
    rb.compute("gemm_kernel", 2 * MS, start_ns=21 * MS, stream=7, deps=(mm, cp), launch_ns=15 * MS)
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert [o.name for o in ops] == ["aten::mm", "aten::copy_", "aten::add", "gemm_kernel"]


#: The plan of :func:`_item_plan`'s run: the copy, then ``aten::item``, which waits for it, then what item
#: holds (its nested op, then, with ``issue``, the all_reduce issued inside it), then ``aten::add``.
_ITEM_ORDER = ["aten::mul", "Memcpy DtoH", "aten::item", "aten::_local_scalar_dense", "aten::add"]


def _item_plan(run_dir: Path, *, issue: bool) -> tuple[dict[str, int], list[ReplayOp]]:
    """Rank 0's rows by name and plan, of 2 ranks: ``aten::mul`` (0-5 ms), then ``aten::item`` (10-20 ms)
    with ``_local_scalar_dense`` nested in it (11-19 ms), which launches a DtoH copy at 15 ms (15-18 ms on
    the device) that ``aten::item`` then waits for (``skl_launched_in``), then ``aten::add``; with
    ``issue``, an all_reduce following ``aten::mul`` is issued 12 ms in, inside the nested op (before the
    copy's launch call)."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        mul = rb.compute("aten::mul", 5 * MS, start_ns=0)
        item = rb.compute("aten::item", 10 * MS, start_ns=10 * MS)
        rb.compute("aten::_local_scalar_dense", 8 * MS, start_ns=11 * MS)
        if issue:
            rb.collective(CommType.ALL_REDUCE, 1024, 2 * MS, start_ns=12 * MS, stream=1000, deps=(mul,))
        rb.compute("Memcpy DtoH", 3 * MS, start_ns=15 * MS, stream=7, launch_ns=15 * MS, launched_in=item)
        rb.compute("aten::add", MS, start_ns=21 * MS)
    run = load_run(b.write(run_dir))
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    assert rt.launched_in is not None and rt.launched_in[row["Memcpy DtoH"]] == row["aten::item"]
    return row, rank_plan(rt, run, NO_EFFECTS)


def test_an_op_nested_in_item_is_planned_after_item_which_comes_after_the_copy_it_waits_for(
    tmp_path: Path,
) -> None:
    # item waits for the copy launched inside it, so it is planned after the copy (keyed by its launch
    # call, 15 ms); the op nested in item starts at 11 ms, before that call, but takes its times from item:
    # it comes after item, not first by its start (where the worker would read item's times before item ran)
    row, ops = _item_plan(tmp_path / "run", issue=False)
    assert [o.name for o in ops] == _ITEM_ORDER
    item, nested = ops[2], ops[3]
    assert item.wait_deps == (row["Memcpy DtoH"],)
    assert (nested.kind, nested.parent) == (KIND_NESTED, row["aten::item"])


def test_communication_issued_inside_item_before_its_copys_launch_is_issued_during_item(
    tmp_path: Path,
) -> None:
    # the all_reduce began 12 ms in, inside the op nested in item, before the copy's launch call (15 ms):
    # it is issued from inside item (2 ms after item starts), so it comes after item, which issues it,
    # not first by its start, before the copy and item (where the worker would issue it without item's start)
    row, ops = _item_plan(tmp_path / "run", issue=True)
    assert [o.name for o in ops] == [*_ITEM_ORDER[:4], "c10d::all_reduce_", _ITEM_ORDER[4]]
    item, coll = ops[2], ops[4]
    assert item.issues_inside == (row["c10d::all_reduce_"],)
    assert (coll.issued_in, coll.issue_off_ns, coll.blocking) == (row["aten::item"], 2 * MS, False)
