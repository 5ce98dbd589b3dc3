"""Timing rules of the simulator core that the other tests leave unchecked (found by mutation testing).

Each graph is built by hand and each expected time is derived from the rules in ``replay/core.py``'s
docstring, not read from a run."""

from __future__ import annotations

from skewlens.replay.core import SYNC, Flow, Graph, binding_segments, run
from skewlens.replay.simulate import _preds


def _graph(*, gap: list[int], **kw: object) -> Graph:
    """A graph of ``len(gap)`` synchronising segments, each ready at 0 after its ``gap`` and with no
    dependencies, unless ``kw`` says otherwise."""
    n = len(gap)
    base: dict[str, object] = {
        "ready0": [0] * n,
        "length": [SYNC] * n,
        "ndeps": [0] * n,
        "succ_ptr": [0] * (n + 1),
        "succ_idx": [],
    }
    return Graph(gap=gap, **(base | kw))  # type: ignore[arg-type]


def _queued_behind_a_long_transfer() -> Graph:
    """Three groups of two ranks. A (0 on rank 0, 1 on rank 1) arrives at 0 and moves for 1000 ns. C (4, 5)
    arrives at 10 and moves for 5 ns. B (2 on rank 0, 3 on rank 1) is queued behind A on rank 0's stream
    (2 has queue-order dependency 0); 2 arrives at 20 and 3 when C's member 5 ends (15)."""
    return _graph(
        gap=[0, 0, 20, 0, 10, 10],
        ndeps=[0, 0, 0, 1, 0, 0],
        succ_ptr=[0, 0, 0, 0, 0, 0, 1],
        succ_idx=[3],
        sync_of=[0, 0, 1, 1, 2, 2],
        groups=[[0, 1], [2, 3], [4, 5]],
        transfer=[[1000, 1000], [7, 7], [5, 5]],
        xsucc_ptr=[0, 1, 1, 1, 1, 1, 1],
        xsucc_idx=[2],
        group_xdeps=[0, 1, 0],
    )


def test_a_collective_whose_last_member_arrives_before_the_op_queued_ahead_of_it_ends_waits_for_that_op() -> (
    None
):
    out = run(_queued_behind_a_long_transfer())
    a_end = 0 + 1000
    last_arrival = max(20, 10 + 5)
    assert out.group_arrival[1] == last_arrival
    # the transfer begins at the later of the last arrival and the queue-order dependency's end
    assert list(out.seg_end[2:4]) == [max(last_arrival, a_end) + 7] * 2
    assert out.group_end[1] == a_end + 7


def test_the_binding_path_of_a_transfer_held_by_the_op_queued_ahead_goes_to_that_op() -> None:
    g = _queued_behind_a_long_transfer()
    out = run(g)
    on = binding_segments(g, out, [2], _preds(g))
    assert on is not None  # every time is explained
    # B's transfer began when A ended (not at B's last arrival): A's first arriving member is on the path,
    # B's members and C (whose arrivals held nothing) are not
    assert list(on) == [1, 0, 0, 0, 0, 0]


def test_a_group_ends_with_its_latest_member_not_its_last_listed_one() -> None:
    g = _graph(
        gap=[0, 4],
        sync_of=[0, 0],
        groups=[[0, 1]],
        transfer=[[9, 2]],
    )
    out = run(g)
    assert list(out.seg_end) == [4 + 9, 4 + 2]
    assert out.group_end == [4 + 9]


def test_an_eager_send_that_ends_after_its_receiver_is_the_end_of_their_group() -> None:
    # 0: an eager send arriving at 0 that moves for 100 ns on its own; 1: its receiver, arriving at 50, 10 ns
    g = _graph(
        gap=[0, 50],
        sync_of=[0, 0],
        groups=[[0, 1]],
        transfer=[[100, 10]],
        detached=[[True, False]],
    )
    out = run(g)
    assert list(out.seg_end) == [0 + 100, 50 + 10]
    assert out.group_end == [100]


def _rooted_with_a_queued_root() -> Graph:
    """A broadcast R (0: root, 1: receiver; each arrives at 10; transfers 3 and 4) whose root is queued on
    its stream behind 2, a one-member group that arrives at 0 and moves for 500 ns."""
    return _graph(
        gap=[10, 10, 0],
        sync_of=[0, 0, 1],
        groups=[[0, 1], [2]],
        transfer=[[3, 4], [500]],
        waits_for=[[0, 0], None],
        xsucc_ptr=[0, 0, 0, 1],
        xsucc_idx=[0],
        group_xdeps=[1, 0],
    )


def test_a_broadcast_root_queued_behind_a_running_op_begins_its_transfer_when_that_op_ends() -> None:
    out = run(_rooted_with_a_queued_root())
    # the root waits for its own arrival and its queue-order dependency (ends at 500)
    assert out.seg_end[0] == max(10, 500) + 3
    # the receiver waits for the root's arrival only, not for the root's queue
    assert out.seg_end[1] == max(10, 10) + 4


def test_a_rooted_group_ends_with_its_latest_member() -> None:
    out = run(_rooted_with_a_queued_root())
    assert out.group_end[0] == max(500 + 3, 10 + 4)


def test_the_binding_path_of_a_rooted_member_held_by_its_own_queue_goes_to_its_own_queued_op() -> None:
    # R: members 0 and 1 (rule -1: both wait for every arrival) arrive at 10; each is queued behind a
    # one-member group (2 before 0, 3 before 1), both of which end at 500
    g = _graph(
        gap=[10, 10, 0, 0],
        sync_of=[0, 0, 1, 2],
        groups=[[0, 1], [2], [3]],
        transfer=[[3, 4], [500], [500]],
        waits_for=[[-1, -1], None, None],
        xsucc_ptr=[0, 0, 0, 1, 2],
        xsucc_idx=[0, 1],
        group_xdeps=[2, 0, 0],
    )
    out = run(g)
    assert list(out.seg_end) == [503, 504, 500, 500]
    on = binding_segments(g, out, [1], _preds(g))
    assert on is not None
    # member 1's transfer was held by its own queued op (3), not by member 0's (2), though both ended at 500
    assert list(on) == [0, 0, 0, 1]


def test_a_flow_shares_the_bandwidth_of_its_busiest_link() -> None:
    # X (0, 1) uses links 0 and 1, Y (2, 3) link 0 only; both start at 0 and would move alone for 100 ns:
    # on link 0 each gets half its bandwidth, so X too, though link 1 is its own
    g = _graph(
        gap=[0] * 4,
        sync_of=[0, 0, 1, 1],
        groups=[[0, 1], [2, 3]],
        transfer=[[0, 0], [0, 0]],
        flows=[Flow(alone_ns=100, links=(0, 1)), Flow(alone_ns=100, links=(0,))],
    )
    out = run(g)
    assert list(out.seg_end) == [100 * 2] * 4
    assert out.group_end == [200, 200]
