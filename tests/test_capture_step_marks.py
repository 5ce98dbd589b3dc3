"""Step marks from ``optimizer.step()`` (``skewlens profile``, or the Python API with ``auto_step``)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from capture_helpers import profile_script
from workload_helpers import capture_workload, comm_per_step

from skewlens.profiler.capture import capture
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import STEP_MARKS_NOTE, Manifest, read_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.vocab import Attr


class Wrapper(torch.optim.Optimizer):
    """An optimizer whose step() runs another's, then works on (as ZeroRedundancyOptimizer runs its local
    optimizer, then broadcasts the parameters it updated)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        super().__init__(params, {})
        self.inner = torch.optim.SGD(params, lr=0.1)
        self.after_inner_ns: list[int] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.inner.step()
        time.sleep(0.005)  # the wrapper's own work, after the inner step
        self.after_inner_ns.append(time.time_ns())


def test_an_optimizer_stepped_inside_another_ones_step_is_part_of_that_step(tmp_path: Path) -> None:
    w = torch.zeros(4, requires_grad=True)
    opt = Wrapper([w])
    with capture(tmp_path / "run", steps="0:0:3", auto_step=True):
        for _ in range(3):
            w.sum().backward()
            opt.step()
    m = read_manifest(tmp_path / "run")
    steps = sorted(m.steps, key=lambda s: s.step)
    assert [s.step for s in steps] == [0, 1, 2]
    # each step ends after the wrapper's own work; before, at the inner SGD's end, 5 ms before it
    for s, after in zip(steps, opt.after_inner_ns, strict=True):
        assert s.end_ns >= after
    assert STEP_MARKS_NOTE not in m.notes  # one optimizer stepped the training; before: "2 optimizers"


class Unhooked(torch.optim.Optimizer):
    """A wrapper that never runs ``Optimizer.__init__`` (as ``PostLocalSGDOptimizer``, whose step() steps its
    local optimizer, then averages the model): torch's step hooks do not see its step()."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.inner = torch.optim.SGD(params, lr=0.1)
        self.after_inner_ns: list[int] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.inner.step()
        time.sleep(0.005)  # the model average, after the local step
        self.after_inner_ns.append(time.time_ns())


def _capture_steps_1_to_3(run: Path, w: torch.Tensor, opt: object, method: str = "step") -> Manifest:
    """The manifest of a capture of steps 1-3 of 4 iterations of ``w``'s backward, then ``opt.method()``
    (looked up each time: a method bound before the capture hooked the class would run the unhooked one)."""
    with capture(run, steps="1:0:3", auto_step=True):
        for _ in range(4):
            w.sum().backward()
            getattr(opt, method)()
    return read_manifest(run)


class InheritsStep(Unhooked):
    """A subclass of such a wrapper with the wrapper's step() (``PostLocalSGDOptimizer`` subclassed)."""


@pytest.mark.parametrize("cls", [Unhooked, InheritsStep])
def test_a_wrapper_whose_step_torch_does_not_hook_ends_its_steps_after_its_own_work(
    tmp_path: Path, cls: type[Unhooked]
) -> None:
    w = torch.zeros(4, requires_grad=True)
    opt = cls([w])
    own_step = cls.step
    m = _capture_steps_1_to_3(tmp_path / "run", w, opt)
    steps = sorted(m.steps, key=lambda s: s.step)
    assert [s.step for s in steps] == [1, 2, 3]
    # each step ends after the wrapper's work of its iteration; before, at the inner SGD's end, 5 ms before
    # it, the wrapper's work falling into the next step (only the first step(), the one that found the
    # wrapper, still ends at its inner optimizer's end: step 0, outside the window)
    for s, after in zip(steps, opt.after_inner_ns[1:], strict=True):
        assert s.end_ns >= after
    for s, before in zip(steps[1:], opt.after_inner_ns[1:], strict=False):
        assert s.start_ns >= before
    # the wrapper's steps took over its inner SGD's count: one optimizer stepped the training
    assert STEP_MARKS_NOTE not in m.notes
    # the capture gave the class defining step() its own step() back (a subclass's inherits it again)
    assert cls.step is own_step and Unhooked.step is Unhooked.__dict__["step"]
    assert "step" not in InheritsStep.__dict__


