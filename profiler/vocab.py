"""The project vocabulary: Chakra node/collective enums and the attribute names we read and write.

Chakra's own attribute names (``comm_type``, ``comm_size``, ``comm_src``, ``comm_dst``, ``comm_tag``,
``pg_name``, ``is_cpu_op``) are what Chakra's feeder and simulators built on it read; we keep to them.
What Chakra has no name for carries the ``skl_`` prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum, StrEnum


class NodeType(IntEnum):
    """Chakra ``NodeType`` (values equal ``et_def_pb2``'s)."""

    INVALID = 0
    METADATA = 1
    MEM_LOAD = 2
    MEM_STORE = 3
    COMP = 4
    COMM_SEND = 5
    COMM_RECV = 6
    COMM_COLL = 7


class CommType(IntEnum):
    """Chakra ``CollectiveCommType`` (values equal ``et_def_pb2``'s)."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


class Level(StrEnum):
    """Capture levels, cheapest first."""

    COLLECTIVES = "collectives"
    OPS = "ops"
    FULL = "full"


class HostTrace(StrEnum):
    """Where the ``full`` level takes its host facts (operator schemas, tensor ids) from."""

    PROFILER = "profiler"  # torch.profiler's own input/allocation records: cheap (the default)
    OBSERVER = "observer"  # PyTorch's ExecutionTraceObserver (its JSON host trace; costly per operator)


class Attr(StrEnum):
    """Attribute names on Chakra nodes."""

    # Chakra's own names
    COMM_TYPE = "comm_type"  # int64, CommType
    COMM_SIZE = "comm_size"  # int64, bytes moved by this rank's call (numel x element size)
    COMM_SRC = "comm_src"  # int32, global rank of the sender (send/recv nodes; a broadcast or scatter's root)
    COMM_DST = "comm_dst"  # int32, global rank of the receiver (send/recv nodes; a reduce or gather's root)
    COMM_TAG = "comm_tag"  # int32
    PG_NAME = "pg_name"  # string, process group name
    IS_CPU_OP = "is_cpu_op"  # bool
    STREAM = "stream"  # int64, CUDA stream or host thread id (as Chakra's converter writes it)
    OP_SCHEMA = "op_schema"  # string, operator schema (full level)
    RF_ID = "rf_id"  # int64, record-function id
    # ours
    SEQ = "skl_seq"  # int64, per-process-group sequence number of a collective instance
    START_NS = "skl_start_ns"  # int64, start on the aligned clock, ns (start_time_micros is its edge form)
    DUR_NS = "skl_dur_ns"  # int64, duration, ns
    STEP = "skl_step"  # int64, training step index
    DTYPE = "skl_dtype"  # string, torch dtype name of the communicated tensor
    NUMEL = "skl_numel"  # int64, element count of the communicated tensor(s)
    OP = "skl_op"  # string, the framework op that issued it (e.g. c10d::allreduce_)
    STREAM_KIND = "skl_stream_kind"  # string, "thread" | "cuda"
    DEVICE = "skl_device"  # string, e.g. "cpu", "cuda:0"
    # bool, the node ran on a host thread. Set on communication nodes, whose is_cpu_op is false by Chakra's
    # convention (ASTRA-sim refuses a comm node on the CPU); where absent, is_cpu_op says it (older traces).
    HOST_OP = "skl_host_op"
    BATCH = "skl_batch"  # int64, the batch_isend_irecv call a send/recv was issued in (per rank)
    # string, on all_reduce / reduce / reduce_scatter nodes a Python call issued: its ReduceOp's name
    # (``sum``, ``max``, ``avg``, ...); absent (older traces, calls issued from C++ such as DDP's): ``sum``
    REDUCE_OP = "skl_reduce_op"
    # int64, all_to_all nodes: bytes this rank sends to the other members / receives from them (its own
    # chunk left out), where its splits were uneven (even splits: (p - 1) / p of comm_size each way)
    SEND_BYTES = "skl_send_bytes"
    RECV_BYTES = "skl_recv_bytes"
    # int64 list, on the same nodes: the bytes this rank sends to / receives from each member of the group,
    # in group-rank order, its own chunk included (the totals above are their sums less that chunk)
    SEND_SPLITS = "skl_send_splits"
    RECV_SPLITS = "skl_recv_splits"
    SHAPES = "skl_shapes"  # string (JSON), input shapes (full level)
    INPUT_TYPES = "skl_input_types"  # string (JSON), input types (full level)
    # int64, GPU nodes: recorded start of the runtime call that launched it (cudaLaunchKernel,
    # cudaMemcpyAsync, ...), on the node's clock. See "GPU dependencies" below.
    LAUNCH_NS = "skl_launch_ns"
    # int64, GPU nodes: id of the host node whose launch call launched it, where that host node then
    # synchronised on the node's stream (``.item()``, a blocking copy): not a ctrl dep, which would close a
    # cycle with the synchronisation. See "GPU dependencies" below.
    LAUNCHED_IN = "skl_launched_in"
    # int64, asynchronous communication nodes (issued on a communication stream): when the call that issued
    # it returned, on the aligned clock. The call may block (gloo's isend writes its data inside the call
    # once the peer has posted its recv), so the op had not completed before then.
    RETURN_NS = "skl_return_ns"
    # int64 list, node ids among this node's ctrl deps that were inferred from timing (a trace without
    # CUDA sync events), not read from a recorded event. See "GPU dependencies" below.
    INFERRED_DEPS = "skl_inferred_deps"


# GPU dependencies: how dependencies between host and GPU nodes read (importers and capture write them so,
# the execution model reads them so):
#
# - a GPU node's ctrl dep on a host node is its **launch**: the node cannot start before the launch call
#   (``skl_launch_ns``, inside that host node) began, and need not wait for the host node to end;
# - a GPU node's ctrl dep on a GPU node is **stream order** or an **event wait** (``cudaEventRecord`` ->
#   ``cudaStreamWaitEvent``): it cannot start before that node ends;
# - a host node's ctrl dep on a GPU node is a **synchronisation** (stream, event or device synchronise,
#   a blocking copy): the host node blocks inside until that node ends.
# - a host node that launched GPU work and then synchronised on that work's stream (``.item()``: a copy,
#   then a stream synchronise) cannot also be that work's ctrl dep (a cycle): the work names it in
#   ``skl_launched_in`` instead, and it is a launch all the same, met at the host node's arrival plus the
#   call's place inside it (before the host node blocks).
# - a captured communication node (its call and its NCCL kernel, starting at the call) has no launch edge;
#   its ctrl dep on a GPU node is the **event wait** of its NCCL kernel (NCCL's stream waits for the
#   stream current at the call): its transfer, not the call, waits for that node.


#: Chakra attributes whose value is an ``int32_val``, not the ``int64_val`` every other integer is written
#: as: Chakra's feeder (``src/feeder/et_feeder_node.cpp``, which ASTRA-sim builds on) reads these three with
#: ``attr.int32_val()``, which is 0 for a value written as ``int64_val``.
CHAKRA_INT32_ATTRS = frozenset({Attr.COMM_SRC, Attr.COMM_DST, Attr.COMM_TAG})

#: Name of the METADATA node that lists process groups, as PyTorch host traces name it.
PG_INIT_NODE_NAME = "## process_group:init ##"

#: Capture at the ``collectives`` level: COMP node standing for all host time between two comm calls.
COMPUTE_GAP_NODE_NAME = "compute"
#: Capture at the ``ops``/``full`` levels: COMP node standing for main-thread host time inside no operator
#: (Python, sleeps, waits). Analyses count it as host idle, not compute.
UNTRACED_NODE_NAME = "untraced"

#: What ends the names of torch.compile's compile-time work in a trace (``torch._dynamo.utils.dynamo_timed``'s
#: record functions): dynamo's bytecode tracing, AOTAutograd's, inductor's lowering. Recorded at the ``ops``
#: and ``full`` levels where no operator encloses them (not inside ``DistributedDataParallel.forward``, which
#: compiles ``DDP(torch.compile(net))``'s module), not at ``collectives``.
COMPILE_MARK = " (dynamo_timed)"
#: The record function torch.compile opens around each frame it compiles (dynamo's chromium event): where
#: nothing encloses it, the ``ops`` level keeps it as one node and drops the ``(dynamo_timed)`` ones inside
#: (``torch.compile(DDP(model))`` on 2 ranks: a ``dynamo`` node of 185.6 ms and no other compile event).
COMPILE_FRAME_NAME = "dynamo"


def names_compile_work(name: str) -> bool:
    """A node or operator name that is torch.compile's compile-time work: its frame
    (:data:`COMPILE_FRAME_NAME`) or one of ``dynamo_timed``'s record functions (:data:`COMPILE_MARK`). The
    capture's wait filter and the analyses' compiled steps both read it."""
    return name == COMPILE_FRAME_NAME or name.endswith(COMPILE_MARK)


#: COMP nodes that stand for a host thread blocked on an asynchronous communication result: the wait for a
#: functional collective (``wait_tensor``, what DTensor's ``AsyncCollectiveTensor`` calls when its value
#: is first used) and ``Work.wait()``. Such a node depends on the communication node it waited for; the
#: execution model counts its time up to that node's completion as waiting, the rest as its own work.
WAIT_NODE_NAMES = frozenset({"_c10d_functional::wait_tensor", "c10d::wait"})

#: How long after a gloo collective completed its worker event may end: the worker records the end after the
#: work's future completed and woke its waiter (``Work::finish`` runs after ``markCompleted``); on a loaded
#: machine the woken thread can run first, for up to a few scheduler slices.
GLOO_FINISH_LAG_NS = 10_000_000

#: Schema tag written into the Chakra GlobalMetadata of files we write.
ET_SCHEMA = "skewlens-chakra-1"

#: Base name (:func:`op_base`) of gloo's all_reduce of a sparse tensor, which its
#: flight recorder names ``gloo:sparse_all_reduce`` and records with the dense tensor's size.
SPARSE_ALL_REDUCE_OP = "sparse_all_reduce"

#: Map from the torch / c10d op vocabulary to Chakra collective types: the base names (after the last
#: ``:``, without trailing ``_``, lower-cased) of ``c10d::`` / ``_c10d_functional::`` ops, of the backend
#: annotations ProcessGroupNCCL records (``nccl:_all_gather_base``, ``nccl:reduce_scatter_tensor_coalesced``)
#: and of ``record_param_comms``'s ``Collective name`` (``_allgather_base``, ``all_to_allv``). Coalesced
#: forms are one collective of their kind (one NCCL group, one kernel).
COLLECTIVE_BY_OP: dict[str, CommType] = {
    "allreduce": CommType.ALL_REDUCE,
    "all_reduce": CommType.ALL_REDUCE,
    "allreduce_coalesced": CommType.ALL_REDUCE,
    "all_reduce_coalesced": CommType.ALL_REDUCE,
    # gloo's all_reduce of a sparse COO tensor (DDP's gradient of an ``EmbeddingBag(sparse=True)``): the
    # program called an all_reduce; gloo runs it as all_gathers of each rank's indices and values
    # (:data:`SPARSE_ALL_REDUCE_OP`)
    SPARSE_ALL_REDUCE_OP: CommType.ALL_REDUCE,
    "reduce": CommType.REDUCE,
    "_reduce_oop": CommType.REDUCE,
    "allgather": CommType.ALL_GATHER,
    "all_gather": CommType.ALL_GATHER,
    "_allgather_base": CommType.ALL_GATHER,
    "_all_gather_base": CommType.ALL_GATHER,
    "allgather_coalesced": CommType.ALL_GATHER,
    "allgather_into_tensor_coalesced": CommType.ALL_GATHER,
    "all_gather_into_tensor_coalesced": CommType.ALL_GATHER,
    "all_gather_into_tensor": CommType.ALL_GATHER,
    "gather": CommType.GATHER,
    "scatter": CommType.SCATTER,
    "broadcast": CommType.BROADCAST,
    "_broadcast_oop": CommType.BROADCAST,
    "alltoall": CommType.ALL_TO_ALL,
    "all_to_all": CommType.ALL_TO_ALL,
    "alltoall_base": CommType.ALL_TO_ALL,
    "all_to_allv": CommType.ALL_TO_ALL,
    "all_to_all_single": CommType.ALL_TO_ALL,
    "reduce_scatter": CommType.REDUCE_SCATTER,
    "_reduce_scatter_base": CommType.REDUCE_SCATTER,
    "reduce_scatter_tensor": CommType.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": CommType.REDUCE_SCATTER,
    "barrier": CommType.BARRIER,
    "monitored_barrier": CommType.BARRIER,
}

#: Collective types whose members must all report the same size (what "size differs" means:
#: :mod:`skewlens.profiler.store.match`); all_to_all, gather and scatter members legitimately differ.
SIZE_MUST_MATCH = frozenset(
    {
        CommType.ALL_REDUCE,
        CommType.REDUCE,
        CommType.BROADCAST,
        CommType.BARRIER,
        CommType.ALL_GATHER,
        CommType.REDUCE_SCATTER,
        CommType.REDUCE_SCATTER_BLOCK,
    }
)

COMM_NODE_TYPES = frozenset({NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV})
P2P_NODE_TYPES = frozenset({NodeType.COMM_SEND, NodeType.COMM_RECV})


#: Start of the kernels RCCL (ROCm's NCCL) runs its MSCCL algorithms as, ``mscclKernel_<op>_<type>_<proto>_
#: <fullOps>`` (``src/include/msccl/msccl_kernel.h``): a collective's GPU side, as NCCL's kernels are. On
#: MI300X MSCCL is on by default (RCCL's README), so an all_reduce may run as one.
MSCCL_KERNEL_PREFIX = "mscclKernel_"


def names_nccl_kernel(name: str) -> bool:
    """A GPU kernel name that is NCCL's or RCCL's (``ncclKernel_*``, ``ncclDevKernel_*``,
    ``ncclDevKernelDebug_*``: it starts with ``nccl``, in any case; RCCL's :data:`MSCCL_KERNEL_PREFIX`). The
    importer reads such a kernel as the GPU side of a collective or send/recv, and keeps it as a COMP node
    where it cannot say which; the execution model counts those as communication."""
    return name[:4].lower() == "nccl" or name.startswith(MSCCL_KERNEL_PREFIX)


#: How GPU copies and memsets are named: Kineto's copy and memset activities, and the kernels ROCm's runtime
#: runs some of them as (ROCclr's blit kernels, ``BlitName`` in its ``blitmgr``: ``__amd_rocclr_copyBuffer``,
#: ``__amd_rocclr_fillBufferAligned``, ...; a ``hipMemsetAsync`` is one), recorded as kernels.
GPU_MEMORY_OP_PREFIXES = ("Memcpy", "Memset", "__amd_rocclr_copy", "__amd_rocclr_fill")


def names_gpu_memory_op(name: str) -> bool:
    """A GPU activity name that is a copy or a memset (Kineto's ``Memcpy HtoD (Pageable -> Device)``,
    ``Memset (Device)``; ROCm's ``__amd_rocclr_fillBufferAligned`` kernel): memory work, not compute, in a
    GPU-only compute figure (as HTA reads them on CUDA)."""
    return name.startswith(GPU_MEMORY_OP_PREFIXES)


def uneven_splits(
    sent: Sequence[int], got: Sequence[int], me: int
) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
    """An all_to_all member's uneven splits, from the bytes it sends to and receives from each member of its
    group (group-rank order; ``me``: its own index): (bytes to the other members, bytes from them, its own
    chunk left out; ``sent``; ``got``), what :attr:`Attr.SEND_BYTES`, :attr:`Attr.RECV_BYTES`,
    :attr:`Attr.SEND_SPLITS` and :attr:`Attr.RECV_SPLITS` hold. None for even splits (every chunk the same:
    the cost formulas' ``(p - 1) / p`` of ``comm_size`` each way), where the trace records none."""
    if len(set(sent)) <= 1 and set(got) <= set(sent):
        return None
    return sum(sent) - sent[me], sum(got) - got[me], tuple(sent), tuple(got)


#: Collectives that move nothing and wait for no one where every member's call is empty (0 bytes): gloo
#: returns at once (a 2-rank capture: rank 0's empty all_reduce, all_gather, reduce_scatter or reduce
#: took under 1 ms while rank 1 arrived 500 ms later; its broadcast, scatter, gather and all_to_all waited
#: the 500 ms), and NCCL discards every empty collective (``taskAppend``: "Empty collectives can be
#: discarded"). PowerSGD's DDP hook issues one each step (the uncompressed part of a bucket without one).
#: The execution model has each member wait for no one (``skewlens.replay.execution``), the network model
#: costs them nothing (``skewlens.replay.comm``), and the real replay issues them empty too
#: (``skewlens.replay.real.ops``).
EMPTY_WAITS_FOR_NONE = frozenset(
    {CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.REDUCE}
)


def collective_message_bytes(comm_type: CommType, p: int, members: Sequence[tuple[int, int, int]]) -> int:
    """The message size ``S`` a collective of a group of ``p`` moves, from its members' ``(comm_size, bytes
    sent to the others, bytes received from them)`` (the last two -1 where the member recorded even splits):
    what the replay's cost formulas take (``skewlens.replay.lower.collective_bytes``) and what the
    ASTRA-sim export writes as every member's ``comm_size`` (``skewlens.replay.export_astra``).

    The largest member's ``comm_size``, except: a scatter whose members all recorded the same size (their
    piece, the capture's ``scatter(tensor, ...)`` output) moves ``p`` pieces from its root; an all_to_all is
    charged ``(p − 1)/p · S`` through each member's port (even splits), so where some member's splits were
    uneven ``S = ⌈D · p / (p − 1)⌉`` with ``D`` the most any member sends to the others or receives from
    them; a member that recorded neither sent ``p − 1`` equal parts of its ``comm_size``, ``comm_size // p``
    each (``skewlens.replay.network.algorithms.even_split_bytes``)."""
    nbytes = max((m[0] for m in members), default=0)
    if comm_type == CommType.SCATTER and min((m[0] for m in members), default=0) == nbytes:
        return nbytes * p
    if comm_type != CommType.ALL_TO_ALL or p <= 1:
        return nbytes
    busiest, uneven = 0, False
    for size, sent, got in members:
        if sent >= 0:
            uneven = True
            busiest = max(busiest, sent, got)
        else:
            busiest = max(busiest, (p - 1) * (size // p))
    return -(-busiest * p // (p - 1)) if uneven else nbytes


def op_base(op_name: str) -> str:
    """The base name of a torch op name, as :data:`COLLECTIVE_BY_OP` keys it: after the last ``:``, without
    trailing ``_``, lower-cased (``c10d::allreduce_`` is ``allreduce``, ``gloo:sparse_all_reduce``
    ``sparse_all_reduce``)."""
    return op_name.rsplit(":", 1)[-1].strip().rstrip("_").lower()


def collective_from_op(op_name: str) -> CommType | None:
    """Chakra collective type of a torch op name such as ``c10d::allreduce_`` or ``nccl:all_reduce``."""
    return COLLECTIVE_BY_OP.get(op_base(op_name))


#: Element size in bytes by dtype name, lower-cased, as Kineto and the flight recorder (``Float``,
#: ``BFloat16``), host traces (``long int``) or torch (``float32``) spell it.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4,
    "short": 2, "short int": 2, "int16": 2, "char": 1, "signed char": 1, "int8": 1, "byte": 1,
    "unsigned char": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complexfloat": 8, "c10::complex<float>": 8, "complexdouble": 16, "c10::complex<double>": 16,
}  # fmt: skip


#: torch's dtype name of each name Kineto (and the flight recorder) gives a tensor's element type (``Float``,
#: ``BFloat16``): what a trace imported from Kineto records as ``skl_dtype``.
TORCH_DTYPE_NAMES: dict[str, str] = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
    "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
    "ComplexFloat": "complex64", "ComplexDouble": "complex128",
}  # fmt: skip


def dtype_bytes(dtype: str) -> int:
    """Element size of a dtype named any of the ways :data:`DTYPE_BYTES` knows (case-insensitive), 0 if
    unknown."""
    return DTYPE_BYTES.get(dtype.strip().lower(), 0)


#: File names of the JSON traces torch writes (Kineto, host execution traces), compressed or not, and of
#: the archives that hold them: what ``skewlens import`` reads, and what the loader takes for such traces.
TRACE_SUFFIXES = (".json", ".json.gz")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
