"""The rule that joins autograd's device threads to the main thread (``skewlens.profiler.autograd``)."""

from __future__ import annotations

from skewlens.profiler.autograd import backward_runs, fork_and_join


def test_a_stretch_ends_where_the_main_thread_starts_something_or_a_step_begins() -> None:
    engine = [150, 200, 350, 700]
    assert backward_runs(engine, [0, 100, 300, 500]) == [(0, 1), (2, 2), (3, 3)]
    assert backward_runs(engine, [0]) == [(0, 3)]
    assert backward_runs([], [0]) == []


def test_a_stretch_follows_the_main_threads_last_node_in_its_step_and_the_next_one_waits_for_it() -> None:
    # the main thread's nodes: [0, 50), [100, 120), [500, 600); a stretch of the engine from 150 to 400
    main = {"main_starts": [0, 100, 500], "main_ends": [50, 120, 600]}
    assert fork_and_join(150, 400, step_starts=[0], **main) == (1, 2)
    # a step began at 130, between the call and the stretch: nothing to follow there
    assert fork_and_join(150, 400, step_starts=[0, 130], **main) == (-1, 2)
    # the main thread's next node started before the stretch ended: it did not wait for it
    assert fork_and_join(150, 550, step_starts=[0], **main) == (1, -1)