class Runner(torch.optim.Optimizer):
    """An object that never ran ``Optimizer.__init__`` and steps an optimizer from a method other than
    step() (its own step() never runs)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.inner = torch.optim.SGD(params, lr=0.1)

    def local_update(self) -> None:
        self.inner.step()


def test_an_optimizer_stepped_from_another_ones_method_other_than_step_ends_the_steps_itself(
    tmp_path: Path,
) -> None:
    w = torch.zeros(4, requires_grad=True)
    runner = Runner([w])
    m = _capture_steps_1_to_3(tmp_path / "run", w, runner, "local_update")
    assert sorted(s.step for s in m.steps) == [1, 2, 3]
    assert "step" not in Runner.__dict__ or Runner.step is Runner.__dict__["step"]


def test_with_a_plain_optimizer_stepped_first_an_unhooked_wrapper_stepped_second_does_not_end_the_steps(
    tmp_path: Path,
) -> None:
    w, v = torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    first, wrapper = torch.optim.SGD([w], lr=0.1), Unhooked([v])
    ends: list[int] = []
    with capture(tmp_path / "run", steps="1:0:3", auto_step=True):
        for _ in range(4):
            (w.sum() + v.sum()).backward()
            first.step()
            ends.append(time.time_ns())
            wrapper.step()
    m = read_manifest(tmp_path / "run")
    steps = sorted(m.steps, key=lambda s: s.step)
    assert [s.step for s in steps] == [1, 2, 3]
    # each step ends at the plain SGD's step, before the wrapper's 5 ms of work
    for s, end in zip(steps, ends[1:], strict=True):
        assert s.end_ns <= end
    # two optimizers stepped: the wrapper's first step() (which found it) counts as its, not its inner SGD's
    # (before: "3 optimizers stepped ... (SGD, 4 calls ...; others: SGD 1, Unhooked 2)")
    assert m.notes[STEP_MARKS_NOTE].startswith("2 optimizers stepped; a step ends at each step()")
    assert "(SGD, 4 calls by the end of the window; others: Unhooked 3)" in m.notes[STEP_MARKS_NOTE]


@pytest.mark.slow
def test_every_captured_step_of_every_rank_keeps_its_optimizer_step_at_the_ops_level(tmp_path: Path) -> None:
    # the step is marked inside Optimizer.step, after the capture's skewlens::step marker closes; before,
    # in about 2 captures of 3 a rank's marker seemed (Kineto's clock) to end after the mark, and its
    # steps had their 8 aten::add_ at top level where Optimizer.step#SGD.step should be
    capture_workload(tmp_path / "run", "mesh2d.py", level="ops")
    for rank in (0, 1):
        per_step: dict[int, Counter[str]] = defaultdict(Counter)
        for node in read_et(tmp_path / "run" / f"rank-{rank}.et").nodes:
            attrs = node_attrs(node)
            if attrs.get(Attr.STREAM) == 0 and Attr.STEP in attrs:
                per_step[attrs[Attr.STEP]][node.name] += 1
        found = {s: (c["Optimizer.step#SGD.step"], c["aten::add_"]) for s, c in per_step.items()}
        assert found == {2: (1, 0), 3: (1, 0), 4: (1, 0)}, f"rank {rank}"


LOCAL_SGD = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pls
from torch.distributed.algorithms.model_averaging import averagers
from torch.distributed.optim import PostLocalSGDOptimizer
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 16))
# DDP all_reduces gradients for 2 iterations, then none (no subgroup all_reduce either): from then on, only
# the model average of every 2nd iteration communicates
state = pls.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=2,
                              post_local_gradient_allreduce=False)
model.register_comm_hook(state, pls.post_localSGD_hook)
opt = PostLocalSGDOptimizer(optim=torch.optim.SGD(model.parameters(), lr=0.01),
                            averager=averagers.PeriodicModelAverager(period=2, warmup_steps=2))
for _ in range(8):
    opt.zero_grad()
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
"""


@pytest.mark.slow
def test_post_local_sgds_model_average_is_in_the_step_whose_optimizer_step_ran_it(tmp_path: Path) -> None:
    out, res = profile_script(tmp_path, LOCAL_SGD, nproc=2, steps="1:1:4")
    assert res.returncode == 0, res.stderr[-3000:]
    run = load_run(out)
    model_bytes = (16 * 16 + 16) * 4
    for rank, per_step in comm_per_step(run).items():
        found = {
            step: sorted((k.kind, k.group, k.bytes) for k in c.elements()) for step, c in per_step.items()
        }
        # the averager averages at iterations 2 and 4 (step counter >= warmup, (step - 2) % 2 == 0), in one
        # all_reduce of the whole model; steps 3 and 5 have no collective at all. Before, the average was
        # in the step after (3 and 5), the step ending at the inner SGD's step()
        average = [("ALL_REDUCE", (0, 1), model_bytes)]
        assert found == {2: average, 4: average}, f"rank {rank}"
    assert sorted((s.rank, s.step) for s in read_manifest(out).steps) == [
        (r, s) for r in (0, 1) for s in (2, 3, 4, 5)
    ]


