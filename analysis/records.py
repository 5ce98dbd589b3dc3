"""Record dataclasses of the tables the analyses write (one per table; schemas via ``arrow_schema``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CauseKind(StrEnum):
    """Why a rank arrived late at a synchronisation point (compared with the median member)."""

    COMPUTE = "compute"
    """Compute ops ran longer (the grown ops are named)."""
    HOST_GAP = "host_gap"
    """The host was idle between ops (Python overhead, sleeps, data loading)."""
    LATE_SEND = "late_send"
    """The host was idle right before a send (the send was issued late)."""
    WAIT = "earlier_wait"
    """The rank itself waited for others earlier (the lateness is passed on)."""
    UNTRACED = "untraced_member"
    """A member of the group has no trace (a rank missing from the run, or one a lenient load left out): it
    may have arrived after every traced member, so who was late, and why, is unknown; no traced rank is
    blamed (``blamed_rank`` -1), and its members' waits for the last traced arrival are charged to no one."""
    NONE = "none"
    """No category explains the lateness: no member arrived after the median member, or the late member's
    window grew by under 0.05 ms in every category (``skew.SHOWN_NS``). Such a member may still be late by
    milliseconds and cause exposed waits: its lateness lies where no category counts, such as a window that
    starts later because the member completed the previous common synchronisation point later (each window
    starts at its own member's completion there; a longer transfer is no lateness passed on), or a transfer
    at another group's collective (the skew analysis in analysis.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveSkewRecord:
    """One row of ``collective_skew``: one member of one collective instance or send/recv pair."""

    kind: str
    """``collective`` or ``p2p``."""
    pg_name: str
    """Process group name ('' when unknown)."""
    seq: int
    """Per-group sequence number of a collective; index of the pair in the run's p2p list for p2p."""
    comm_type: str
    """Collective type name, or ``SEND_RECV``."""
    comm_bytes: int
    """Bytes of this member's call as recorded (its node's ``comm_bytes``: a collective's input on this
    member, so an all_to_all's counts the chunk the member keeps for itself and an all_gather's is its
    shard, not the bytes that crossed the network: an uneven all_to_all's are ``nodes.send_splits_bytes``
    less that chunk; a send/recv pair's send or recv size on each side)."""
    step: int
    """Training step of the late member's node (-1 unknown)."""
    rank: int
    """This member's global rank."""
    node_id: int
    """This member's node id."""
    arrival_ns: int
    """When this member entered the op (aligned ns)."""
    end_ns: int
    """When the op completed on this member (aligned ns): its recorded end, or where gloo's worker recorded
    it after the host wait that hid it had ended, that wait's end (``replay.execution.model_ends``)."""
    wait_ns: int
    """Time this member waited for its peers: from its arrival to the arrival it waits for (the last one, or
    under a rooted collective's rule the root's; ``replay.execution.waits_for``), at most its op's
    duration; 0 for a send done before its recv arrived (eager: ``replay.execution.eager_send_rows``),
    which waits for no one."""
    exposed_wait_ns: int
    """The part of ``wait_ns`` not hidden under compute on this rank (asynchronous ops wait under compute)."""
    transfer_ns: int
    """The rest of the op: completion minus the arrival this member waited for, or its own arrival where it
    waited for no one (an eager send: its whole duration); >= 0, 0 for a member done before the arrival it
    waited for."""
    skew_ns: int
    """Last minus first arrival over the members."""
    late_rank: int
    """Member whose arrival the longest wait was for: the last to arrive, or a rooted collective's root."""
    blamed_rank: int
    """Rank the wait is attributed to (the late rank, or whoever made it wait earlier); -1 where a member of
    the group has no trace (``cause_kind`` ``untraced_member``), or such an event made it wait earlier."""
    late_by_ns: int
    """Late member's arrival minus the median arrival (of all members; of the others where the late member
    is a root), 0 where it was not later."""
    cause_kind: str
    """Why the late member was late (a CauseKind value)."""
    cause_op: str | None
    """The op that grew most (compute causes), else null."""
    cause_delta_ns: int
    """How much the cause grew, late member minus median member, ns."""
    cause: str
    """Human-readable cause."""
    clock_contradicted: bool
    """Whether the members' recorded times contradict each other by more than 1 ms (a member done before
    one it waits for began: the ranks' clocks disagree): the event's skew, waits and cause are not
    meaningful."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepBreakdownRecord:
    """One row of ``step_breakdown``: where one rank's time went in one step."""

    rank: int
    """Global rank."""
    step: int
    """Training step."""
    start_ns: int
    """Step start (aligned ns)."""
    end_ns: int
    """Step end (aligned ns)."""
    step_ns: int
    """Step length."""
    compute_ns: int
    """Time covered by compute: host operators and GPU kernels alike (union over threads and streams); on a
    GPU rank not the GPU's busy time."""
    exposed_wait_ns: int
    """Communication not hidden by compute, spent waiting for peers."""
    exposed_transfer_ns: int
    """Communication not hidden by compute, spent transferring."""
    overlapped_comm_ns: int
    """Communication time hidden under compute (intersection; host operators count as compute)."""
    gpu_compute_ns: int
    """Time covered by the GPU's compute kernels alone (union over streams; not NCCL kernels, copies or
    memsets, not host operators): HTA's compute time, within this step; 0 on a CPU rank. Not a part of
    the step's sum (``compute_ns`` holds it)."""
    idle_ns: int
    """Neither compute nor communication (host gaps): on a GPU rank, the GPU idle while no host operator
    runs either."""
    gpu_comm_ns: int = 0
    """Time covered by communication on the GPU (NCCL kernels, collectives and p2p ops on a GPU stream; their
    union), within this step; 0 on a CPU rank. Not a part of the step's sum."""
    gpu_comm_overlap_ns: int = 0
    """Of ``gpu_comm_ns``, the time GPU compute kernels ran too (``gpu_compute_ns``'s kernels): HTA's
    communication-computation overlap, GPU kernels only. Not a part of the step's sum."""
    gpu_busy_ns: int = 0
    """Time covered by any op of the GPU (union over all its streams of kernels, NCCL kernels, copies and
    memsets), within this step; 0 on a CPU rank. The step less it is the time the whole GPU ran nothing
    (HTA's temporal breakdown's idle, over the step rather than HTA's window). Not a part of the step's
    sum."""
    complete: bool = True
    """Whether every rank of the run's world recorded the step and all of its communication was matched.
    False for a step a rank has no trace of (a rank the manifest lists among ``missing_ranks``, such as one
    that crashed, read with a warning or ``--lenient``; a rank whose trace ends before it): the other
    ranks' waits on it are not in the tables. False too for one some of whose communication is not in every
    trace (a flight recorder lost collectives, declared in the manifest's ``lost_collectives``, a rank
    stopped inside the step, or a thread issued collectives across the window's start or end): that was
    left out of matching, so its waits and transfers are partial. Before schema version 16, true of a step
    every present trace had whole, a rank of the run missing."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuIdleRecord:
    """One row of ``gpu_idle``: how long one GPU stream of one rank idled in one step, and what it waited
    for (``skewlens.analysis.gpu_idle``); ``launch_wait_ns + comm_wait_ns + stream_wait_ns + other_ns =
    idle_ns``."""

    rank: int
    """Global rank."""
    step: int
    """Training step."""
    stream: int
    """The GPU stream (the store's ``stream``: the trace's stream id)."""
    step_ns: int
    """Step length."""
    busy_ns: int
    """Time the stream ran ops in the step (kernels, copies, memsets, NCCL kernels; their union)."""
    compute_ns: int
    """Of that, time it ran compute kernels (no NCCL kernels, copies or memsets: HTA's compute): the
    stream with the most is the rank's compute stream."""
    idle_ns: int
    """``step_ns - busy_ns``."""
    ops: int
    """Ops on the stream that started in the step."""
    launch_wait_ns: int
    """Idle until the next op's launch call: the host had not yet asked for it (the GPU starved)."""
    comm_wait_ns: int
    """Idle until communication the next op waited for completed (a collective, a p2p op, an NCCL
    kernel on another stream)."""
    stream_wait_ns: int
    """Idle until GPU work on another stream the next op waited for ended (an event wait)."""
    other_ns: int
    """The rest: after what the next op waited for was met (launch latency), where nothing it waited for
    was met after the stream went idle, and after the stream's last op."""
    queued_idle_ns: int | None = None
    """Of ``other_ns``, the time no stream of the rank's GPU ran anything while the next op had already been
    launched: a wait the trace does not show (an event of work outside it, kernels the profiler dropped),
    not launch latency (null in files written before schema 7)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuKernelRecord:
    """One row of ``gpu_kernels``: one GPU op name on one rank over its recorded steps
    (``skewlens.analysis.gpu_kernels``)."""

    rank: int
    """Global rank."""
    name: str
    """The kernel's (copy's, memset's) name."""
    kind: str
    """``compute``, ``communication`` (a collective or p2p op on the device, an NCCL kernel) or ``memory``
    (a copy or memset)."""
    kernels: int
    """How many ran."""
    total_ns: int
    """Their summed duration (two at once on two streams count twice, as HTA counts)."""
    steps: int
    """The rank's recorded steps (``total_ns / steps``: its time a step)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CriticalPathRecord:
    """One row of ``critical_path``: one node on the critical path of one step (last node first)."""

    step: int
    """Training step."""
    position: int
    """0 for the step's last finishing node, increasing backwards in time."""
    rank: int
    """Rank the node ran on."""
    node_id: int
    """Node id."""
    name: str
    """Node name."""
    kind: str
    """``compute``, ``idle`` (untraced host time), ``collective``, ``send``, ``recv`` or ``other``."""
    start_ns: int
    """Node start (aligned ns)."""
    end_ns: int
    """Node end (aligned ns)."""
    contribution_ns: int
    """Time of the step this node accounts for on the path (transfer only, for communication)."""
    gap_before_ns: int
    """Time on the path between the previous path node's end and this node's start (idle on the path)."""
    via: str
    """How the walk went on from this node: ``dep``, ``collective``, ``p2p``, or ``end``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlameRecord:
    """One row of ``blame``: what a rank costs the job, from simulated what-ifs."""

    rank: int
    """Global rank."""
    straggler_cost_ns: int
    """Baseline simulated time of the recorded steps minus the time had this rank run like the median rank."""
    baseline_ns: int
    """Simulated total step time of the recorded run (sum over steps)."""
    whatif_ns: int
    """Simulated total step time with this rank's compute and gaps set to the median rank's."""
    steps_top: int
    """Steps in which this rank has the largest straggler cost."""
    caused_wait_ns: int
    """Exposed wait (not hidden under compute) at the events the skew analysis blamed on this rank, in the
    steps of ``straggler_cost_ns`` (those of ``blame_steps``; not before the first step): each waiting
    rank's overlapping waits counted once (their union over time), summed over the waiting ranks."""
    cause_kind: str
    """Top cause (a CauseKind value)."""
    cause_op: str | None
    """Op that grew most, for compute causes."""
    cause: str
    """Human-readable top cause, of the events of the steps the costs are over (as ``caused_wait_ns``).
    Its amounts are per event: the growth before one event blamed on the rank that made others wait, the
    mean over the events naming it weighted by the exposed wait each caused."""
    simulated: bool
    """False when no what-if was evaluated for this rank (no lateness to remove); True when it was
    simulated, or proven to leave every step as the baseline's (see ``skewlens.analysis.blame``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostBlameRecord:
    """One row of ``blame_hosts``: what a host costs the job, from a what-if in which every rank of the host
    runs like the median rank at once (a run whose ranks name two hosts or more, one of them with several
    ranks)."""

    host: str
    """The host its ranks recorded (the manifest's ``hosts``)."""
    ranks: list[int]
    """The host's ranks."""
    straggler_cost_ns: int
    """Baseline simulated time of the recorded steps minus the time had every rank of the host run like the
    median rank, each as in its own what-if of ``blame``: where several of its ranks are slow, more than any
    one of their costs, since each rank's own what-if leaves the host's other ranks slow."""
    baseline_ns: int
    """Simulated total step time of the recorded run (sum over steps)."""
    whatif_ns: int
    """Simulated total step time with the compute and gaps of every rank of the host set to the median
    rank's."""
    simulated: bool
    """False when no what-if was evaluated for the host (none of its ranks is slower than the median
    anywhere, or beyond the limit on simulations); True when it was simulated, or proven to leave every step
    as the baseline's, or is its one slow rank's own what-if."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlameStepRecord:
    """One row of ``blame_steps``: one rank's straggler cost in one step."""

    rank: int
    """Global rank."""
    step: int
    """Training step."""
    baseline_step_ns: int
    """Simulated step time of the recorded run."""
    whatif_step_ns: int
    """Simulated step time had this rank run like the median rank."""
    straggler_cost_ns: int
    """Baseline minus what-if."""
