"""What a rank records while capturing: plain, torch-free records (raw local clock, integer ns)."""

from __future__ import annotations

from dataclasses import dataclass

from skewlens.profiler.vocab import CommType, NodeType

#: ``CommRecord.pg_name`` of a collective the hooks timed without reading its arguments: its group,
#: number and sizes are the flight recorder's (:func:`skewlens.profiler.capture.flight.resolve`).
FROM_RECORDER = ""


#: Hooked collectives that make no flight-recorder entry, and how many of their group's numbers each takes:
#: gloo's ``monitored_barrier`` (its point-to-point messages to and from rank 0 take two, on every member).
NO_ENTRY_NUMBERS = {"c10d::monitored_barrier": 2}
#: torch.distributed's debug level; ``DETAIL`` wraps every process group (see
#: :func:`skewlens.profiler.capture.flight.refuse_wrapped_groups`; the real replay's workers' environment).
DEBUG_ENV = "TORCH_DISTRIBUTED_DEBUG"

#: ``CommRecord.end_ns`` of an asynchronous op whose completion the backend does not report.
END_UNKNOWN = -1


@dataclass(frozen=True, kw_only=True, slots=True)
class CommRecord:
    """One collective or point-to-point call issued by this rank."""

    node_type: NodeType
    """COMM_COLL, COMM_SEND or COMM_RECV."""
    op: str
    """Framework op name, e.g. ``c10d::allreduce_`` or ``c10d::send``."""
    comm_type: CommType | None
    """Collective type (None for send/recv)."""
    pg_name: str
    """Name of the process group the call was issued on."""
    seq: int
    """Per-group sequence number of a collective (issue order, identical on all members); -1 for p2p."""
    src: int
    """Global rank of the sender (p2p), else -1."""
    dst: int
    """Global rank of the receiver (p2p), else -1."""
    tag: int
    """p2p tag (0 for collectives)."""
    numel: int
    """Elements of the input tensor(s) this rank passed."""
    dtype: str
    """torch dtype name of the input tensor (``float32``)."""
    size_bytes: int
    """numel x element size of the input tensor(s)."""
    start_ns: int
    """When this rank entered the call (its arrival), local clock."""
    issue_end_ns: int
    """When the call returned to the caller, local clock."""
    end_ns: int
    """When the op completed on this rank (== issue_end_ns for blocking calls), local clock;
    :data:`END_UNKNOWN` for an asynchronous op whose backend gives no completion (gloo's send/recv Work
    has no future): the wait on it, where there is one, says when it completed."""
    is_async: bool
    """Issued with ``async_op=True`` (or by DDP's hook): it completes after the call returned."""
    thread: int
    """Native id of the issuing thread."""
    step: int
    """Training step during which it was issued."""
    ident: int = 0
    """Python identifier (``threading.get_ident()``, the pthread id) of the issuing thread: the flight
    recorder's ``thread_id``; 0 when unknown."""
    batch: int = -1
    """The ``batch_isend_irecv`` call a send/recv was issued in (numbered per process), -1 for none."""
    send_bytes: int = -1
    """An all_to_all with uneven splits: bytes sent to the other members (its own chunk left out); -1 for
    none or even splits."""
    recv_bytes: int = -1
    """Likewise, bytes received from the other members."""
    send_splits: tuple[int, ...] = ()
    """An all_to_all with uneven splits: bytes sent to each member of its group, in group-rank order (its
    own chunk included); () for none or even splits."""
    recv_splits: tuple[int, ...] = ()
    """Likewise, bytes received from each member."""
    reduce_op: str = ""
    """An all_reduce, reduce or reduce_scatter: its ``ReduceOp``'s name, lower case (``max``); '' where
    not known (a call issued from C++) and for other ops."""
    ran_as: str = ""
    """The backend's name for the collective where it ran as another than :attr:`op` says (gloo runs a
    functional reduce_scatter as an all_reduce: its flight-recorder entry and worker event say
    ``gloo:all_reduce``); '' where it ran as what :attr:`op` names."""
    sparse: bool = False
    """A hooked call on a sparse COO tensor (DDP's all_reduce of a ``sparse=True`` embedding's gradient): its
    size is the dense tensor's, while gloo all_gathers the indices and values (the flight recorder names it
    ``gloo:sparse_all_reduce``)."""
    quiet: bool = False
    """Issued with the thread's record functions off (the hooks' quiet calls, once the worker-event
    recorder knows the gloo threads): gloo's worker recorded no ``gloo:*`` event for it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpRecord:
    """One operator / kernel event from Kineto (ops and full levels)."""

    name: str
    """Operator or kernel name (``aten::mm``, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``)."""
    start_ns: int
    """Start, local clock."""
    dur_ns: int
    """Duration, ns."""
    thread: int
    """Host thread id (CPU ops) or CUDA stream (kernels)."""
    is_cpu: bool
    """True for host operators, False for device kernels."""
    device: str = "cpu"
    """``cpu`` or ``cuda:N``."""
    rf_id: int = -1
    """Record-function id (joins PyTorch's host execution trace), -1 when unknown."""
    corr: int = -1
    """Kineto correlation id. Of a host operator its ``External id`` (keys the full level's host facts);
    of a CUDA runtime/driver call and of a GPU activity the CUPTI correlation id, the same on a launch
    call and on what it launched (see :attr:`kind`)."""
    step: int = -1
    """Training step (filled when assigned to a step)."""
    kind: str = ""
    """Kineto's activity type where the profiler gives it for an event of the CUDA path:
    ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (GPU activities, :data:`GPU_KINDS`), ``cuda_runtime``,
    ``cuda_driver`` (host calls, :data:`CALL_KINDS`); ``""`` for host operators."""


#: ``OpRecord.kind`` of the GPU activities that become GPU nodes.
GPU_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: ``OpRecord.kind`` of CUDA runtime and driver calls (launches, event records, synchronisations).
CALL_KINDS = frozenset({"cuda_runtime", "cuda_driver"})


@dataclass(frozen=True, kw_only=True, slots=True)
class CudaSyncRecord:
    """One CUDA synchronisation activity (Kineto's ``cuda_sync``, recorded with
    ``enable_cuda_sync_events``): what a runtime call waited for."""

    kind: str
    """``Stream Wait Event``, ``Stream Sync``, ``Event Sync`` or ``Context Sync``."""
    corr: int
    """CUPTI correlation id of the runtime call that made it (``cudaStreamWaitEvent``,
    ``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventQuery``)."""
    device: int
    """CUDA device index."""
    stream: int
    """The waiting stream (Stream Wait Event) or the stream synchronised (Stream Sync); -1 otherwise."""
    wait_on_stream: int = -1
    """Stream Wait Event, Event Sync: the stream the waited-for event was recorded on, -1 if unknown."""
    record_corr: int = -1
    """Stream Wait Event, Event Sync: correlation id of the ``cudaEventRecord`` that recorded the event,
    -1 if unknown."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord:
    """Boundary of one recorded step on this rank, local clock."""

    step: int
    """Step index (0 = first step seen)."""
    start_ns: int
    """End of the previous step (or capture start)."""
    end_ns: int
    """When ``optimizer.step()`` (or the API's ``step()``) returned."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitRecord:
    """One call in which a host thread waited for an asynchronous communication result
    (:mod:`skewlens.profiler.capture.waits`)."""

    name: str
    """``_c10d_functional::wait_tensor`` or ``c10d::wait``
    (:data:`skewlens.profiler.vocab.WAIT_NODE_NAMES`)."""
    start_ns: int
    """When the thread entered the wait, local clock."""
    end_ns: int
    """When the wait returned, local clock."""
    thread: int
    """Native id of the waiting thread."""
    ident: int
    """``threading.get_ident()`` of the waiting thread (the flight recorder's ``thread_id``)."""
    step: int
    """Training step during which it waited."""
    issue_start_ns: int = -1
    """``Work.wait()``: ``start_ns`` of the hooked asynchronous call that returned the Work; -1 for
    ``wait_tensor`` (matched to its collective when the trace is built)."""
    issue_thread: int = 0
    """``Work.wait()``: native id of the thread that issued that call."""
    took_work: bool = True
    """``wait_tensor``: whether torch's registry of functional collectives' Works held one for the tensor
    (the call took it off and waited on it). False for a second wait on a result already waited for (two
    ``AsyncCollectiveTensor`` wrappers of one result: a sequence-parallel residual add waits on both), which
    returns at once and waited for no collective."""
