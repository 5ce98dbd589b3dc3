"""Which torch.distributed call the real replay issues for each recorded op (in-process, a fake ``dist``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.real import ops as real_ops
from skewlens.replay.real.ops import CommIssuer
from skewlens.replay.real.plan import KIND_COLL, ReplayOp, rank_plan

MS = 1_000_000


class FakeDist:
    """Records each call as (function, {argument: shape, or list of shapes, or value})."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, backend: str = "gloo", world: int = 2) -> None:
        self.backend, self.world = backend, world
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def get_world_size(self) -> int:
        return self.world

    def get_backend(self, group: Any = None) -> str:
        return self.backend

    def __getattr__(self, fn: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> str:
            seen = {f"arg{k}": _shape(a) for k, a in enumerate(args)}
            self.calls.append((fn, {**seen, **{k: _shape(v) for k, v in kwargs.items()}}))
            return fn

        return call


def _shape(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if isinstance(v, list):
        return [_shape(x) for x in v]
    return v


def _coll(name: str, ct: CommType, nbytes: int, **kw: Any) -> ReplayOp:
    return ReplayOp(
        row=0, node_id=1, name=name, kind=KIND_COLL, step=0, dur_ns=0, deps=(), gap_ns=0, delay_ns=0,
        comm_type=int(ct), pg_name="0", seq=0, comm_bytes=nbytes, dtype="float32", **kw,
    )  # fmt: skip


def _issued(monkeypatch: pytest.MonkeyPatch, op: ReplayOp, *, blocking: bool, backend: str = "gloo") -> Any:
    fake = FakeDist(backend)
    monkeypatch.setattr(real_ops, "dist", fake)
    CommIssuer(0, torch.device("cpu"), {}, "0").issue(op, blocking=blocking)
    [call] = fake.calls
    return call


def test_a_list_all_gather_is_reissued_as_a_list_all_gather_not_all_gather_into_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fn, args = _issued(monkeypatch, _coll("c10d::allgather_", CommType.ALL_GATHER, 2000), blocking=True)
    assert fn == "all_gather"
    assert args["arg0"] == [(500,), (500,)] and args["arg1"] == (500,) and args["async_op"] is False


def test_a_list_reduce_scatter_is_reissued_as_a_list_reduce_scatter(monkeypatch: pytest.MonkeyPatch) -> None:
    op = _coll("c10d::reduce_scatter_", CommType.REDUCE_SCATTER, 2000)
    fn, args = _issued(monkeypatch, op, blocking=False)
    assert fn == "reduce_scatter"
    assert args["arg0"] == (250,) and args["arg1"] == [(250,), (250,)] and args["async_op"] is True


@pytest.mark.parametrize(("rank", "mine"), [(0, 17), (2, 16)])
def test_a_list_reduce_scatter_of_uneven_parts_moves_all_its_recorded_bytes(
    monkeypatch: pytest.MonkeyPatch, rank: int, mine: int
) -> None:
    # gloo's list reduce_scatter takes parts of any size: a script's of 19, 15 and 16 floats on 3 ranks
    # records 200 B on each. Before, the replay issued 3 parts of 200 // 4 // 3 = 16 floats, 192 B.
    fake = FakeDist(world=3)
    monkeypatch.setattr(real_ops, "dist", fake)
    op = _coll("c10d::reduce_scatter_", CommType.REDUCE_SCATTER, 200)
    CommIssuer(rank, torch.device("cpu"), {}, "0").issue(op, blocking=True)
    [(fn, args)] = fake.calls
    assert fn == "reduce_scatter"
    assert args["arg1"] == [(17,), (17,), (16,)] and args["arg0"] == (mine,)


@pytest.mark.parametrize(("rank", "mine"), [(1, 3), (2, 3), (3, 2), (4, 2)])
def test_each_member_of_a_subgroup_takes_its_own_part_of_an_uneven_list_reduce_scatter(
    monkeypatch: pytest.MonkeyPatch, rank: int, mine: int
) -> None:
    # 10 floats on the group of ranks 1-4: parts of 3, 3, 2 and 2, the larger first, by each member's place
    # in the group (rank 1 the first), not its global rank; and never torch.chunk's 3, 3, 3 and 1, which
    # gives the last member a part the others do not expect
    fake = FakeDist(world=5)
    monkeypatch.setattr(real_ops, "dist", fake)
    op = replace(_coll("c10d::reduce_scatter_", CommType.REDUCE_SCATTER, 40), pg_name="1")
    CommIssuer(rank, torch.device("cpu"), {"1": ("g", (1, 2, 3, 4))}, "0").issue(op, blocking=True)
    [(fn, args)] = fake.calls
    assert fn == "reduce_scatter" and args["group"] == "g"
    assert args["arg1"] == [(3,), (3,), (2,), (2,)] and args["arg0"] == (mine,)


def test_a_list_all_to_all_is_reissued_as_a_list_all_to_all_with_its_recorded_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op = _coll("c10d::alltoall_", CommType.ALL_TO_ALL, 800, send_splits=(40, 120), recv_splits=(40, 20))
    fn, args = _issued(monkeypatch, op, blocking=True, backend="nccl")
    assert fn == "all_to_all"
    assert args["arg0"] == [(10,), (5,)] and args["arg1"] == [(10,), (30,)]
    even = _coll("c10d::alltoall_", CommType.ALL_TO_ALL, 800)
    assert _issued(monkeypatch, even, blocking=True)[1]["arg1"] == [(100,), (100,)]


@pytest.mark.parametrize(
    ("send", "recv", "parts"),
    [
        ((40, 120), (40, 20), ([10, 30], [10, 5])),  # parts of three sizes
        ((40, 40), (40, 20), ([10, 10], [10, 5])),  # and of two
    ],
)
def test_an_uneven_list_all_to_all_on_gloo_which_takes_equal_parts_only_is_issued_as_all_to_all_single(
    monkeypatch: pytest.MonkeyPatch,
    send: tuple[int, int],
    recv: tuple[int, int],
    parts: tuple[list[int], ...],
) -> None:
    op = _coll("c10d::alltoall_", CommType.ALL_TO_ALL, 800, send_splits=send, recv_splits=recv)
    fn, args = _issued(monkeypatch, op, blocking=True)
    assert fn == "all_to_all_single"
    assert (args["input_split_sizes"], args["output_split_sizes"]) == parts


def test_a_monitored_barrier_is_reissued_as_one_on_gloo_and_as_a_barrier_where_it_cannot_be(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op = _coll("c10d::monitored_barrier", CommType.BARRIER, 0)
    assert _issued(monkeypatch, op, blocking=True)[0] == "monitored_barrier"
    assert _issued(monkeypatch, op, blocking=True, backend="nccl")[0] == "barrier"
    assert _issued(monkeypatch, op, blocking=False) == ("barrier", {"group": None, "async_op": True})


def test_single_tensor_collectives_keep_their_single_tensor_form(monkeypatch: pytest.MonkeyPatch) -> None:
    ag = _coll("c10d::_allgather_base_", CommType.ALL_GATHER, 2000)
    assert _issued(monkeypatch, ag, blocking=True)[0] == "all_gather_into_tensor"
    rs = _coll("c10d::_reduce_scatter_base_", CommType.REDUCE_SCATTER, 2000)
    assert _issued(monkeypatch, rs, blocking=True)[0] == "reduce_scatter_tensor"
    bar = _coll("c10d::barrier", CommType.BARRIER, 0)
    assert _issued(monkeypatch, bar, blocking=True)[0] == "barrier"


def test_the_recorded_reduce_op_is_reissued_where_the_backend_and_dtype_take_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    red = torch.distributed.ReduceOp
    ar = _coll("c10d::allreduce_", CommType.ALL_REDUCE, 4000, reduce_op="max")
    assert _issued(monkeypatch, ar, blocking=True)[1]["op"] == red.MAX
    rd = _coll("c10d::reduce_", CommType.REDUCE, 4000, reduce_op="product", root=1)
    assert _issued(monkeypatch, rd, blocking=True)[1]["op"] == red.PRODUCT
    rs = _coll("c10d::reduce_scatter_", CommType.REDUCE_SCATTER, 2000, reduce_op="min")
    assert _issued(monkeypatch, rs, blocking=True)[1]["op"] == red.MIN
    rst = _coll("c10d::_reduce_scatter_base_", CommType.REDUCE_SCATTER, 2000, reduce_op="min")
    assert _issued(monkeypatch, rst, blocking=True)[1]["op"] == red.MIN
    avg = _coll("c10d::_reduce_scatter_base_", CommType.REDUCE_SCATTER, 2000, reduce_op="avg")  # FSDP2's
    assert _issued(monkeypatch, avg, blocking=True)[1]["op"] == red.AVG
    pre = _coll("c10d::allreduce_", CommType.ALL_REDUCE, 4000, reduce_op="premul_sum")  # its factor unknown
    assert _issued(monkeypatch, pre, blocking=True)[1]["op"] == red.SUM  # gloo has none
    assert _issued(monkeypatch, pre, blocking=True, backend="nccl")[1]["op"] == red.AVG
    band = _coll("c10d::allreduce_", CommType.ALL_REDUCE, 4000, reduce_op="band")  # float32: no bitwise op
    assert _issued(monkeypatch, band, blocking=True)[1]["op"] == red.SUM


def test_the_plan_takes_each_reduce_op_from_the_trace_and_sum_where_it_records_none(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, 1024, MS, start_ns=0, reduce_op="max")
        rb.collective(CommType.ALL_REDUCE, 1024, MS, reduce_op="bogus")
        rb.collective(CommType.ALL_REDUCE, 1024, MS)  # a trace written before skl_reduce_op
        rb.collective(CommType.ALL_REDUCE, 1024, MS, reduce_op="premul_sum")  # the worker chooses for it
        rb.collective(CommType.REDUCE_SCATTER, 1024, MS, reduce_op="avg")
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[1], run, NO_EFFECTS)
    assert [o.reduce_op for o in ops] == ["max", "sum", "sum", "premul_sum", "avg"]


def test_a_coalesced_all_reduce_is_reissued_as_one_with_its_reduce_op_and_its_bytes_in_one_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op = _coll("c10d::allreduce_coalesced_", CommType.ALL_REDUCE, 120, reduce_op="max")
    fn, args = _issued(monkeypatch, op, blocking=False)
    assert fn == "all_reduce_coalesced"
    assert (
        args["arg0"] == [(30,)] and args["op"] == torch.distributed.ReduceOp.MAX and args["async_op"] is True
    )


def test_a_bitwise_reduce_op_is_reissued_on_integers_and_as_sum_on_floats_which_cannot_take_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    red = torch.distributed.ReduceOp
    for name, want in (("band", red.BAND), ("bor", red.BOR), ("bxor", red.BXOR)):
        floats = _coll("c10d::allreduce_", CommType.ALL_REDUCE, 4000, reduce_op=name)
        assert _issued(monkeypatch, floats, blocking=True)[1]["op"] == red.SUM, name
        ints = replace(floats, dtype="int64")
        fn, args = _issued(monkeypatch, ints, blocking=True)
        assert (fn, args["arg0"], args["op"]) == ("all_reduce", (500,), want), name


def test_an_average_of_integers_is_reissued_as_a_sum_on_gloo_which_fails_to_divide_them_and_kept_on_nccl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    red = torch.distributed.ReduceOp
    avg = _coll("c10d::allreduce_", CommType.ALL_REDUCE, 4000, reduce_op="avg")
    for dtype, on_gloo in (("int32", red.SUM), ("uint8", red.SUM), ("bfloat16", red.AVG), ("float", red.AVG)):
        of = replace(avg, dtype=dtype)
        assert _issued(monkeypatch, of, blocking=True)[1]["op"] == on_gloo, dtype
        assert _issued(monkeypatch, of, blocking=True, backend="nccl")[1]["op"] == red.AVG, dtype
    rd = replace(_coll("c10d::reduce_", CommType.REDUCE, 4000, reduce_op="avg", root=1), dtype="int64")
    assert _issued(monkeypatch, rd, blocking=True)[1]["op"] == red.SUM


class _DistWithoutCoalesced(FakeDist):
    """A torch whose ``torch.distributed`` no longer has the deprecated ``all_reduce_coalesced``."""

    def __getattr__(self, fn: str) -> Any:
        if fn == "all_reduce_coalesced":
            raise AttributeError(fn)
        return super().__getattr__(fn)


def test_a_coalesced_all_reduce_on_a_torch_without_it_is_reissued_as_one_all_reduce_of_its_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _DistWithoutCoalesced()
    monkeypatch.setattr(real_ops, "dist", fake)
    op = _coll("c10d::allreduce_coalesced_", CommType.ALL_REDUCE, 120, reduce_op="max")
    CommIssuer(0, torch.device("cpu"), {}, "0").issue(op, blocking=False)
    [(fn, args)] = fake.calls
    assert (fn, args["arg0"], args["op"], args["async_op"]) == (
        "all_reduce",
        (30,),
        torch.distributed.ReduceOp.MAX,
        True,
    )


def test_a_list_all_to_all_without_recorded_splits_receives_each_members_recorded_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no splits recorded, but each member's call size (member_bytes): rank 1 gave 400 B, so a part of it
    # (100 floats / 2) is what this rank receives from it; what it sends is its own 800 B in equal parts
    op = _coll("c10d::alltoall_", CommType.ALL_TO_ALL, 800, member_bytes=(800, 400))
    fn, args = _issued(monkeypatch, op, blocking=True, backend="nccl")
    assert fn == "all_to_all"
    assert args["arg0"] == [(100,), (50,)] and args["arg1"] == [(100,), (100,)]


@pytest.mark.parametrize(
    ("name", "ct", "fn", "shapes"),
    [
        ("c10d::allreduce_", CommType.ALL_REDUCE, "all_reduce", {"arg0": (0,)}),
        ("c10d::_allgather_base_", CommType.ALL_GATHER, "all_gather_into_tensor", {"arg1": (0,)}),
        ("c10d::_reduce_scatter_base_", CommType.REDUCE_SCATTER, "reduce_scatter_tensor", {"arg1": (0,)}),
        ("c10d::reduce_scatter_", CommType.REDUCE_SCATTER, "reduce_scatter", {"arg1": [(0,), (0,)]}),
        ("c10d::reduce_", CommType.REDUCE, "reduce", {"arg0": (0,)}),
    ],
)  # fmt: skip
def test_an_empty_all_reduce_gather_or_reduce_scatter_is_reissued_empty_as_the_model_says_it_waits_for_no_one(
    monkeypatch: pytest.MonkeyPatch, name: str, ct: CommType, fn: str, shapes: dict[str, Any]
) -> None:
    # PowerSGD's hook issues an empty all_reduce a step; gloo returns at once and the execution model has
    # its members wait for no one. Re-issued as one element it met the late peer: a wait the model has not.
    got, args = _issued(monkeypatch, _coll(name, ct, 0), blocking=False)
    assert got == fn
    assert {k: args[k] for k in shapes} == shapes


def test_an_empty_broadcast_still_meets_its_peers_with_one_element(monkeypatch: pytest.MonkeyPatch) -> None:
    # gloo's empty broadcast waits for its root (vocab.EMPTY_WAITS_FOR_NONE leaves it out)
    fn, args = _issued(monkeypatch, _coll("c10d::broadcast_", CommType.BROADCAST, 0, root=0), blocking=True)
    assert fn == "broadcast" and args["arg0"] == (1,)


def test_an_all_gather_gathers_each_members_recorded_input_into_an_output_of_the_whole_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # comm_size of an all_gather is one member's input (2000 B: 500 floats); 2 members: 1000 floats out
    ag = _coll("c10d::_allgather_base_", CommType.ALL_GATHER, 2000)
    fn, args = _issued(monkeypatch, ag, blocking=True)
    assert (fn, args["arg0"], args["arg1"]) == ("all_gather_into_tensor", (1000,), (500,))


def test_a_reduce_and_a_gather_rooted_at_rank_1_are_issued_to_rank_1_which_alone_gathers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = {}
    for rank in (0, 1):
        fake = FakeDist()
        monkeypatch.setattr(real_ops, "dist", fake)
        issuer = CommIssuer(rank, torch.device("cpu"), {}, "0")
        issuer.issue(_coll("c10d::reduce_", CommType.REDUCE, 400, root=1), blocking=True)
        issuer.issue(_coll("c10d::gather_", CommType.GATHER, 400, root=1), blocking=True)
        calls[rank] = [(fn, args["dst"], args.get("arg1")) for fn, args in fake.calls]
    assert calls == {
        0: [("reduce", 1, None), ("gather", 1, None)],
        1: [("reduce", 1, None), ("gather", 1, [(100,), (100,)])],
    }