def test_a_new_optimizer_made_in_place_of_the_first_one_marks_the_steps_from_then_on(tmp_path: Path) -> None:
    # A loop that freezes part of its model (or grows it) and makes a new optimizer for what is left lets
    # go of the one that marked the steps. Before, no step was marked after that: on 2 gloo ranks of a DDP
    # loop making a new SGD at step 4 of 9, window 1-8, the capture kept steps 1-3 and called the rest an
    # unfinished step 4 that "the command ended before".
    w = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    ends: list[int] = []
    with capture(tmp_path / "run", steps="1:0:5", auto_step=True):
        for i in range(6):
            if i in (2, 4):
                opt = torch.optim.SGD([w], lr=0.01 * i)  # the old one is freed
            w.sum().backward()
            opt.step()
            ends.append(time.time_ns())
    m = read_manifest(tmp_path / "run")
    steps = sorted(m.steps, key=lambda s: s.step)
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    for s, end in zip(steps, ends[1:], strict=True):
        assert ends[s.step - 1] <= s.end_ns <= end
    assert STEP_MARKS_NOTE not in m.notes  # one optimizer at a time stepped the training


def test_a_second_optimizer_while_the_first_is_still_held_does_not_take_over_the_step_marks(
    tmp_path: Path,
) -> None:
    w, v = torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    first = torch.optim.SGD([w], lr=0.1)
    second: torch.optim.Optimizer | None = None
    with capture(tmp_path / "run", steps="1:0:3", auto_step=True):
        for i in range(4):
            (w.sum() + v.sum()).backward()
            if i >= 2:  # from the third iteration on, a second optimizer steps too, after the first
                second = second or torch.optim.SGD([v], lr=0.1)
                second.step()
            first.step()
    m = read_manifest(tmp_path / "run")
    assert sorted(s.step for s in m.steps) == [1, 2, 3]
    assert "(SGD, 4 calls by the end of the window; others: SGD 2)" in m.notes[STEP_MARKS_NOTE]


FREEZE_AND_NEW_OPTIMIZER = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
model = DDP(net, find_unused_parameters=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(7):
    if step == 3:  # freeze the first layer, and step what is left with a new optimizer
        net[0].requires_grad_(False)
        opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.01)
    model(torch.randn(4, 16)).sum().backward()
    dist.all_reduce(torch.full((step + 1,), 1.0))  # step + 1 floats: which step it is in
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_a_ddp_loop_that_makes_a_new_optimizer_after_freezing_a_layer_keeps_every_step(
    tmp_path: Path,
) -> None:
    # before: steps 1-2 only, steps 3-5 one step "unfinished" at exit and a note of 2 optimizers stepping
    out, res = profile_script(tmp_path, FREEZE_AND_NEW_OPTIMIZER, nproc=2, steps="1:0:5")
    assert res.returncode == 0, res.stderr[-3000:]
    run = load_run(out)
    assert sorted({(s.rank, s.step) for s in run.manifest.steps}) == [
        (r, s) for r in (0, 1) for s in range(1, 6)
    ]
    assert STEP_MARKS_NOTE not in run.manifest.notes
    for rank, per_step in comm_per_step(run).items():
        marks = {step: sorted(k.bytes for k in c.elements() if k.bytes < 64) for step, c in per_step.items()}
        # the script's own all_reduce of step + 1 floats, and DDP's map of used parameters (4 int32)
        assert marks == {s: sorted([16, 4 * (s + 1)]) for s in range(1, 6)}, rank


