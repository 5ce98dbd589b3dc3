"""Extrapolate a run to N data-parallel ranks (``skewlens replay scale.dp=N``): :func:`scale_run`.

**What is recognised** (:func:`identify`). Process groups are compared by their members. Groups that
span every rank of the run are *world* groups; the others must form *families*: sets of disjoint groups of
one size that together cover the world (two groups of different families meet in exactly one rank, as
the rows and columns of a mesh do).

- No family: a 1-D run. Its world groups carry the data parallelism: *DDP* (all_reduces of gradient
  buckets; broadcasts, barriers) or *FSDP2* (all_gathers of parameter shards, reduce_scatters of
  gradients). A world group whose every all_reduce is waited on by ``_c10d_functional::wait_tensor`` and
  that has no all_gather / reduce_scatter is DTensor tensor parallelism, not data parallelism: refused.
- One or two families: a 2-D mesh (``init_device_mesh``, row- or column-major). Which family is data
  parallel is read from the groups' descriptions (``mesh_dp``, ``mesh_tp``: :data:`DP_WORDS`,
  :data:`OTHER_WORDS`), else from what they carry (reduce_scatters: FSDP; functional all_reduces: TP). The
  other family (tensor, context, expert parallelism inside a replica) is *replicated*: every new replica
  gets copies of its groups, unchanged in size. With one family only, it must be the data-parallel one.
  Where both read as data parallel and one only all-reduces while the other all-gathers or
  reduce-scatters, the run is hybrid sharding (HSDP): the all-reducing replicas scale, the shard groups
  are replicated (:func:`_hsdp`).
- Refused, with what was found: send/recv (pipeline parallelism), more than two families, groups that do
  not tile the ranks, two data-parallel-looking families not told apart so, a data-parallel group carrying
  all_to_all / gather / scatter, a run without collectives, a lenient load that skipped communication.

**What is built.** New replica ``d'`` (``0 <= d' < N``) copies a captured replica (a captured data-parallel
coordinate ``d``): ``d' mod k`` (the default: the captured spread repeats), a seeded uniform choice
(``seed``), or the replica of one rank (``source``); in a 1-D run a replica is one rank. Each new rank
shares its source rank's columns (numpy arrays, not copies): node ids, durations, start times,
dependencies, streams and steps; only ``comm_bytes`` (once per source rank, where sizes change), for
the copies of replicated groups ``pg``, and ``src`` / ``dst`` where a rooted collective's root (a
broadcast's source, a reduce's destination) has a new number are new arrays: a root keeps its place,
the same member of the copied group (``(d', j)`` in a replicated group of replica ``d'``; ``(d, j)`` in a
data-parallel or world group: unknown, -1, where ``d >= N``). Ranks are numbered as the capture numbered them
(``d*t + j`` row-major, ``j*N + d`` column-major, ``t`` ranks per replica, ``j`` the coordinate inside it).
Data-parallel groups keep their names and get the N (or N per tp coordinate) new members; world groups
get every new rank; a replicated group of new replica ``d'`` copied from captured replica ``d`` keeps its
name where ``d' == d`` and is named ``<name>@dp<d'>`` otherwise. Collectives are re-matched per (group,
seq) over the new members (rows from each member's source), so the execution model and the simulator see
an ordinary run of ``N·t`` ranks.

**Communication sizes** (``comm_bytes`` is the bytes of this rank's input buffer, Chakra's ``comm_size``,
see :mod:`skewlens.profiler.importers.convert`): on data-parallel groups, all_reduce, broadcast, reduce,
barrier and reduce_scatter keep their bytes (gradient buckets are the model's; a reduce_scatter's input
is the full gradient); under FSDP2 an all_gather's input is this rank's shard of a gathered size that
stays, ``bytes · k / N`` rounded up to whole elements of the recorded dtype (to the byte where none is
recorded: :func:`_shard_bytes`; FSDP2's padding to whole dim-0 rows is not modelled), but a gather into a
list (:data:`LIST_GATHER_OPS`: metrics, objects) keeps its bytes, unless it gathers a reduce_scatter's
size (FSDP1's flat parameter on the CPU: :func:`_kept_list_gathers`); under DDP an all_gather (metrics,
objects) keeps its per-rank input. Replicated groups keep everything. The new run is meant for
``comm_mode=model``: the recorded transfers of k ranks say nothing about N.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from skewlens.profiler.manifest import SCALE_NOTE, ProcessGroupInfo, StepSpan, creation_order, own_desc
from skewlens.profiler.store.issues import by_reason, counted, rank_ranges, ranks_label
from skewlens.profiler.store.model import CollectiveInstance, RankTrace, RunTrace, type_mask
from skewlens.profiler.vocab import P2P_NODE_TYPES, CommType, NodeType, dtype_bytes
from skewlens.replay.errors import ConfigError, ExtrapolationError

#: Words of a group description that name data parallelism (``mesh_dp``, ``dp_shard``, ``replicate``).
DP_WORDS = frozenset({"dp", "ddp", "fsdp", "data", "replicate", "shard", "hsdp", "zero"})
#: Words of a group description that name parallelism inside a replica (replicated when scaling).
OTHER_WORDS = frozenset({"tp", "tensor", "sp", "sequence", "cp", "context", "ep", "expert", "pp", "pipeline"})
#: Collective types whose bytes a data-parallel resize keeps (every member holds the whole tensor, or a
#: reduce_scatter's whole input).
KEEP_BYTES = frozenset(
    {
        CommType.ALL_REDUCE,
        CommType.BROADCAST,
        CommType.REDUCE,
        CommType.BARRIER,
        CommType.REDUCE_SCATTER,
        CommType.REDUCE_SCATTER_BLOCK,
        CommType.ALL_GATHER,
    }
)
#: The ops of an all_gather into a list of tensors (``dist.all_gather``, ``all_gather_object``), as a capture
#: (``c10d::allgather_``) and ProcessGroupNCCL's annotation (``nccl:all_gather``) name them. FSDP2 gathers its
#: parameters into one tensor (``all_gather_into_tensor``: ``c10d::_allgather_base_``), never into a list: a
#: list-form gather on an FSDP2 run's data-parallel group is of metrics or objects, whose bytes per rank stay,
#: but where it gathers the size of a gradient reduce_scatter, as FSDP1 on the CPU gathers its flat parameter.
#: (An imported GPU trace's collective is its NCCL kernel, whose name does not say which form it was.)
LIST_GATHER_OPS = frozenset({"c10d::allgather_", "nccl:all_gather"})
#: The source option that draws from every captured replica.
ALL_SOURCES = "all"
#: Memory a replayed node and a replayed rank cost, about (peak resident memory of ``skewlens replay
#: scale.dp=N comm_mode=model``: a 2-rank capture of ``examples/ddp_accum.py``, 2,050 nodes a rank, took
#: 410 MiB at N = 1,024 and 1,463 MiB at 8,192; a synthetic run of 9 nodes a rank 120 and 187 MiB).
NODE_BYTES = 75
RANK_BYTES = 9_500

DDP = "ddp"
FSDP2 = "fsdp2"
#: What a family of shard groups carries (FSDP's parameter gathers and gradient reduce_scatters).
_SHARDED_TYPES = (CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.REDUCE_SCATTER_BLOCK)
#: What a family of HSDP's replica groups carries (the gradient shards' all_reduce; buffers, barriers).
_REPLICA_TYPES = frozenset({CommType.ALL_REDUCE, CommType.BROADCAST, CommType.BARRIER})

_FUNCTIONAL_WAIT = "_c10d_functional::wait_tensor"
_V = TypeVar("_V")


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """How a run's ranks are laid out: what is data parallel, what is replicated (see the module doc)."""

    parallelism: str
    """``ddp`` or ``fsdp2`` (of the data-parallel groups)."""
    inner: str
    """What the replicated groups carry (``tp``, ...), ``""`` for a 1-D run."""
    dp_size: int
    """Captured data-parallel degree ``k`` (ranks per data-parallel group)."""
    tp_size: int
    """Ranks per replica ``t`` (1 for a 1-D run)."""
    row_major: bool
    """Captured rank = ``d*t + j`` (else ``j*k + d``)."""
    dp_groups: tuple[tuple[str, ...], ...]
    """Per coordinate ``j`` inside a replica, the names of the data-parallel groups along it."""
    replica_groups: tuple[tuple[str, ...], ...]
    """Per captured replica ``d``, the names of its replicated groups."""
    world_groups: tuple[str, ...]
    """Groups spanning every rank that are not data-parallel groups (2-D meshes)."""
    coord: Mapping[int, tuple[int, int]]
    """Captured rank -> ``(d, j)``."""
    described: str
    """One line: what was recognised."""

    def rank_of(self, d: int, j: int, dp: int) -> int:
        """Rank at ``(d, j)`` of a mesh of ``dp`` replicas numbered as the capture numbers them."""
        return d * self.tp_size + j if self.row_major else j * dp + d


