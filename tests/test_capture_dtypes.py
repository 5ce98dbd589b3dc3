"""Collectives of unusual dtypes and reduce ops on gloo: each recorded with the bytes the program moved
(element size x elements, counted by the program itself), its dtype, ``ReduceOp``, root and splits; a call
gloo refuses (float8 and int16 ``Invalid scalar type``, ``PREMUL_SUM``) is no collective, though the
flight recorder made an entry for it; the real replay issues every recorded one again, the same."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.capture.flight import FrEntry, without_raised
from skewlens.profiler.capture.hooks import CommHooks
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.vocab import Attr, NodeType

US = 1_000


def _entry(seq: int, created_ns: int, ident: int, op: str = "gloo:all_reduce") -> FrEntry:
    return FrEntry(
        pg_name="0", seq=seq, op=op, created_ns=created_ns, numel=37, dtype="float8_e4m3fn", size_bytes=37,
        thread_ident=ident, record_id=seq - 1,
    )  # fmt: skip


def test_the_recorder_entry_of_a_call_that_raised_is_left_out_and_those_before_it_in_the_call_kept() -> None:
    ran = _entry(1, 10 * US, 77, "gloo:all_gather")  # a collective the call issued first, which ran
    refused = _entry(2, 12 * US, 77)  # the one gloo refused: the last the thread made inside the call
    other_thread = _entry(3, 13 * US, 88)  # DDP's bucket on the autograd thread, meanwhile
    after = _entry(4, 30 * US, 77)  # the program's next call, after the one that raised
    anonymous = _entry(5, 50 * US, 0)  # no thread recorded: may be any thread's
    entries = [after, ran, refused, other_thread, anonymous]

    kept, left_out = without_raised(entries, [(77, 9 * US, 14 * US, "RuntimeError: Invalid scalar type")])

    assert left_out == [refused]
    assert kept == [after, ran, other_thread, anonymous]  # in the order given
    # a call that raised before the recorder made an entry (a Python check) leaves every entry in
    assert without_raised(entries, [(77, 20 * US, 25 * US, "ValueError")]) == (entries, [])
    assert without_raised(entries, [(77, 49 * US, 51 * US, "RuntimeError")])[1] == [anonymous]
    assert without_raised(entries, []) == (entries, [])


def test_the_hooks_keep_each_call_that_raised_with_its_thread_span_and_exception_and_raise_it_again() -> None:
    hooks = CommHooks(lambda: True, lambda: 0)

    def refuse() -> None:
        raise RuntimeError("Invalid scalar type")

    with pytest.raises(RuntimeError, match="Invalid scalar type"):
        hooks._timed(refuse, (), {})
    assert hooks._timed(lambda: "ok", (), {})[0] == "ok"

    [(ident, start, end, what)] = hooks.raised
    assert (ident, what) == (threading.get_ident(), "RuntimeError: Invalid scalar type")
    assert 0 < start <= end


# ---- real processes (gloo, torchrun) ------------------------------------------------------------------

DTYPES_SCRIPT = r"""
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
p = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([p], lr=0.1)
S = dist.ReduceOp
calls = []  # what each call moved, counted here: [step, kind, dtype, bytes, op, root, sent, received]

def call(step, kind, t, fn, op="", root=-1, sent=None, received=None):
    try:
        fn()
    except RuntimeError as e:  # gloo refused it (or, an AVG of integers, ran it and failed to divide)
        calls.append([step, "raised", str(t.dtype), 0, str(e).splitlines()[0], -1, None, None])
        return
    moved = torch.view_as_real(t) if t.is_complex() else t  # torch sends a complex tensor as its real view
    nbytes = t.numel() * t.element_size()
    calls.append([step, kind, str(moved.dtype).removeprefix("torch."), nbytes, op, root, sent, received])