def test_a_rank_whose_first_optimizer_stopped_stepping_says_so_at_exit(tmp_path: Path) -> None:
    import json

    from skewlens.profiler.capture.schedule import parse_window
    from skewlens.profiler.capture.session import CaptureSession, part_file

    w, v = torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    reward, policy = torch.optim.SGD([w], lr=0.1), torch.optim.Adam([v], lr=0.1)
    session = CaptureSession(tmp_path / "run", window=parse_window("1:1:2"), auto_step=True).install()
    try:
        for i in range(6):  # the reward model for 2 iterations (steps 0 and 1), then the policy for 4
            (w.sum() + v.sum()).backward()
            (reward if i < 2 else policy).step()
        session._at_exit()
    finally:
        session.uninstall()
    # before: no part file, and profile asked whether the program had run 3+ steps each ended by
    # optimizer.step()
    part = json.loads(part_file(tmp_path / "run", 0).read_text())
    assert part["not_saved"].startswith(
        "no step of the window (steps 2-3) ended: a step ends at each step() of the first optimizer to step "
        "(SGD, 2 calls; others: Adam 4), and only it marks steps"
    )
    assert not (tmp_path / "run" / "rank-0.et").exists()


def _exit_with_no_step(tmp_path: Path, stepped: list[str], *, by_hand: bool = False) -> Path:
    """A session whose optimizers (``SGD``, ``Adam``, ``RMSprop``) step in the order ``stepped``, none of the
    window's steps (1:1:2) ending, then the rank's exit; its part file (absent where it gave no reason).
    ``by_hand``: the step marks were handed to ``cap.step()`` first, as ``capture()`` under profile does."""
    from skewlens.profiler.capture.schedule import parse_window
    from skewlens.profiler.capture.session import CaptureSession, part_file

    params = {k: torch.zeros(4, requires_grad=True) for k in ("SGD", "Adam", "RMSprop")}
    opts = {k: getattr(torch.optim, k)([v], lr=0.1) for k, v in params.items()}
    session = CaptureSession(tmp_path / "run", window=parse_window("1:1:2"), auto_step=True).install()
    try:
        for name in stepped:
            params[name].sum().backward()
            opts[name].step()
        if by_hand:
            session.steps_by_hand()
        session._at_exit()
    finally:
        session.uninstall()
    return part_file(tmp_path / "run", 0)


def test_the_first_optimizer_reason_names_every_other_optimizer_that_stepped(tmp_path: Path) -> None:
    import json

    part = _exit_with_no_step(tmp_path, ["SGD", "SGD", *["Adam", "RMSprop"] * 3, "RMSprop"])
    assert json.loads(part.read_text())["not_saved"].startswith(
        "no step of the window (steps 2-3) ended: a step ends at each step() of the first optimizer to step "
        "(SGD, 2 calls; others: Adam 3, RMSprop 4), and only it marks steps"
    )


def test_optimizers_that_stepped_as_often_as_the_first_give_no_first_optimizer_reason(tmp_path: Path) -> None:
    # a GAN that ran too few steps: its generator and discriminator step once an iteration each; the first
    # did not stop stepping, and profile's own question (did it run 3+ steps?) is the one that fits
    assert not _exit_with_no_step(tmp_path, ["SGD", "Adam"] * 2).exists()


def test_step_marks_handed_to_the_program_give_no_first_optimizer_reason(tmp_path: Path) -> None:
    # capture() under skewlens profile hands the marks to cap.step(): optimizer steps before it say nothing
    # of which optimizer marks the steps
    assert not _exit_with_no_step(tmp_path, ["SGD", "SGD", *["Adam"] * 4], by_hand=True).exists()


def test_a_process_of_a_one_rank_job_that_steps_no_optimizer_gives_no_reason_of_its_own(
    tmp_path: Path,
) -> None:
    # only a rank of a job of several ranks says "this rank marked no step": a one-process script keeps
    # profile's own question, and a helper process with a group of its own (world 1) must not write a
    # part file under its rank's number, as if it were that rank
    import torch.distributed as dist

    from skewlens.profiler.capture.schedule import parse_window
    from skewlens.profiler.capture.session import CaptureSession, part_file

    session = CaptureSession(tmp_path / "run", window=parse_window("1:1:2"), auto_step=True).install()
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            t = torch.ones(4)
            for _ in range(4):
                dist.all_reduce(t)
            session._at_exit()
        finally:
            dist.destroy_process_group()
    finally:
        session.uninstall()
    assert session._job_world == 1  # it joined a job: its own, of one rank
    assert not part_file(tmp_path / "run", 0).exists()