@dataclass(frozen=True, slots=True)
class _Group:
    name: str
    ranks: tuple[int, ...]
    desc: str
    types: Counter[CommType]
    functional_all_reduces: int


def _tokens(desc: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", desc.lower())) - {""}


def _count_text(types: Counter[CommType]) -> str:
    return ", ".join(f"{n} {t.name.lower()}" for t, n in sorted(types.items(), key=lambda x: -x[1]))


def _desc_text(name: str, desc: str) -> str:
    """``, mesh_dp``: a group's description where it says more than its name."""
    return f", {own}" if (own := own_desc(name, desc)) else ""


def _group_text(g: _Group) -> str:
    what = _count_text(g.types) or "no collectives"
    return f"'{g.name}' (ranks {rank_ranges(g.ranks)}{_desc_text(g.name, g.desc)}: {what})"


def _found(groups: Iterable[_Group]) -> str:
    return "found " + "; ".join(_group_text(g) for g in groups)


#: How many sender -> receiver pairs, and groups, a refusal of send/recv names (then how many more).
SHOWN_PAIRS = 6


def _pairs_text(run: RunTrace) -> str:
    """The matched send/recv pairs by sender -> receiver, and the groups they are on with their
    descriptions: ``(8 matched pairs: 0->4 x1, ... and 2 more) on 4 groups: 'pp0' (ranks 0, 4, mesh_pp),
    ...``."""
    pairs = sorted(Counter((p.src_rank, p.dst_rank) for p in run.p2p).items())
    shown = ", ".join(f"{a}->{b} x{n}" for (a, b), n in pairs[:SHOWN_PAIRS])
    more = f" and {len(pairs) - SHOWN_PAIRS} more" if len(pairs) > SHOWN_PAIRS else ""
    text = f"({len(run.p2p)} matched pairs{': ' + shown + more if shown else ''})"
    names = sorted({p.pg_name for p in run.p2p if p.pg_name}, key=creation_order)
    if not names:
        return text
    groups = []
    for n in names[:SHOWN_PAIRS]:
        pg = run.process_groups.get(n)
        if pg is None:
            groups.append(f"'{n}'")
        else:
            groups.append(f"'{n}' (ranks {rank_ranges(pg.ranks)}{_desc_text(n, pg.desc)})")
    rest = f" and {len(names) - SHOWN_PAIRS} more" if len(names) > SHOWN_PAIRS else ""
    return f"{text} on {counted(len(names), 'group')}: {', '.join(groups)}{rest}"


def _functional_rows(rt: RankTrace) -> set[int]:
    """Collective rows of ``rt`` that a ``_c10d_functional::wait_tensor`` node depends on."""
    if _FUNCTIONAL_WAIT not in rt.names:
        return set()
    idx = rt.names.index(_FUNCTIONAL_WAIT)
    waits = np.flatnonzero((rt.name_idx == idx) & (rt.node_type == int(NodeType.COMP)))
    out: set[int] = set()
    for w in waits.tolist():
        deps = rt.deps_of(w)
        out.update(int(d) for d in deps[rt.node_type[deps] == int(NodeType.COMM_COLL)].tolist())
    return out


def _used_groups(run: RunTrace) -> list[_Group]:
    """The process groups that carry collectives, with what they carry (matched instances; a group only
    unmatched collectives name is listed with none)."""
    types: dict[str, Counter[CommType]] = {}
    functional: Counter[str] = Counter()
    waited = {r: _functional_rows(rt) for r, rt in run.ranks.items()}
    for c in run.collectives:
        types.setdefault(c.pg_name, Counter())[c.comm_type] += 1
        if c.comm_type == CommType.ALL_REDUCE and c.rows and c.rows[0] in waited.get(c.ranks[0], ()):
            functional[c.pg_name] += 1
    for rt in run.ranks.values():
        coll = rt.node_type == int(NodeType.COMM_COLL)
        for gi in np.unique(rt.pg[coll & (rt.pg >= 0)]).tolist():
            types.setdefault(run.pg_names[gi], Counter())
    out = []
    for name, counts in types.items():
        info = run.process_groups.get(name)
        out.append(
            _Group(
                name=name,
                ranks=tuple(info.ranks) if info is not None else (),
                desc=info.desc if info is not None else "",
                types=counts,
                functional_all_reduces=functional[name],
            )
        )
    return sorted(out, key=lambda g: (-len(g.ranks), min(g.ranks, default=0), g.name))


def _role(family: Sequence[_Group]) -> str:
    """``dp``, ``other`` or ``""`` (cannot tell) for a family of groups."""
    words = set().union(*(_tokens(g.desc) for g in family))
    says_dp, says_other = bool(words & DP_WORDS), bool(words & OTHER_WORDS)
    if says_dp != says_other:
        return "dp" if says_dp else "other"
    types: Counter[CommType] = sum((g.types for g in family), Counter())
    if types[CommType.ALL_TO_ALL]:
        return "other"
    functional = sum(g.functional_all_reduces for g in family)
    if functional and functional == types[CommType.ALL_REDUCE] and not types[CommType.REDUCE_SCATTER]:
        return "other"
    if types[CommType.REDUCE_SCATTER] or (types[CommType.ALL_REDUCE] and not functional):
        return "dp"
    return ""


def _families(groups: Sequence[_Group], world: tuple[int, ...]) -> list[list[_Group]]:
    """Sub-world groups split into families (pairwise disjoint groups tiling the world), or an error."""
    subs = [g for g in groups if len(g.ranks) < len(world)]
    by_set: dict[frozenset[int], list[_Group]] = {}
    for g in subs:
        by_set.setdefault(frozenset(g.ranks), []).append(g)
    sets = list(by_set)
    parent = list(range(len(sets)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a in range(len(sets)):
        for b in range(a + 1, len(sets)):
            if sets[a].isdisjoint(sets[b]):
                parent[find(a)] = find(b)
    comps: dict[int, list[frozenset[int]]] = {}
    for i, s in enumerate(sets):
        comps.setdefault(find(i), []).append(s)
    out: list[list[_Group]] = []
    everyone = frozenset(world)
    for members in comps.values():
        sizes = {len(s) for s in members}
        covered = frozenset().union(*members)
        disjoint = sum(len(s) for s in members) == len(covered)
        if len(sizes) != 1 or covered != everyone or not disjoint or len(members[0]) < 2:
            found = _found(subs)
            raise ExtrapolationError(
                f"the process groups do not tile the ranks as a mesh does (groups of one size, disjoint, "
                f"covering all {len(world)} ranks): {found}"
            )
        out.append(sorted((g for s in members for g in by_set[s]), key=lambda g: min(g.ranks)))
    return sorted(out, key=lambda f: -len(f[0].ranks))


def _parallelism(dp_groups: Sequence[_Group]) -> str:
    types: Counter[CommType] = sum((g.types for g in dp_groups), Counter())
    bad = [t for t in types if t not in KEEP_BYTES]
    if bad:
        raise ExtrapolationError(
            f"the data-parallel group carries {', '.join(t.name.lower() for t in bad)}, for which there is "
            f"no data-parallel resize rule (expert or sequence parallelism?): {_found(dp_groups)}"
        )
    return FSDP2 if types[CommType.REDUCE_SCATTER] or types[CommType.REDUCE_SCATTER_BLOCK] else DDP


def identify(run: RunTrace) -> Layout:
    """The data-parallel layout of ``run`` (see the module docstring), or an :class:`ExtrapolationError`
    saying what was found."""
    where = f"{run.run_dir}: cannot extrapolate to more data-parallel ranks"
    try:
        return _identify(run)
    except ExtrapolationError as e:
        raise ExtrapolationError(f"{where}: {e}") from None


def _identify(run: RunTrace) -> Layout:
    world = tuple(range(run.world_size))
    groups = _used_groups(run)
    p2p = sum(int(type_mask(rt.node_type, P2P_NODE_TYPES).sum()) for rt in run.ranks.values())
    if p2p:
        raise ExtrapolationError(
            f"found {p2p} send/recv node(s) {_pairs_text(run)}: "
            "point-to-point communication (pipeline parallelism) has no data-parallel resize rule"
        )
    if run.skipped_comm:
        raise ExtrapolationError(
            f"a lenient load skipped {len(run.skipped_comm)} communication(s) whose members disagree: "
            "extrapolating copies that disagreement; load the run strictly (lenient=false)"
        )
    if not run.collectives:
        raise ExtrapolationError("found no collectives: no data-parallel group to identify")
    for g in groups:
        if not g.ranks:
            raise ExtrapolationError(f"group '{g.name}' is not in the manifest's process groups")
    whole = [g for g in groups if len(g.ranks) == len(world)]
    families = _families(groups, world)
    if not families:
        return _one_d(run, whole)
    if len(families) > 2:
        raise ExtrapolationError(
            f"{len(families)} families of groups (a mesh of more than two dimensions): {_found(groups)}"
        )
    missing = sorted(set(world) - set(run.ranks))
    if missing:
        raise ExtrapolationError(
            f"a 2-D mesh needs every rank's trace; ranks {rank_ranges(missing)} have none: {_found(groups)}"
        )
    roles = [_role(f) for f in families]
    dp = [f for f, r in zip(families, roles, strict=True) if r == "dp"]
    other = [f for f, r in zip(families, roles, strict=True) if r == "other"]
    if len(dp) == 2 and not other:
        dp, other = _hsdp(dp)
    if len(dp) != 1 or len(dp) + len(other) != len(families):
        what = "; ".join(
            f"{r or 'unknown role'}: {', '.join(_group_text(g) for g in f)}"
            for f, r in zip(families, roles, strict=True)
        )
        raise ExtrapolationError(
            "cannot tell which mesh dimension is data parallel (one must be, by its groups' descriptions, "
            f"e.g. mesh_dp / mesh_tp, or by what it carries): {what}"
        )
    return _mesh(run, dp[0], other[0] if other else None, whole)


def _hsdp(dp: list[list[_Group]]) -> tuple[list[list[_Group]], list[list[_Group]]]:
    """Two families that both read as data parallel: hybrid sharding (HSDP: FSDP1's ``HYBRID_SHARD``,
    FSDP2 on a 2-D mesh) where one family only all-reduces (the replicas, which scale) and the other
    all-gathers or reduce-scatters (the shards inside a replica, replicated as they are); else both
    back (refused: which one scales is not said)."""
    shards = [f for f in dp if _shards(f)]
    reduces = [f for f in dp if f not in shards and all(set(g.types) <= _REPLICA_TYPES for g in f)]
    return (reduces, shards) if len(shards) == 1 and len(reduces) == 1 else (dp, [])


def _shards(family: Sequence[_Group]) -> bool:
    """Whether a family of groups carries FSDP's shard traffic (:data:`_SHARDED_TYPES`)."""
    return any(g.types[t] for g in family for t in _SHARDED_TYPES)


def _one_d(run: RunTrace, whole: Sequence[_Group]) -> Layout:
    types: Counter[CommType] = sum((g.types for g in whole), Counter())
    functional = sum(g.functional_all_reduces for g in whole)
    sharded = types[CommType.ALL_GATHER] or types[CommType.REDUCE_SCATTER]
    if functional and functional == types[CommType.ALL_REDUCE] and not sharded:
        raise ExtrapolationError(
            f"every all_reduce is a functional collective waited on by {_FUNCTIONAL_WAIT} (DTensor tensor "
            f"parallelism, not DDP's gradient buckets): {_found(whole)}"
        )
    parallelism = _parallelism(whole)
    k = run.world_size
    coord = {r: (r, 0) for r in run.ranks}
    names = tuple(g.name for g in whole)
    return Layout(
        parallelism=parallelism,
        inner="",
        dp_size=k,
        tp_size=1,
        row_major=True,
        dp_groups=(names,),
        replica_groups=tuple(() for _ in range(k)),
        world_groups=(),
        coord=coord,
        described=f"{parallelism} over {', '.join(_group_text(g) for g in whole)}",
    )


def _by_members(groups: Sequence[_Group]) -> list[list[_Group]]:
    """Groups with the same members together (aliases), ordered by their lowest rank."""
    by: dict[frozenset[int], list[_Group]] = {}
    for g in groups:
        by.setdefault(frozenset(g.ranks), []).append(g)
    return [by[s] for s in sorted(by, key=min)]


def _mesh(run: RunTrace, dp: list[_Group], other: list[_Group] | None, whole: Sequence[_Group]) -> Layout:
    dp_sets = _by_members(dp)
    t, k = len(dp_sets), len(dp_sets[0][0].ranks)
    coord: dict[int, tuple[int, int]] = {}
    for j, (g, *_aliases) in enumerate(dp_sets):
        for pos, r in enumerate(g.ranks):
            coord[r] = (pos, j)
    replica_groups: list[tuple[str, ...]] = [() for _ in range(k)]
    if other is not None:
        other_sets = _by_members(other)
        if len(other_sets) != k or len(other_sets[0][0].ranks) != t:
            raise ExtrapolationError(
                f"the mesh's dimensions disagree: {t} data-parallel groups of {k} ranks but "
                f"{len(other_sets)} other groups of {len(other_sets[0][0].ranks)}: {_found([*dp, *other])}"
            )
        for d, aliases in enumerate(other_sets):
            for r in aliases[0].ranks:
                coord[r] = (d, coord[r][1])
            replica_groups[d] = tuple(g.name for g in aliases)
    row = all(r == d * t + j for r, (d, j) in coord.items())
    col = all(r == j * k + d for r, (d, j) in coord.items())
    if len(set(coord.values())) != len(coord) or not (row or col):
        raise ExtrapolationError(
            "the mesh's ranks are numbered neither row- nor column-major (rank = d*t + j or j*k + d): "
            f"{_found([*dp, *(other or [])])}"
        )
    parallelism = _parallelism([*dp, *whole])
    if sum((g.types for g in whole), Counter())[CommType.REDUCE_SCATTER]:
        raise ExtrapolationError(f"a reduce_scatter over every rank of a 2-D mesh: {_found(whole)}")
    inner_words = set().union(*(_tokens(g.desc) for g in other or [])) & OTHER_WORDS
    hsdp = _shards(other or [])
    inner = sorted(inner_words)[0] if inner_words else "fsdp" if hsdp else "replicated"
    text = ", ".join(_group_text(g) for g in dp)
    rest = f"; replicated {', '.join(_group_text(g) for g in other)}" if other else ""
    return Layout(
        parallelism=parallelism,
        inner=inner,
        dp_size=k,
        tp_size=t,
        row_major=row,
        dp_groups=tuple(tuple(g.name for g in aliases) for aliases in dp_sets),
        replica_groups=tuple(replica_groups),
        world_groups=tuple(g.name for g in whole),
        coord=coord,
        described=f"{inner} x {parallelism}, {k} x {t} mesh: {parallelism} over {text}{rest}",
    )


def _sources(lay: Layout, dp: int, source: int | None, seed: int | None, *, world: int) -> list[int]:
    """Captured replica copied by each new replica (``world``: the captured world size, traced or not)."""
    have = sorted({d for d, _j in lay.coord.values()})
    if source is not None:
        if source not in lay.coord:
            traced = f"; traced {rank_ranges(lay.coord)}" if len(lay.coord) < world else ""
            why = (
                f"captured rank {source} has no trace to copy (traced ranks {rank_ranges(lay.coord)})"
                if 0 <= source < world
                else f"no such rank in the run (ranks {rank_ranges(range(world))}{traced})"
            )
            raise ConfigError(f"scale.source={source}: {why}")
        return [lay.coord[source][0]] * dp
    if seed is None:
        return [have[i % len(have)] for i in range(dp)]
    rng = random.Random(seed)
    return [rng.choice(have) for _ in range(dp)]


def scale_run(
    run: RunTrace,
    dp: int,
    *,
    source: int | None = None,
    seed: int | None = None,
    memory_bytes: int | None = None,
) -> RunTrace:
    """``run`` as if it had ``dp`` data-parallel ranks (replicas), each a copy of a captured one (see the
    module docstring). ``source``: every replica copies the replica of that rank; else ``seed`` None:
    replica ``i`` copies captured replica ``i mod k``, an int: a seeded uniform choice per replica.
    ``memory_bytes``: the memory the replay may take; a run whose simulation would need more (about
    :data:`NODE_BYTES` a node and :data:`RANK_BYTES` a rank) is refused before anything is built."""
    if dp < 1:
        raise ConfigError(f"scale.dp: must be >= 1 (0 turns extrapolation off), got {dp}")
    try:
        lay = identify(run)
    except ExtrapolationError as e:  # the key the user gave, as every other refusal of scale.* names it
        raise ExtrapolationError(f"scale.dp={dp}: {e}") from None
    if memory_bytes is not None:
        _check_memory(run, lay, dp, source=source, seed=seed, memory_bytes=memory_bytes)
    src_rep = _sources(lay, dp, source, seed, world=run.world_size)
    t = lay.tp_size
    at = {c: r for r, c in lay.coord.items()}
    new_world = dp * t
    source_of = {lay.rank_of(d2, j, dp): at[(src_rep[d2], j)] for d2 in range(dp) for j in range(t)}

    pg_names = list(run.pg_names)
    groups: dict[str, ProcessGroupInfo] = {}
    everyone = tuple(range(new_world))
    for name in lay.world_groups:
        groups[name] = dataclasses.replace(run.process_groups[name], ranks=everyone)
    for j, names in enumerate(lay.dp_groups):
        members = tuple(lay.rank_of(d2, j, dp) for d2 in range(dp))
        for name in names:
            groups[name] = dataclasses.replace(run.process_groups[name], ranks=members)
    for name, info in run.process_groups.items():  # unused groups spanning the world resize with it
        if name not in groups and len(info.ranks) == run.world_size and name in pg_names:
            groups[name] = dataclasses.replace(info, ranks=everyone)
    # replicated groups: new replica d2 copies captured replica src_rep[d2]
    copy_name: dict[tuple[str, int], str] = {}
    for d2, d in enumerate(src_rep):
        for name in lay.replica_groups[d]:
            new = name if d2 == d else f"{name}@dp{d2}"
            copy_name[(name, d2)] = new
            info = run.process_groups[name]
            members = tuple(lay.rank_of(d2, lay.coord[r][1], dp) for r in info.ranks)
            groups[new] = dataclasses.replace(info, name=new, ranks=members)
            if new not in pg_names:
                pg_names.append(new)

    kept = _kept_list_gathers(run, lay)
    new_bytes = _scaled_bytes(run, lay, dp, kept)
    index = {n: i for i, n in enumerate(pg_names)}
    replicated = np.array(sorted(index[n] for names in lay.replica_groups for n in names), dtype=np.int32)
    rooted = _rooted_rows(run, replicated)
    roots: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    ranks: dict[int, RankTrace] = {}
    for nr in range(new_world):
        s = source_of[nr]
        rt = run.ranks[s]
        d2 = _replica_of(lay, nr, dp)
        pg = rt.pg  # shared, unless this replica's replicated groups are copies under new names
        if lay.replica_groups[src_rep[d2]] and src_rep[d2] != d2:
            lut = np.arange(len(run.pg_names), dtype=np.int32)
            for name in lay.replica_groups[src_rep[d2]]:
                lut[index[name]] = index[copy_name[(name, d2)]]
            pg = np.where(rt.pg >= 0, lut[np.maximum(rt.pg, 0)], rt.pg).astype(np.int32)
        src, dst = _roots(run, lay, dp, copy=(s, d2), rooted=rooted, cache=roots)
        ranks[nr] = dataclasses.replace(
            rt,
            rank=nr,
            pg=pg,
            comm_bytes=new_bytes[s],
            src=src,
            dst=dst,
            notes=[*rt.notes, f"copy of captured rank {s}"],
        )
        ranks[nr].seal()  # as a loaded run's: its execution model is cached (RankTrace.seal)

    collectives = _rematch(
        run, lay, dp=dp, src_rep=src_rep, source_of=source_of, copy_name=copy_name, new_bytes=new_bytes
    )
    collectives.sort(key=lambda c: (index[c.pg_name], c.seq))
    m = run.manifest
    described = (
        f"{lay.described} -> {counted(dp, 'data-parallel rank')} ({new_world:,} in all); "
        + _source_text(lay, source, seed, src_rep)
    )
    left_out = sorted(set(run.ranks) - set(source_of.values()))
    if left_out:  # fewer replicas than captured, or a source or draw that skips some
        described += f"; captured rank(s) {rank_ranges(left_out)} copied by none: not in the replay"
    described += _untraced_text(run) + _gather_caveat(run, lay, dp, kept) + _owner_caveat(run, lay, dp)
    manifest = dataclasses.replace(
        m,
        world_size=new_world,
        ranks=everyone,
        missing_ranks=(),
        process_groups=tuple(groups[n] for n in pg_names if n in groups),
        devices=_remap(m.devices, source_of),
        gpus=_remap(m.gpus, source_of),
        hosts=_remap(m.hosts, source_of),
        clock_offsets_ns=_remap(m.clock_offsets_ns, source_of),
        steps=_steps(m.steps, source_of),
        notes={**m.notes, SCALE_NOTE: described},
        lost_collectives=(),
    )
    return RunTrace(
        run_dir=run.run_dir,
        manifest=manifest,
        ranks=ranks,
        pg_names=pg_names,
        process_groups=groups,
        collectives=collectives,
        p2p=[],
        incomplete_steps=run.incomplete_steps,
        steps_differ=run.steps_differ,
        source_ranks={nr: run.source_rank(s) for nr, s in source_of.items()},
    )


def _check_memory(
    run: RunTrace, lay: Layout, dp: int, *, source: int | None, seed: int | None, memory_bytes: int
) -> None:
    """Refuse (a :class:`ConfigError` naming ``scale.dp``) an extrapolation whose simulation would take more
    than ``memory_bytes``: ``scale.dp=1000000`` ran for hours towards hundreds of GiB without a word. The
    nodes are counted from the captured replicas, as :func:`_sources` will copy them (a seeded draw: their
    mean), without building anything of size ``dp``."""
    nodes_of = Counter[int]()
    for r, (d, _j) in lay.coord.items():
        nodes_of[d] += len(run.ranks[r])
    have = sorted(nodes_of)
    if source is not None and source in lay.coord:
        nodes = dp * nodes_of[lay.coord[source][0]]
    elif seed is None:
        whole, part = divmod(dp, len(have))
        nodes = whole * sum(nodes_of.values()) + sum(nodes_of[d] for d in have[:part])
    else:
        nodes = dp * sum(nodes_of.values()) // len(have)
    ranks = dp * lay.tp_size
    need = nodes * NODE_BYTES + ranks * RANK_BYTES
    if need <= memory_bytes:
        return
    per_replica = need / dp
    fits = int(memory_bytes // per_replica)
    gib = 1 << 30
    advice = f"choose scale.dp={fits:,} or fewer" if fits >= 1 else "not even one replica fits"
    raise ConfigError(
        f"scale.dp={dp}: the replayed run would have {ranks:,} ranks and {nodes:,} nodes, about "
        f"{need / gib:,.1f} GiB to simulate ({NODE_BYTES} B a node, {RANK_BYTES:,} B a rank), and "
        f"{memory_bytes / gib:,.1f} GiB of memory is available; {advice}"
    )


def _replica_of(lay: Layout, rank: int, dp: int) -> int:
    return rank // lay.tp_size if lay.row_major else rank % dp


def _source_text(lay: Layout, source: int | None, seed: int | None, src_rep: Sequence[int]) -> str:
    unit = "rank" if lay.tp_size == 1 else "replica"
    if source is not None:
        return f"every {unit} copies captured rank {source}" + ("'s replica" if lay.tp_size > 1 else "")
    have = sorted({d for d, _ in lay.coord.values()})
    if seed is None and len(have) == lay.dp_size:
        return f"{unit} i copies captured {unit} i mod {len(have)}"
    if len(have) == 1:
        return f"every {unit} copies {unit} {have[0]}, the only traced one"
    if seed is None:
        return f"{unit} i copies traced {unit} number i mod {len(have)} of {rank_ranges(have)}"
    counts = Counter(src_rep)  # how many copies each got: how many stragglers a captured one makes
    of = {d: rank_ranges([r for r, (d2, _j) in lay.coord.items() if d2 == d]) for d in counts}
    got = ", ".join(
        f"{unit} {d}{f' (ranks {of[d]})' if lay.tp_size > 1 else ''} x{counts[d]}" for d in sorted(counts)
    )
    return f"each {unit} copies a captured {unit} drawn with seed {seed}: {got}"


def _list_gather_rows(rt: RankTrace) -> np.ndarray:
    """Rows of ``rt`` whose op is an all_gather into a list (:data:`LIST_GATHER_OPS`)."""
    ops = [i for i, n in enumerate(rt.names) if n in LIST_GATHER_OPS]
    return np.isin(rt.name_idx, ops) if ops else np.zeros(len(rt.node_type), dtype=bool)


def _kept_list_gathers(run: RunTrace, lay: Layout) -> dict[int, np.ndarray]:
    """Per rank, its gathers into a list (:data:`LIST_GATHER_OPS`) that keep their bytes: all of them but
    FSDP1's parameter gathers. ``FullyShardedDataParallel`` on the CPU gathers its flat parameter into a list
    of the parameter's chunks (``dist.all_gather``), and reduce-scatters the gradient, of the same padded
    size, from one tensor: under FSDP a gather into a list on a data-parallel group whose gathered size
    (bytes x ``k``) is the input of a reduce_scatter on that group, on that rank, is a parameter gather."""
    out: dict[int, np.ndarray] = {}
    sharded = _dp_group_ids(run, lay)
    for r, rt in run.ranks.items():
        kept = _list_gather_rows(rt)  # a new array: cleared in place
        if lay.parallelism == FSDP2 and kept.any():
            rs = (rt.node_type == int(NodeType.COMM_COLL)) & (rt.comm_type == int(CommType.REDUCE_SCATTER))
            gathered = rt.comm_bytes * lay.dp_size
            for g in sharded:
                on_g = rt.pg == g
                grads = rt.comm_bytes[rs & on_g]
                kept[kept & on_g & np.isin(gathered, grads)] = False
        out[r] = kept
    return out


def _dp_group_ids(run: RunTrace, lay: Layout) -> list[int]:
    """The ``pg`` indices of the data-parallel groups."""
    return [run.pg_names.index(n) for names in lay.dp_groups for n in names]


def _gather_caveat(run: RunTrace, lay: Layout, dp: int, listed: Mapping[int, np.ndarray]) -> str:
    """Where a run without reduce_scatters (read as DDP) all_gathers on its data-parallel groups: they keep
    their bytes per rank, right for metrics or objects, wrong for the optimizer's shards of ZeRO-1/2 (a
    2 -> 1,024 extrapolation of a 32 MiB shard gather priced at 152.7 ms, where shards of 1/1,024 cost 0.94
    ms), which the trace cannot tell apart (but for gathers into a list, :data:`LIST_GATHER_OPS`, which ZeRO
    does not issue): say so, with how much is at stake. Under FSDP2, the gathers into a list that keep their
    bytes, while the parameter gathers shrink (``listed``: :func:`_kept_list_gathers`). Nothing at ``dp``
    = ``k``, as :func:`_owner_caveat`: every gather keeps its bytes there, rightly (the line said "would
    shrink to ~2/2 of them")."""
    if dp == lay.dp_size:
        return ""
    dp_names = {n for names in lay.dp_groups for n in names}
    gathers = [c for c in run.collectives if c.comm_type == CommType.ALL_GATHER and c.pg_name in dp_names]
    fsdp2 = lay.parallelism != DDP
    # FSDP2: its parameter gathers shrink, as they should; say which kept their bytes (gathers into a list).
    # DDP: a gather into a list is of whole tensors (ZeRO gathers its shards into one tensor): no doubt there
    gathers = [c for c in gathers if bool(listed[c.ranks[0]][c.rows[0]]) == fsdp2]
    if not gathers:
        return ""
    what = "into a list " if fsdp2 else ""
    largest = max(max(c.comm_bytes) for c in gathers)
    inside = ": metrics or objects, not FSDP2's parameter gathers" if fsdp2 else ""
    tail = (
        ""
        if fsdp2
        else f", as gathers of whole tensors do; gathers of ZeRO-style optimizer shards would shrink to "
        f"~{lay.dp_size:,}/{dp:,} of them, so the replay overstates those"
    )
    return (
        f"; {len(gathers):,} all_gather(s) {what}on the data-parallel group (up to {largest:,} bytes a "
        f"rank{inside}) keep their bytes at {dp:,} ranks{tail}"
    )


def _owner_caveat(run: RunTrace, lay: Layout, dp: int) -> str:
    """Where a data-parallel group broadcasts from more than one root, as ``ZeroRedundancyOptimizer``
    broadcasts each parameter from the rank that owns it: the copies keep the captured roots, where at
    ``dp`` ranks (but ``k``) an optimizer sharded by owner spreads the owners over ``dp`` (a 2-rank ZeRO
    capture at 4: 5 of its 6 tensors from rank 1 and 1 from rank 0, the real 4-rank run from ranks 3, 3,
    3, 2, 1, 0), which the trace cannot tell from broadcasts whose roots stay: say how many."""
    if dp == lay.dp_size:
        return ""
    dp_names = {n for names in lay.dp_groups for n in names}
    roots: dict[str, set[int]] = {}
    count: Counter[str] = Counter()
    for c in run.collectives:
        if c.comm_type == CommType.BROADCAST and c.pg_name in dp_names:
            count[c.pg_name] += 1
            root = int(run.ranks[c.ranks[0]].src[c.rows[0]])
            roots.setdefault(c.pg_name, set()).update([root] if root >= 0 else [])
    many = [g for g, rs in roots.items() if len(rs) > 1]
    if not many:
        return ""
    n = sum(count[g] for g in many)
    k = sum(len(roots[g]) for g in many)
    return (
        f"; {n:,} broadcast(s) on the data-parallel group from {k:,} roots keep their captured roots at "
        f"{dp:,} ranks, where an optimizer sharded by owner (ZeRO) would broadcast from others"
    )


def _untraced_text(run: RunTrace) -> str:
    """The captured ranks without a trace (a sample of a run, or ranks a lenient load left out, with why):
    no new rank copies them, and a straggler among them would otherwise vanish without a word."""
    untraced = [r for r in range(run.world_size) if r not in run.ranks]
    if not untraced:
        return ""
    said = by_reason(run.left_out_ranks)
    why = "; ".join(f"{ranks_label(rs)} left out by the lenient load: {w}" for rs, w in said[:3])
    more = sum(len(rs) for rs, _w in said[3:])
    why += f"; {more} more rank(s) for other reasons" if more > 0 else ""
    return f"; captured rank(s) {rank_ranges(untraced)} have no trace, so no rank copies them" + (
        f" ({why})" if why else ""
    )


def _remap(d: Mapping[int, _V], source_of: Mapping[int, int]) -> dict[int, _V]:
    return {nr: d[s] for nr, s in source_of.items() if s in d}


def _steps(steps: Sequence[StepSpan], source_of: Mapping[int, int]) -> tuple[StepSpan, ...]:
    by_rank: dict[int, list[StepSpan]] = {}
    for sp in steps:
        by_rank.setdefault(sp.rank, []).append(sp)
    return tuple(dataclasses.replace(sp, rank=nr) for nr, s in source_of.items() for sp in by_rank.get(s, ()))


def _scaled_bytes(
    run: RunTrace, lay: Layout, dp: int, kept: Mapping[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Per captured rank, its ``comm_bytes`` at ``dp`` data-parallel ranks (the same array where none
    changes): FSDP2's all_gather input is its shard at ``dp`` (:func:`_shard_bytes`), everything else
    keeps its bytes, a gather into a list (:data:`LIST_GATHER_OPS`: metrics, objects) too, but FSDP1's
    (``kept``: :func:`_kept_list_gathers`)."""
    out: dict[int, np.ndarray] = {}
    sharded = _dp_group_ids(run, lay)
    for r, rt in run.ranks.items():
        if lay.parallelism != FSDP2:
            out[r] = rt.comm_bytes
            continue
        rows = (
            (rt.node_type == int(NodeType.COMM_COLL))
            & (rt.comm_type == int(CommType.ALL_GATHER))
            & np.isin(rt.pg, sharded)
            & ~kept[r]
        )
        if not rows.any():
            out[r] = rt.comm_bytes
            continue
        b = rt.comm_bytes.copy()
        b[rows] = _shard_bytes(b[rows], _element_bytes(rt)[rows], lay.dp_size, dp)
        out[r] = b
    return out


def _element_bytes(rt: RankTrace) -> np.ndarray:
    """Per row of ``rt``, the element size of its recorded dtype (``skl_dtype``), 1 where it records none
    or one :func:`~skewlens.profiler.vocab.dtype_bytes` does not know."""
    if rt.dtype_idx is None:
        return np.ones(len(rt), dtype=np.int64)
    sizes = np.array([dtype_bytes(d) or 1 for d in rt.dtypes] + [1], dtype=np.int64)
    return sizes[rt.dtype_idx]  # -1 (no dtype) picks the 1 appended


def _shard_bytes(nbytes: np.ndarray, element: np.ndarray, k: int, dp: int) -> np.ndarray:
    """A shard's bytes at ``dp`` ranks, of what ``k`` ranks held ``nbytes`` each (the gathered size stays):
    ``bytes * k / dp`` rounded up to whole elements of ``element`` bytes (1: to the byte), as FSDP2 pads
    its shards; its padding of the dim-0 rows is not modelled (the trace has no shapes). In integers."""
    return -((-nbytes * k) // (dp * element)) * element


def _rooted_rows(run: RunTrace, replicated: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per captured rank with rooted collectives (a ``src`` or ``dst``): their rows, and which of them are
    on a replicated group."""
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for r, rt in run.ranks.items():
        rows = np.flatnonzero((rt.node_type == int(NodeType.COMM_COLL)) & ((rt.src >= 0) | (rt.dst >= 0)))
        if rows.size:
            out[r] = (rows, np.isin(rt.pg[rows], replicated))
    return out


def _roots(
    run: RunTrace,
    lay: Layout,
    dp: int,
    *,
    copy: tuple[int, int],
    rooted: Mapping[int, tuple[np.ndarray, np.ndarray]],
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """``src`` and ``dst`` of ``copy``, the copy of captured rank ``s`` in new replica ``d2``: a rooted
    collective's root (``rooted``: :func:`_rooted_rows`) renumbered to the same member of the new group
    (see the module docstring), the source's own arrays where no number changes. ``cache``: per
    ``(s, d2)``, ``d2`` -1 where no root is on a replicated group (the same arrays for every replica)."""
    s, d2 = copy
    rt = run.ranks[s]
    if s not in rooted:
        return rt.src, rt.dst
    rows, on_replica = rooted[s]
    key = (s, d2 if on_replica.any() else -1)
    got = cache.get(key)
    if got is not None:
        return got

    def renumber(col: np.ndarray) -> np.ndarray:
        out = col.copy()
        for row, replica in zip(rows.tolist(), on_replica.tolist(), strict=True):
            r0 = int(col[row])
            if r0 < 0:
                continue
            d, j = lay.coord.get(r0, (r0, 0) if lay.tp_size == 1 else (-1, -1))
            d = d2 if replica else d
            out[row] = lay.rank_of(d, j, dp) if 0 <= d < dp and j >= 0 else -1
        return col if np.array_equal(out, col) else out

    got = cache[key] = (renumber(rt.src), renumber(rt.dst))
    return got


def _rematch(
    run: RunTrace,
    lay: Layout,
    *,
    dp: int,
    src_rep: Sequence[int],
    source_of: Mapping[int, int],
    copy_name: Mapping[tuple[str, int], str],
    new_bytes: Mapping[int, np.ndarray],
) -> list[CollectiveInstance]:
    """The collective instances of the scaled run: per (group, seq), its new members and their rows."""
    dp_j = {n: j for j, names in enumerate(lay.dp_groups) for n in names}
    world = set(lay.world_groups)
    everyone = tuple(range(dp * lay.tp_size))
    members_of = [tuple(lay.rank_of(d2, j, dp) for d2 in range(dp)) for j in range(lay.tp_size)]
    # python ints per (rank, row) are shared between copies: a tuple of N references, not N new ints
    byte_ints: dict[int, list[int]] = {}

    def nbytes(rank: int, row: int) -> int:
        got = byte_ints.get(rank)
        if got is None:
            got = byte_ints[rank] = new_bytes[rank].tolist()
        return got[row]

    out: list[CollectiveInstance] = []
    for c in run.collectives:
        row_of = dict(zip(c.ranks, c.rows, strict=True))
        if c.pg_name in dp_j or c.pg_name in world:
            ranks = everyone if c.pg_name in world else members_of[dp_j[c.pg_name]]
            try:
                rows = tuple(row_of[source_of[nr]] for nr in ranks)
            except KeyError as e:
                raise ExtrapolationError(
                    f"{run.run_dir}: collective group '{c.pg_name}' seq {c.seq} has no member on rank {e}, "
                    "which a new rank copies"
                ) from None
            out.append(
                dataclasses.replace(
                    c,
                    ranks=ranks,
                    rows=rows,
                    comm_bytes=tuple(nbytes(source_of[nr], w) for nr, w in zip(ranks, rows, strict=True)),
                )
            )
            continue
        d = lay.coord[c.ranks[0]][0]
        for d2 in (i for i, s in enumerate(src_rep) if s == d):
            ranks = tuple(lay.rank_of(d2, lay.coord[r][1], dp) for r in c.ranks)
            out.append(dataclasses.replace(c, pg_name=copy_name[(c.pg_name, d2)], ranks=ranks))
    return out