for step in range(3):
    for dt in (torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int64, torch.bool,
               torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.int16):
        t = torch.ones(37).to(dt)
        call(step, "all_reduce", t, lambda: dist.all_reduce(t), "sum")
    for name, op, dt in (("avg", S.AVG, torch.float32), ("max", S.MAX, torch.float32),
                         ("product", S.PRODUCT, torch.float32), ("bxor", S.BXOR, torch.int32)):
        t = torch.ones(11, dtype=dt)
        call(step, "all_reduce", t, lambda: dist.all_reduce(t, op=op), name)
        call(step, "reduce", t, lambda: dist.reduce(t, dst=1, op=op), name, root=1)
    t = torch.ones(11)
    call(step, "all_reduce", t, lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)))
    i = torch.ones(11, dtype=torch.int32)  # gloo sums, then fails to divide in place
    call(step, "all_reduce", i, lambda: dist.all_reduce(i, op=S.AVG), "avg")
    strided = torch.ones(8, 6, dtype=torch.float64)[:, ::2]
    call(step, "all_reduce", strided, lambda: dist.all_reduce(strided), "sum")
    empty, scalar = torch.ones(0, dtype=torch.float16), torch.tensor(3.0, dtype=torch.float64)
    call(step, "all_reduce", empty, lambda: dist.all_reduce(empty), "sum")
    call(step, "all_reduce", scalar, lambda: dist.all_reduce(scalar), "sum")
    g = torch.ones(9, dtype=torch.int64)
    gl = [torch.empty_like(g) for _ in range(2)] if r == 1 else None
    call(step, "gather", g, lambda: dist.gather(g, gl, dst=1), root=1)
    s = torch.empty(7, dtype=torch.float64)
    sl = [torch.ones(7, dtype=torch.float64) for _ in range(2)] if r == 1 else None
    call(step, "scatter", s, lambda: dist.scatter(s, sl, src=1), root=1)
    b = torch.arange(13)
    call(step, "broadcast", b, lambda: dist.broadcast(b, src=1), root=1)
    ins, outs = ([1, 3], [1, 2]) if r == 0 else ([2, 5], [3, 5])
    ai, ao = torch.ones(sum(ins), dtype=torch.bfloat16), torch.empty(sum(outs), dtype=torch.bfloat16)
    call(step, "all_to_all", ai, lambda: dist.all_to_all_single(ao, ai, outs, ins),
         sent=[2 * n for n in ins], received=[2 * n for n in outs])
    opt.step()
with open(os.environ["CALLS_OUT"] + f".{r}.json", "w") as f:
    json.dump(calls, f)
dist.destroy_process_group()
"""

#: Calls that raise on gloo: PREMUL_SUM (float32), two dtypes it takes in no collective, and AVG of int32
REFUSED = ["torch.float32", "torch.float8_e4m3fn", "torch.int16", "torch.int32"]
_KINDS = {0: "all_reduce", 1: "reduce", 3: "gather", 4: "scatter", 5: "broadcast", 6: "all_to_all"}


def _list(v: Any) -> list[int] | None:
    return None if v is None else [int(x) for x in v]


def _comm_nodes(path: Path) -> list[dict[str, Any]]:
    """Each communication node of a rank's file: (step, kind, dtype, bytes, op, root, sent, received) as
    the script counts them."""
    out = []
    for n in read_et(path).nodes:
        a = node_attrs(n)
        if n.type != NodeType.COMM_COLL:
            continue
        root = a.get(Attr.COMM_SRC, -1) if a[Attr.COMM_TYPE] in (4, 5) else a.get(Attr.COMM_DST, -1)
        out.append(
            [
                a[Attr.STEP], _KINDS[a[Attr.COMM_TYPE]], a[Attr.DTYPE], a[Attr.COMM_SIZE],
                a.get(Attr.REDUCE_OP, ""), root,
                _list(a.get(Attr.SEND_SPLITS)), _list(a.get(Attr.RECV_SPLITS)),
            ]
        )  # fmt: skip
    return out


@pytest.mark.slow
def test_every_dtype_and_reduce_op_is_recorded_with_its_bytes_and_replayed_alike_and_refused_calls_are_not(
    tmp_path: Path,
) -> None:
    from capture_helpers import profile_script

    from skewlens.replay.config import RealConfig
    from skewlens.replay.effects import NO_EFFECTS
    from skewlens.replay.real.api import real_replay

    counted = tmp_path / "calls"
    run, res = profile_script(
        tmp_path, DTYPES_SCRIPT, nproc=2, steps="0:1:2", env={"CALLS_OUT": str(counted)}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    notes = read_manifest(run).notes
    for rank in range(2):
        calls = json.loads(Path(f"{counted}.{rank}.json").read_text())
        refused = [c for c in calls if c[1] == "raised" and c[0] >= 1]
        # in each recorded step
        assert sorted(c[2] for c in refused) == sorted(REFUSED * 2)
        assert _comm_nodes(run / f"rank-{rank}.et") == [c for c in calls if c[1] != "raised" and c[0] >= 1]
        note = notes[f"rank {rank} raised calls"]
        assert note.startswith("8 communication call(s) raised (the first: RuntimeError: ")
        assert note.endswith("flight-recorder entries they made: 8 (8 all_reduce on group '0'), left out")
    # every recorded collective issued again on gloo: the same type, bytes, dtype, op, root and splits
    out = tmp_path / "real"
    real_replay(run_dir=run, out_dir=out, effects=NO_EFFECTS, cfg=RealConfig(timeout_s=20.0))
    for rank in range(2):  # (the replay's capture numbers its steps its own way)
        replayed = [c[1:] for c in _comm_nodes(out / "run" / f"rank-{rank}.et")]
        assert replayed == [c[1:] for c in _comm_nodes(run / f"rank-{rank}.et")]