PHASES = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
reward, policy = DDP(torch.nn.Linear(16, 1)), DDP(torch.nn.Linear(16, 16))
o_reward = torch.optim.SGD(reward.parameters(), lr=0.01)
o_policy = torch.optim.Adam(policy.parameters(), lr=0.01)
for i in range(8):  # the reward model trained for 2 iterations, then the policy for 6
    model, opt = (reward, o_reward) if i < 2 else (policy, o_policy)
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_a_capture_whose_first_optimizer_stops_stepping_says_that_only_it_marks_steps(tmp_path: Path) -> None:
    out, res = profile_script(tmp_path, PHASES, nproc=2, steps="1:1:2")
    assert res.returncode == 2
    # before: "no rank saved a trace ... did it import torch, and run 3+ steps, each ended by
    # optimizer.step()?", which the program had done (8 of them); the first optimizer to step had ended 2
    last = res.stderr.strip().splitlines()[-1]
    assert "no rank saved a trace: rank 0: trace not saved: no step of the window (steps 2-3) ended" in last
    assert "first optimizer to step (SGD, 2 calls; others: Adam 6), and only it marks steps" in last
    assert not out.exists()


SCORER = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
trains = dist.get_rank() == 0  # rank 0 trains the policy; rank 1 only scores with a frozen reward model
group = dist.new_group([0])  # every rank makes it; only its member trains in it
if trains:
    policy = DDP(torch.nn.Linear(16, 16), process_group=group)
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
reward = torch.nn.Linear(16, 1).eval()
for i in range(6):
    scores = torch.zeros(4)
    if trains:
        policy(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    else:
        with torch.no_grad():
            scores += reward(torch.randn(4, 16)).mean()
    dist.all_reduce(scores)
"""


@pytest.mark.slow
def test_a_rank_that_steps_no_optimizer_is_said_to_have_marked_no_step_not_to_have_crashed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, res = profile_script(tmp_path, SCORER, nproc=2, steps="1:1:2")
    # before: exit 0, and the manifest said rank 1 "crashed or was killed before saving"
    assert res.returncode == 2
    m = read_manifest(out)
    assert m.missing_ranks == (1,) and sorted({s.step for s in m.steps}) == [2, 3]
    # before, it named only reward and teacher ranks, and cap.step() with no word of how to get a cap
    assert m.notes["rank 1"].startswith(
        "trace not saved: this rank marked no step: it stepped no optimizer, and only optimizer.step() marks "
        "steps; a rank that trains nothing of its own (a reward model's or a teacher's inference for the "
        "others), or one that updates its parameters without an optimizer, marks its steps with the Python "
        "API: `with capture(RUN_DIR) as cap:` around its loop, cap.step() at the end of each step ("
    )
    assert "skewlens profile: error: rank 1: trace not saved: this rank marked no step" in res.stderr
    # before: "skewlens analyze --lenient reads them", where analyze reads them as they are (a warning)
    assert res.stderr.rstrip().endswith(
        f"(the traces of rank 0 are kept in {out}; skewlens analyze and replay use them without rank 1, and "
        f"`skewlens check {out}` lists what that leaves unmatched)"
    )
    from skewlens.cli import main as skewlens_main

    assert skewlens_main(["analyze", str(out), "--out", str(tmp_path / "an")]) == 0
    warned = "skewlens analyze: warning: rank 1 of 2 has no trace: only the traced ranks are used"
    assert capsys.readouterr().err.splitlines() == [warned]


def test_two_optimizers_of_one_class_are_told_apart_by_their_parameters_in_the_step_marks_note(
    tmp_path: Path,
) -> None:
    # a PPO loop: the critic's Adam steps first (it marks the steps), then the actor's; the note said
    # "(Adam, 4 calls by the end of the window; others: Adam 3, SGD 3)", which did not say which Adam marked
    # them (the window ends at the critic's 4th step(), before the others' 4th); a class alone is named alone
    critic, actor = torch.zeros(3, requires_grad=True), torch.zeros(2, 5, requires_grad=True)
    critic_opt, actor_opt = torch.optim.Adam([critic]), torch.optim.Adam([actor])
    sgd = torch.optim.SGD([torch.zeros(7, requires_grad=True)], lr=0.1)
    with capture(tmp_path / "run", steps="1:0:3", auto_step=True):
        for _ in range(4):
            critic.sum().backward()
            critic_opt.step()
            actor.sum().backward()
            actor_opt.step()
            sgd.step()
    note = read_manifest(tmp_path / "run").notes[STEP_MARKS_NOTE]
    assert note.startswith(
        "3 optimizers stepped; a step ends at each step() of the first to step "
        f"(Adam over {critic.numel()} parameters, 4 calls by the end of the window; "
        f"others: Adam over {actor.numel()} parameters 3, SGD 3)"
    )
