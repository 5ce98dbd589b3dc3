"""``scale.dp=N``: a run replayed as if it had N data-parallel ranks (skewlens.replay.scale).

Synthetic DDP-, FSDP2- and 2-D-mesh-shaped runs (fast tier) are scaled and replayed with the ``switch``
topology of ``conf/topology/`` under ``comm_mode=model``: rank and group counts, the per-rank sizes each
parallelism implies, and step times against the network model's closed forms written out here. Real
captures of ``examples/ddp_accum.py``, ``examples/fsdp2.py`` and ``examples/fsdp1.py`` (slow tier) are
checked the same way, and a 4-rank capture scaled to 1,024 ranks with one slowed rank finds that rank.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from rich.console import Console

from skewlens.cli import main as skewlens_main
from skewlens.cli.replay import CONF_DIR, register_configs, to_config
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.store.schema import read_table
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.config import ReplayConfig
from skewlens.replay.driver import build_effects, replay_run
from skewlens.replay.errors import ConfigError, ExtrapolationError
from skewlens.replay.outputs import ReplayedNodeRecord
from skewlens.replay.render import summary_table
from skewlens.replay.scale import NODE_BYTES, RANK_BYTES, identify, scale_run
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.summary import SummaryRecord, summarize

AR, AG, RS = CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER
MIB = 1 << 20
# per captured rank: (forward, backward, optimizer) compute, ns; the spread the copies must keep
COMPUTE = ((3_000_000, 5_000_000, 700_000), (3_400_000, 4_100_000, 900_000))
BUCKETS = (1 * MIB, 3 * MIB)  # DDP gradient buckets
FULL = 4 * MIB  # FSDP2: the parameters one all_gather gathers (and one reduce_scatter reduces)


def compose_replay(*overrides: str) -> ReplayConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="replay", overrides=["trace=/nowhere", "out=/nowhere", *overrides])
    return to_config(cfg)


MODEL = ("comm_mode=model", "topology=switch")
SWITCH = compose_replay(*MODEL).topology
ALPHA = float(SWITCH.dims[0].latency_ns)  # ns
BW = float(SWITCH.dims[0].bandwidth_gbps)  # bytes/ns


def ring_ns(comm_type: CommType, comm_bytes: int, p: int) -> int:
    """The ring algorithm's time (the switch entry's algorithm), S the message size: a member's
    comm_size, but for all_gather the p pieces gathered (comm_size is a member's input)."""
    if comm_type == AR:
        return round(2 * (p - 1) * (ALPHA + comm_bytes / (p * BW)))
    if comm_type == CommType.BROADCAST:  # a pipelined chain
        return round((p - 1) * ALPHA + comm_bytes / BW)
    size = p * comm_bytes if comm_type == AG else comm_bytes
    return round((p - 1) * (ALPHA + size / (p * BW)))


Schedule = Sequence[tuple[str, CommType, int]]  # (group, type, comm_bytes) before each compute phase


def build(
    path: Path,
    *,
    world: int,
    schedule: Schedule,
    groups: dict[str, tuple[int, ...]] | None = None,
    group_of: dict[tuple[int, str], str] | None = None,
    steps: int = 2,
    roots: dict[str, int] | None = None,
) -> RunTrace:
    """A run whose ranks alternate a collective and a compute phase (COMPUTE of rank r mod 2), recorded as
    a real one would be: a collective's members end together, the transfer after the last arrival.
    ``roots``: a rooted collective's captured root rank, per group."""
    b = RunBuilder(world_size=world, groups=groups)
    now = dict.fromkeys(range(world), 0)
    for s in range(steps):
        for r in range(world):
            b.rank(r).step(s)
        for i, (kind, ctype, nbytes) in enumerate(schedule):
            by_group: dict[str, list[int]] = {}
            for r in range(world):
                by_group.setdefault(group_of[(r, kind)] if group_of else kind, []).append(r)
            for name, members in by_group.items():
                last = max(now[r] for r in members)
                for r in members:
                    end = last + 300_000 + nbytes // 1000
                    root = (roots or {}).get(name)
                    b.rank(r).collective(ctype, nbytes, end - now[r], pg=name, start_ns=now[r], root=root)
                    now[r] = end
            for r in range(world):
                dur = COMPUTE[r % 2][i % 3]
                b.rank(r).compute(f"phase{i}", dur, start_ns=now[r])
                now[r] += dur
    return load_run(b.write(path))


DDP = (("0", AR, BUCKETS[0]), ("0", AR, BUCKETS[1]))
FSDP2 = (("0", AG, FULL // 2), ("0", AG, FULL // 2), ("0", RS, FULL))


def replay(run: RunTrace, *overrides: str) -> SimResult:
    cfg = compose_replay(*MODEL, *overrides)
    return simulate(run, topology=cfg.topology.to_topology(), comm_mode="model", effects=build_effects(cfg))


def first_step_ns(schedule: Schedule, n: int) -> int:
    """Step 0 of a scaled 1-D run: the ranks start together; each collective ends its ring time after the
    slowest rank arrives, then every rank computes (the copies keep both captured ranks' durations)."""
    total = 0
    for i, (_g, ctype, nbytes) in enumerate(schedule):
        total += ring_ns(ctype, nbytes, n) + max(c[i % 3] for c in COMPUTE)
    return total


def transfers(sim: SimResult) -> list[int]:
    return [int(e - a) for a, e in zip(sim.coll_arrival_ns, sim.coll_end_ns, strict=True)]


@pytest.mark.parametrize("n", [1, 3, 8, 64])
def test_ddp_scaled_to_n_ranks_has_n_ranks_one_group_of_n_and_keeps_its_bucket_bytes(
    tmp_path: Path, n: int
) -> None:
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    scaled = scale_run(run, n)
    assert sorted(scaled.ranks) == list(range(n)) and scaled.world_size == n
    assert scaled.process_groups["0"].ranks == tuple(range(n))
    assert len(scaled.collectives) == len(run.collectives)
    for c in scaled.collectives:
        assert c.ranks == tuple(range(n))
        assert set(c.comm_bytes) == {BUCKETS[c.seq % 2]}
    assert identify(run).parallelism == "ddp"


def test_all_gathers_on_a_ddp_runs_group_keep_their_bytes_and_the_note_says_zero_shards_would_not(
    tmp_path: Path,
) -> None:
    # ZeRO-1: gradients all_reduced, the optimizer's updated shards all_gathered; no reduce_scatter, so the
    # run reads as DDP and the gathers keep their bytes: the note says what that assumes
    zero1 = (("0", AR, BUCKETS[0]), ("0", AG, 2 * MIB))
    scaled = scale_run(build(tmp_path / "zero1", world=2, schedule=zero1), 64)
    assert {c.comm_bytes[0] for c in scaled.collectives if c.comm_type == AG} == {2 * MIB}
    note = scaled.manifest.notes["scale"]
    assert f"2 all_gather(s) on the data-parallel group (up to {2 * MIB:,} bytes a rank)" in note
    assert "~2/64 of them" in note
    plain = scale_run(build(tmp_path / "ddp", world=2, schedule=DDP), 64)
    assert "all_gather" not in plain.manifest.notes["scale"]


def test_the_possible_zero_shard_gathers_are_said_at_any_n_but_k_with_n_written_as_the_broadcasts_are(
    tmp_path: Path,
) -> None:
    # at N = k the line said the gathers "would shrink to ~2/2 of them" (nothing changes there, as the
    # broadcast roots' clause already knew), and at 1,024 it wrote "at 1024 ranks" beside that clause's
    # "1,024"
    zero1 = build(tmp_path / "zero1", world=2, schedule=(("0", AR, BUCKETS[0]), ("0", AG, 2 * MIB)))
    assert "all_gather(s)" not in scale_run(zero1, 2).manifest.notes["scale"]
    note = scale_run(zero1, 1024).manifest.notes["scale"]
    assert note.endswith(
        f"; 2 all_gather(s) on the data-parallel group (up to {2 * MIB:,} bytes a rank) keep their bytes "
        "at 1,024 ranks, as gathers of whole tensors do; gathers of ZeRO-style optimizer shards would "
        "shrink to ~2/1,024 of them, so the replay overstates those"
    )


def test_the_zero_shard_gathers_line_writes_a_count_of_a_thousand_gathers_with_a_separator() -> None:
    from types import SimpleNamespace

    from skewlens.replay.scale import DDP, _gather_caveat

    # 1,000 all_gathers of 1 KiB on the data-parallel group "dp" of a DDP run, none into a list, at 4,096
    # ranks: every figure of the line with its separator, as N is
    gathers = [
        SimpleNamespace(
            comm_type=CommType.ALL_GATHER, pg_name="dp", ranks=(0, 1), rows=(k,), comm_bytes=(1024,)
        )
        for k in range(1000)
    ]
    lay = SimpleNamespace(dp_size=2, dp_groups=[("dp",)], parallelism=DDP)
    listed = {0: np.zeros(1000, dtype=np.bool_)}
    assert _gather_caveat(SimpleNamespace(collectives=gathers), lay, 4096, listed) == (  # type: ignore[arg-type]
        "; 1,000 all_gather(s) on the data-parallel group (up to 1,024 bytes a rank) keep their bytes at "
        "4,096 ranks, as gathers of whole tensors do; gathers of ZeRO-style optimizer shards would shrink to "
        "~2/4,096 of them, so the replay overstates those"
    )


def test_a_copy_shares_its_source_ranks_arrays_and_rank_i_copies_rank_i_mod_k(tmp_path: Path) -> None:
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    scaled = scale_run(run, 1024)
    for r in (0, 1, 513, 1022):
        rt, src = scaled.ranks[r], run.ranks[r % 2]
        assert rt.rank == r
        for col in ("dur_ns", "start_ns", "dep_idx", "node_id", "comm_bytes", "pg"):
            assert getattr(rt, col) is getattr(src, col), col
    assert [s.rank for s in scaled.manifest.steps].count(1023) == 2


def test_the_extrapolation_note_writes_a_new_world_of_1024_with_a_thousands_separator(tmp_path: Path) -> None:
    # it read "-> 1,024 data-parallel ranks (1024 in all)"
    note = scale_run(build(tmp_path / "ddp", world=2, schedule=DDP), 1024).manifest.notes["scale"]
    assert "-> 1,024 data-parallel ranks (1,024 in all); " in note


def test_ddp_step_time_at_n_ranks_is_the_slowest_compute_plus_the_ring_all_reduces(tmp_path: Path) -> None:
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    for n in (2, 16):
        sim = replay(scale_run(run, n))
        assert sim.step_time_ns(0) == first_step_ns(DDP, n)
        assert transfers(sim) == [ring_ns(AR, BUCKETS[i % 2], n) for i in range(len(run.collectives))]


def test_fsdp2_shards_shrink_as_one_over_n_while_reduce_scatter_keeps_the_full_gradient(
    tmp_path: Path,
) -> None:
    run = build(tmp_path / "fsdp2", world=2, schedule=FSDP2)
    assert identify(run).parallelism == "fsdp2"
    for n in (4, 8):
        scaled = scale_run(run, n)
        assert scaled.process_groups["0"].ranks == tuple(range(n))
        per_type = {(c.comm_type, b) for c in scaled.collectives for b in c.comm_bytes}
        assert per_type == {(AG, FULL // n), (RS, FULL)}
        assert all(len(c.ranks) == n for c in scaled.collectives)
        rt = scaled.ranks[n - 1]
        ag = rt.comm_type == int(AG)
        assert set(rt.comm_bytes[ag].tolist()) == {FULL // n}
        assert rt.comm_bytes is scaled.ranks[1].comm_bytes  # one new column per source rank


def test_fsdp2_step_time_follows_the_ring_all_gather_and_reduce_scatter_at_n(tmp_path: Path) -> None:
    run = build(tmp_path / "fsdp2", world=2, schedule=FSDP2)
    n = 8
    sim = replay(scale_run(run, n))
    assert sim.step_time_ns(0) == first_step_ns(((g, t, FULL // n if t == AG else b) for g, t, b in FSDP2), n)
    # the gathered size stays: an all_gather of FULL / n per rank costs what gathering FULL costs
    assert transfers(sim)[0] == round((n - 1) * (ALPHA + FULL / (n * BW)))


@pytest.mark.parametrize(
    ("shard", "dtype", "n", "want"),
    [
        (2620, "float32", 3, 1748),  # 5,240 B gathered / 3 = 1,746.67 B: 437 float32 (it was 1,747 B)
        (176, "float32", 1024, 4),  # 352 B / 1,024 = 0.34 B: one float32 (it was 1 B)
        (FULL // 2, "float32", 3, 1_398_104),  # 4 MiB / 3 = 349,525.33 float32: 349,526 (it was 1,398,102 B)
        (1000, "bfloat16", 3, 668),  # 2,000 B / 3 = 333.33 bfloat16: 334 (it was 667 B)
        (1000, "", 3, 667),  # no dtype recorded (an empty skl_dtype): to the byte, as before
        (1000, "float8_e8m0fnu", 3, 667),  # a dtype of unknown size: to the byte
        (1000, "float32", 4, 500),  # a whole number of elements stays
    ],
)
def test_a_shard_that_does_not_divide_rounds_up_to_whole_elements_of_its_recorded_dtype(
    tmp_path: Path, shard: int, dtype: str, n: int, want: int
) -> None:
    # FSDP2 pads its shards to whole elements (and to whole dim-0 rows, which the trace cannot tell): a
    # 2-rank capture's shard at n ranks was ceil(bytes * 2 / n) to the byte, a fraction of an element
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).collective(AG, shard, 1_000_000, start_ns=0, name="c10d::_allgather_base_", dtype=dtype)
        b.rank(r).collective(RS, 2 * shard, 1_000_000, start_ns=1_000_000, dtype=dtype)
    scaled = scale_run(load_run(b.write(tmp_path / "fsdp2")), n)
    assert [(c.comm_type, set(c.comm_bytes)) for c in scaled.collectives] == [(AG, {want}), (RS, {2 * shard})]
    assert scaled.ranks[n - 1].comm_bytes.tolist()[-2:] == [want, 2 * shard]


def test_source_copies_one_rank_and_a_seed_draws_reproducibly(tmp_path: Path) -> None:
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    one = scale_run(run, 6, source=1)
    assert all(rt.dur_ns is run.ranks[1].dur_ns for rt in one.ranks.values())
    assert replay(one).step_time_ns(0) == sum(ring_ns(AR, b, 6) for b in BUCKETS) + sum(COMPUTE[1][:2])

    def drawn(seed: int) -> list[int]:
        s = scale_run(run, 32, seed=seed)
        return [0 if rt.dur_ns is run.ranks[0].dur_ns else 1 for _r, rt in sorted(s.ranks.items())]

    assert drawn(7) == drawn(7)
    assert drawn(7) != drawn(8)
    assert 0 < sum(drawn(7)) < 32
    # the note says how many copies each captured rank got (of a straggler: how many stragglers there are)
    ones = sum(drawn(7))
    note = scale_run(run, 32, seed=7).manifest.notes["scale"]
    assert note.endswith(f"copies a captured rank drawn with seed 7: rank 0 x{32 - ones}, rank 1 x{ones}")


MESH_GROUPS = {
    "0": (0, 1, 2, 3),
    "mesh_dp_0": (0, 2),
    "mesh_dp_1": (1, 3),
    "mesh_tp_0": (0, 1),
    "mesh_tp_1": (2, 3),
}
# rank r = d * 2 + j: its dp group is mesh_dp_<j>, its tp group mesh_tp_<d>
MESH_OF = {(r, k): f"mesh_{k}_{r % 2 if k == 'dp' else r // 2}" for r in range(4) for k in ("dp", "tp")}
MESH = (("dp", AG, FULL // 2), ("tp", AR, 64 << 10), ("dp", RS, FULL))


def test_a_2d_mesh_scales_its_dp_dimension_and_replicates_the_tp_groups(tmp_path: Path) -> None:
    run = build(tmp_path / "mesh", world=4, schedule=MESH, groups=MESH_GROUPS, group_of=MESH_OF)
    lay = identify(run)
    assert (lay.parallelism, lay.inner, lay.dp_size, lay.tp_size) == ("fsdp2", "tp", 2, 2)
    scaled = scale_run(run, 4)
    groups = {n: g.ranks for n, g in scaled.process_groups.items()}
    assert groups == {
        "0": tuple(range(8)),
        "mesh_dp_0": (0, 2, 4, 6),
        "mesh_dp_1": (1, 3, 5, 7),
        "mesh_tp_0": (0, 1),
        "mesh_tp_1": (2, 3),
        "mesh_tp_0@dp2": (4, 5),
        "mesh_tp_1@dp3": (6, 7),
    }
    assert scaled.ranks[5].dur_ns is run.ranks[1].dur_ns  # (d=2, j=1) copies (d=0, j=1)
    sizes = {(c.comm_type, len(c.ranks), b) for c in scaled.collectives for b in c.comm_bytes}
    assert sizes == {(AG, 4, FULL // 4), (AR, 2, 64 << 10), (RS, 4, FULL)}
    tp = [c for c in scaled.collectives if c.comm_type == AR]
    assert len(tp) == 2 * len([c for c in run.collectives if c.comm_type == AR])
    # step 0: the dp groups gather, the tp pairs (one rank of each coordinate j) wait for the slower
    # forward, then each dp group (one coordinate j) reduces after its own backward
    (fwd0, bwd0, opt0), (fwd1, bwd1, opt1) = COMPUTE
    expected = (
        ring_ns(AG, FULL // 4, 4)
        + max(fwd0, fwd1)
        + ring_ns(AR, 64 << 10, 2)
        + max(bwd0 + opt0, bwd1 + opt1)
        + ring_ns(RS, FULL, 4)
    )
    assert replay(scaled).step_time_ns(0) == expected


@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "mesh"])
def test_scaling_a_run_to_its_own_size_replays_every_node_at_the_times_the_run_itself_replays(
    tmp_path: Path, kind: str
) -> None:
    if kind == "mesh":
        run = build(tmp_path / kind, world=4, schedule=MESH, groups=MESH_GROUPS, group_of=MESH_OF)
    else:
        run = build(tmp_path / kind, world=2, schedule=DDP if kind == "ddp" else FSDP2)
    k = identify(run).dp_size
    slow = ("slowdown=straggler", "slowdown.rank=0")
    as_run, scaled = replay(run, *slow), replay(scale_run(run, k), *slow)
    assert sorted(scaled.start_ns) == sorted(as_run.start_ns) == list(range(run.world_size))
    for r in as_run.start_ns:
        assert scaled.start_ns[r].tolist() == as_run.start_ns[r].tolist()
        assert scaled.end_ns[r].tolist() == as_run.end_ns[r].tolist()
    assert transfers(scaled) == transfers(as_run) and as_run.step_time_ns(0) > 0


def test_the_cli_replays_a_scaled_run_and_a_slowed_rank_is_the_one_the_others_wait_for(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "ddp"
    build(run_dir, world=2, schedule=DDP)
    out = tmp_path / "out"
    cfg = compose_replay(
        *MODEL,
        "scale.dp=12",
        "slowdown=straggler",
        "slowdown.rank=9",
        "slowdown.factor=2.0",
        "perfetto=false",
    )
    cfg.trace, cfg.out, cfg.progress = str(run_dir), str(out), False
    outcome = replay_run(cfg, out)
    assert sorted(outcome.run.ranks) == list(range(12))
    assert "ddp over '0'" in outcome.run.manifest.notes["scale"]
    waits = dict.fromkeys(range(12), 0)
    for rec in outcome.summary:
        waits[rec.rank] += rec.wait_ns
    assert min(waits, key=lambda r: waits[r]) == 9
    assert waits[9] == 0 and all(w > 0 for r, w in waits.items() if r != 9)


def test_a_sweep_over_scale_dp_has_one_row_per_size_each_that_sizes_single_replay(tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    build(run_dir, world=2, schedule=DDP)
    common = [f"trace={run_dir}", *MODEL, "progress=false", "perfetto=false"]
    sizes = (2, 8, 64)
    dps = ",".join(map(str, sizes))
    assert skewlens_main(["replay", "-m", f"out={tmp_path / 'sweep'}", f"scale.dp={dps}", *common]) == 0
    rows = pq.read_table(tmp_path / "sweep" / "sweep.parquet").to_pylist()
    assert [r["job"] for r in rows] == [0, 1, 2]
    for row, n in zip(rows, sizes, strict=True):
        single = tmp_path / f"single-{n}"
        assert skewlens_main(["replay", f"out={single}", f"scale.dp={n}", *common]) == 0
        want = pq.read_table(single / "summary.parquet").to_pylist()
        assert pq.read_table(Path(row["out_dir"]) / "summary.parquet").to_pylist() == want
        assert len({r["rank"] for r in want}) == n
        step0 = max(r["step_time_ns"] for r in want if r["step"] == 0)
        assert step0 == first_step_ns(DDP, n)  # the ring all_reduces of n ranks
        assert max(r["step_time_ns"] for r in want) == row["max_step_ns"]


def test_every_output_of_a_seeded_extrapolation_names_the_captured_rank_each_rank_copies(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "ddp"
    run = build(run_dir, world=2, schedule=DDP)
    # the truth, independently: the captured rank whose duration arrays each new rank shares
    drawn = scale_run(run, 6, seed=5)
    truth = {r: 0 if rt.dur_ns is run.ranks[0].dur_ns else 1 for r, rt in drawn.ranks.items()}
    assert sorted(set(truth.values())) == [0, 1] and truth != {r: r % 2 for r in range(6)}
    out = tmp_path / "out"
    cfg = compose_replay(*MODEL, "scale.dp=6", "scale.seed=5")
    cfg.trace, cfg.out, cfg.progress = str(run_dir), str(out), False
    replay_run(cfg, out)
    summary = read_table(out / "summary.parquet", SummaryRecord).to_pylist()
    assert {(s["rank"], s["source_rank"]) for s in summary} == set(truth.items())
    timeline = read_table(out / "timeline.parquet", ReplayedNodeRecord, ["rank", "source_rank"])
    assert set(zip(*timeline.to_pydict().values(), strict=True)) == set(truth.items())
    names = [
        e["args"]["name"]
        for e in json.loads((out / "timeline.json").read_text())["traceEvents"]
        if e.get("name") == "process_name"
    ]
    assert names == [f"rank {r} (copy of captured rank {truth[r]})" for r in range(6)]
    text = io.StringIO()
    Console(file=text, width=80).print(summary_table(replay_run(cfg, out).summary))
    assert [ln.split()[1] for ln in text.getvalue().splitlines() if "←" in ln and "│" in ln] == [
        f"{r}←{truth[r]}" for r in range(6)
    ]
    # a run as captured: every rank is its own source, and the table says nothing of copies
    plain = compose_replay(*MODEL)
    plain.trace, plain.out, plain.progress = str(run_dir), str(tmp_path / "plain"), False
    replay_run(plain, tmp_path / "plain")
    rows = read_table(tmp_path / "plain" / "summary.parquet", SummaryRecord).to_pylist()
    assert {(s["rank"], s["source_rank"]) for s in rows} == {(0, 0), (1, 1)}


def test_a_sample_of_a_larger_run_scales_from_the_ranks_it_has_with_its_groups_size(tmp_path: Path) -> None:
    b = RunBuilder(world_size=8)  # ranks 2-7 have no trace
    for r in (0, 1):
        b.rank(r).collective(AG, 1024, 100_000)
        b.rank(r).collective(RS, 8192, 100_000)
    run = load_run(b.write(tmp_path / "run"))
    scaled = scale_run(run, 16)
    assert sorted(scaled.ranks) == list(range(16)) and scaled.manifest.missing_ranks == ()
    # the captured shard is 1/8 of the gathered size (the group has 8 ranks), so 1/16 of it is half
    assert {(c.comm_type, b) for c in scaled.collectives for b in c.comm_bytes} == {(AG, 512), (RS, 8192)}
    assert "traced rank number i mod 2 of 0-1" in scaled.manifest.notes["scale"]


def test_a_source_rank_of_the_run_without_a_trace_is_refused_as_untraced_not_as_no_such_rank(
    tmp_path: Path,
) -> None:
    b = RunBuilder(world_size=8)  # ranks 2-7 have no trace
    for r in (0, 1):
        b.rank(r).collective(AR, 1024, 100_000)
    run = load_run(b.write(tmp_path / "run"))
    # it said 'scale.source=5: no such rank in the run (ranks 0-1)' of a run of 8
    with pytest.raises(
        ConfigError, match=r"^scale\.source=5: captured rank 5 has no trace to copy \(traced ranks 0-1\)$"
    ):
        scale_run(run, 16, source=5)
    with pytest.raises(
        ConfigError, match=r"^scale\.source=8: no such rank in the run \(ranks 0-7; traced 0-1\)$"
    ):
        scale_run(run, 16, source=8)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (("scale.dp=8",), r"scale\.dp=8: .*comm_mode=model"),
        (("scale.dp=8", "comm_mode=model", "mode=real"), r"scale\.dp: real replay .*mode=sim"),
        (("scale.dp=-2",), r"scale\.dp: must be >= 0"),
        (("scale.dp=8", "scale.source=first"), r"scale\.source: expected all or a rank"),
        (("scale.dp=8", "scale.source=1", "scale.seed=3"), r"scale\.seed: .*scale\.source=all"),
    ],
)
def test_bad_scale_settings_are_config_errors_naming_the_key(overrides: tuple[str, ...], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        compose_replay(*overrides)


@pytest.mark.parametrize(("dp", "count"), [(1, "1 rank;"), (1_000_000, "1,000,000 ranks;")])
def test_scale_dp_with_recorded_transfers_is_refused_counting_its_ranks(dp: int, count: str) -> None:
    # it said "not of 1 ranks" and "not of 1000000 ranks"
    with pytest.raises(ConfigError) as e:
        compose_replay(f"scale.dp={dp}")
    assert f"those of the captured size, not of {count} extrapolate with" in str(e.value)


def test_scale_is_off_by_default_and_a_source_outside_the_run_is_refused(tmp_path: Path) -> None:
    cfg = compose_replay()
    assert (cfg.scale.dp, cfg.scale.source, cfg.scale.seed) == (0, "all", None)
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    with pytest.raises(ConfigError, match=r"scale\.source=5: no such rank .*0-1"):
        scale_run(run, 4, source=5)


def test_an_extrapolation_to_fewer_ranks_says_which_captured_ranks_are_not_in_the_replay(
    tmp_path: Path,
) -> None:
    # scale.dp=1 of 2 ranks dropped rank 1 (the straggler, in the tester's run) without a word
    from skewlens.profiler.store.issues import run_notes

    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    notes = run_notes(scale_run(run, 1))
    want = (
        "extrapolated: ddp over '0' (ranks 0-1, default_pg: 4 all_reduce) -> 1 data-parallel rank "
        "(1 in all); rank i copies captured rank i mod 2; captured rank(s) 1 copied by none: "
        "not in the replay"
    )
    assert [n for n in notes if n.startswith("extrapolated: ")] == [want]
    assert not any("copied by none" in n for n in run_notes(scale_run(run, 4)))


def test_captured_ranks_without_a_trace_are_named_in_the_extrapolation_note_with_why(tmp_path: Path) -> None:
    # rank 1 (the straggler: 12 ms against 10) had a corrupt trace; lenient=true left it out, and the
    # 8-rank extrapolation replayed 8 copies of rank 0 saying only "copies traced rank number i mod 1 of 0"
    from skewlens.profiler.store.issues import run_notes

    b = RunBuilder(world_size=2)
    for r, dur in ((0, 10_000_000), (1, 12_000_000)):
        b.rank(r).compute("aten::mm", dur)
        b.rank(r).collective(AR, MIB, 100_000)
    run_dir = b.write(tmp_path / "run")
    (run_dir / "rank-1.et").write_bytes((run_dir / "rank-1.et").read_bytes()[:300])
    run = load_run(run_dir, lenient=True)
    note = [n for n in run_notes(scale_run(run, 8)) if n.startswith("extrapolated: ")]
    assert note == [
        "extrapolated: ddp over '0' (ranks 0-1, default_pg: 1 all_reduce) -> 8 data-parallel ranks "
        "(8 in all); every rank copies rank 0, the only traced one; captured rank(s) 1 have no trace, so no "
        "rank copies them (rank 1 left out by the lenient load: " + dict(run.left_out_ranks)[1] + ")"
    ]


def p2p_run(path: Path) -> RunTrace:
    b = RunBuilder(world_size=2)
    b.rank(0).send(1, MIB, 100_000)
    b.rank(1).recv(0, MIB, 100_000)
    for r in (0, 1):
        b.rank(r).collective(AR, MIB, 100_000)
    return load_run(b.write(path))


def tp_run(path: Path) -> RunTrace:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        for _ in range(3):
            c = rb.collective(AR, 64 << 10, 100_000)
            rb.compute("_c10d_functional::wait_tensor", 10_000, deps=(c,))
    return load_run(b.write(path))


def one_group_run(path: Path, ctype: CommType, groups: dict[str, tuple[int, ...]] | None = None) -> RunTrace:
    b = RunBuilder(world_size=4, groups=groups)
    for name, members in (groups or {"0": (0, 1, 2, 3)}).items():
        for r in members:
            b.rank(r).collective(ctype, MIB, 100_000, pg=name)
    return load_run(b.write(path))


def no_comm_run(path: Path) -> RunTrace:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).compute("fwd", 1_000)
    return load_run(b.write(path))


def hsdp_run(
    path: Path,
    replicas: CommType = AR,
    more: dict[str, tuple[CommType, ...]] | None = None,
    shards: CommType = RS,
) -> RunTrace:
    """Hybrid sharding on 4 ranks: shard groups (0, 1), (2, 3) carry ``shards`` (a reduce_scatter),
    replica groups (0, 2), (1, 3) carry ``replicas`` (HSDP: the gradient shards' all_reduce), then what
    ``more`` gives a replica group."""
    groups = {"rep_0": (0, 2), "rep_1": (1, 3), "shard_0": (0, 1), "shard_1": (2, 3)}
    b = RunBuilder(world_size=4, groups=groups)
    for r in range(4):
        b.rank(r).collective(shards, MIB, 100_000, pg=f"shard_{r // 2}")
        b.rank(r).collective(replicas, MIB, 100_000, pg=f"rep_{r % 2}")
        for ctype in (more or {}).get(f"rep_{r % 2}", ()):
            b.rank(r).collective(ctype, MIB, 100_000, pg=f"rep_{r % 2}", root=r % 2)
    return load_run(b.write(path))


def test_hsdp_scales_its_all_reducing_replicas_and_copies_its_shard_groups_into_each_new_replica(
    tmp_path: Path,
) -> None:
    # FSDP1's HYBRID_SHARD (and FSDP2 on a 2-D mesh): both families read as data parallel (mesh_replicate,
    # mesh_shard), and scale.dp was refused ("cannot tell which mesh dimension is data parallel")
    run = hsdp_run(tmp_path / "run")
    lay = identify(run)
    assert (lay.parallelism, lay.inner, lay.dp_size, lay.tp_size) == ("ddp", "fsdp", 2, 2)
    scaled = scale_run(run, 8)
    assert scaled.world_size == 16
    ranks = {n: g.ranks for n, g in scaled.process_groups.items()}
    assert ranks["rep_0"] == tuple(range(0, 16, 2)) and ranks["rep_1"] == tuple(range(1, 16, 2))
    assert (ranks["shard_0"], ranks["shard_1"], ranks["shard_1@dp5"]) == ((0, 1), (2, 3), (10, 11))
    assert sorted((c.comm_type, len(c.ranks), set(c.comm_bytes)) for c in scaled.collectives) == [
        (AR, 8, {MIB}),
        (AR, 8, {MIB}),
        *[(RS, 2, {MIB})] * 8,
    ]
    closed = [ring_ns(c.comm_type, c.comm_bytes[0], len(c.ranks)) for c in scaled.collectives]
    assert transfers(replay(scaled)) == closed


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (p2p_run, r"found 2 send/recv node\(s\) \(1 matched pairs: 0->1 x1\).*pipeline parallelism"),
        (tp_run, r"functional collective .*wait_tensor .*tensor parallelism.*'0' \(ranks 0-1.*3 all_reduce"),
        (lambda p: one_group_run(p, CommType.ALL_TO_ALL), r"carries all_to_all.*'0' \(ranks 0-3"),
        (no_comm_run, r"found no collectives"),
        (
            lambda p: one_group_run(p, AR, {"a": (0, 1), "b": (1, 2, 3)}),
            r"(?=.*'a' \(ranks 0-1)(?=.*'b' \(ranks 1-3)do not tile the ranks as a mesh does",
        ),
        (
            lambda p: hsdp_run(p, RS),
            r"(?=.*dp: .*'rep_0')(?=.*dp: .*'shard_0')cannot tell which mesh dimension is data parallel",
        ),
    ],
    ids=["p2p", "tensor-parallel", "all_to_all", "no-collectives", "not-a-mesh", "two-sharded-families"],
)
def test_a_run_that_cannot_be_extrapolated_says_what_was_found(
    tmp_path: Path, make: object, says: str
) -> None:
    run = make(tmp_path / "run")  # type: ignore[operator]
    with pytest.raises(ExtrapolationError, match=says):
        scale_run(run, 8)


def test_the_cli_refuses_an_extrapolation_in_one_line_naming_scale_dp_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = p2p_run(tmp_path / "run")
    rc = skewlens_main(["replay", f"trace={run.run_dir}", f"out={tmp_path / 'o'}", "scale.dp=8", *MODEL])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith(f"skewlens replay: error: scale.dp=8: {run.run_dir}: ")
    assert "cannot extrapolate to more data-parallel ranks: found 2 send/recv" in err[0]


def test_an_extrapolation_larger_than_the_memory_is_refused_before_it_is_built_naming_scale_dp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    per_pair = len(run.ranks[0]) + len(run.ranks[1])
    need = 4 * per_pair * NODE_BYTES + 8 * RANK_BYTES  # 8 ranks: 4 copies of each captured rank
    assert len(scale_run(run, 8, memory_bytes=need).ranks) == 8
    with pytest.raises(ConfigError) as refused:
        scale_run(run, 8, memory_bytes=need - 1)
    assert f"scale.dp=8: the replayed run would have 8 ranks and {4 * per_pair:,} nodes" in str(refused.value)
    assert str(refused.value).endswith("choose scale.dp=7 or fewer")
    # one that could never fit is refused at once, before a list of its billion sources is drawn
    with pytest.raises(ConfigError, match=r"scale\.dp=1000000000: .* 1,000,000,000 ranks"):
        scale_run(run, 10**9, seed=1, memory_bytes=1 << 40)
    rc = skewlens_main(
        ["replay", f"trace={run.run_dir}", f"out={tmp_path / 'o'}", "scale.dp=1000000000", *MODEL]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert re.search(
        r"scale\.dp=1000000000: .* GiB of memory is available; choose scale\.dp=[\d,]+ or fewer", err[0]
    )
    assert not (tmp_path / "o").exists()


def imported(shared: Path, name: str, out: Path) -> RunTrace:
    from skewlens.profiler.importers import import_traces

    import_traces([shared / name], None, out)
    return load_run(out)


@pytest.mark.slow
def test_a_real_gpu_trace_of_ddp_scales_and_one_with_all_to_all_is_refused_naming_it(
    shared_traces: Path, tmp_path: Path
) -> None:
    two = imported(shared_traces, "nccl_2gpu_rank0_kineto.json.gz", tmp_path / "two")
    scaled = scale_run(two, 64)  # one rank of two traced: every new rank copies it
    assert identify(two).parallelism == "ddp" and scaled.world_size == 64
    assert all(rt.dur_ns is two.ranks[0].dur_ns for rt in scaled.ranks.values())
    assert {c.comm_type for c in scaled.collectives} == {AR, CommType.BROADCAST}
    closed_form_transfers(scaled, replay(scaled))
    sixteen = imported(shared_traces, "nccl_16gpu_rank0_kineto.json.gz", tmp_path / "sixteen")
    with pytest.raises(ExtrapolationError, match=r"carries all_to_all.*'0' \(ranks 0-15.*55 all_to_all"):
        scale_run(sixteen, 64)


# ---- real captures (gloo ranks on the CPU) ---------------------------------------------------------


def closed_form_transfers(scaled: RunTrace, sim: SimResult) -> None:
    n = scaled.world_size
    expected = [ring_ns(c.comm_type, c.comm_bytes[0], len(c.ranks)) for c in scaled.collectives]
    assert all(len(c.ranks) == n for c in scaled.collectives)
    assert transfers(sim) == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "parallelism"), [("ddp_accum.py", "ddp"), ("fsdp2.py", "fsdp2"), ("fsdp1.py", "fsdp2")]
)
def test_a_captured_run_scaled_to_8_sizes_its_communication_by_its_parallelism_and_the_model_times_it(
    tmp_path: Path, script: str, parallelism: str
) -> None:
    from workload_helpers import capture_workload

    run = capture_workload(tmp_path / "run", script, nproc=2)
    assert identify(run).parallelism == parallelism
    scaled = scale_run(run, 8)
    assert scaled.process_groups["0"].ranks == tuple(range(8))
    captured = {(c.pg_name, c.seq): (c.comm_type, c.comm_bytes[0]) for c in run.collectives}
    for c in scaled.collectives:
        ctype, nbytes = captured[(c.pg_name, c.seq)]
        # DDP's buckets and FSDP's reduce_scatter inputs keep their bytes, FSDP's shards are 2/8 of 2's (FSDP1
        # gathers into a list of its flat parameter's chunks on the CPU: they kept their bytes before)
        assert c.comm_bytes == (nbytes * 2 // 8 if ctype == AG else nbytes,) * 8
    assert {c.comm_type for c in scaled.collectives} == ({AR} if parallelism == "ddp" else {AG, RS})
    closed_form_transfers(scaled, replay(scaled))


@pytest.mark.slow
def test_a_4_rank_capture_scaled_to_1024_with_one_slowed_rank_is_held_up_by_that_rank(
    tmp_path: Path,
) -> None:
    from workload_helpers import capture_workload

    run = capture_workload(tmp_path / "ddp", "ddp_accum.py", nproc=4)
    scaled = scale_run(run, 1024)
    # x10, not x3: the copies of a captured rank keep what noise put in its trace, and a copy that waited
    # for CPU-starved peers in the capture waits for them in the scaled run too. At x3 rank 777 (waiting
    # 199 ms unslowed, one capture of 3 beside two CPU hogs) still waited 31 ms against 25 ms for the rank
    # that waited least; at x10 it waits for none and every other rank waits 666 ms or more longer
    sim = replay(scaled, "slowdown=straggler", "slowdown.rank=777", "slowdown.factor=10.0")
    wait = dict.fromkeys(scaled.ranks, 0)
    for ci, c in enumerate(scaled.collectives):
        last = int(sim.coll_arrival_ns[ci])
        for r, row in zip(c.ranks, c.rows, strict=True):
            wait[r] += last - int(sim.start_ns[r][row])
    late = np.array([wait[r] for r in range(1024)])
    assert int(np.argmin(late)) == 777
    assert np.all(np.delete(late, 777) > late[777])


def test_a_column_major_mesh_numbers_its_new_ranks_j_times_n_plus_d(tmp_path: Path) -> None:
    # captured rank r = j * 2 + d (column-major, k = 2): its dp group is mesh_dp_<j>, its tp group
    # mesh_tp_<d>. At N = 4 the new rank of (d, j) is j * 4 + d: dp group j = 4j..4j+3, tp group d =
    # (d, 4 + d)
    groups = {
        "0": (0, 1, 2, 3),
        "mesh_dp_0": (0, 1),
        "mesh_dp_1": (2, 3),
        "mesh_tp_0": (0, 2),
        "mesh_tp_1": (1, 3),
    }
    group_of = {(r, k): f"mesh_{k}_{r // 2 if k == 'dp' else r % 2}" for r in range(4) for k in ("dp", "tp")}
    run = build(tmp_path / "mesh", world=4, schedule=MESH, groups=groups, group_of=group_of)
    assert not identify(run).row_major
    scaled = scale_run(run, 4)
    assert {n: g.ranks for n, g in scaled.process_groups.items()} == {
        "0": tuple(range(8)),
        "mesh_dp_0": (0, 1, 2, 3),
        "mesh_dp_1": (4, 5, 6, 7),
        "mesh_tp_0": (0, 4),
        "mesh_tp_1": (1, 5),
        "mesh_tp_0@dp2": (2, 6),
        "mesh_tp_1@dp3": (3, 7),
    }


def test_reduce_scatter_block_makes_a_run_fsdp2_whose_all_gather_shards_shrink(tmp_path: Path) -> None:
    # FSDP2 by its reduce_scatter(_tensor) of the full gradient: the all_gather input of 2 MiB at k = 2
    # becomes ceil(2 MiB * 2 / 8) = 512 KiB at N = 8
    run = build(
        tmp_path / "rsb", world=2, schedule=(("0", AG, FULL // 2), ("0", CommType.REDUCE_SCATTER_BLOCK, FULL))
    )
    assert identify(run).parallelism == "fsdp2"
    scaled = scale_run(run, 8)
    assert {b for c in scaled.collectives if c.comm_type == AG for b in c.comm_bytes} == {FULL // 8}


def test_functional_all_reduces_beside_an_all_gather_are_read_as_ddp_not_tensor_parallelism(
    tmp_path: Path,
) -> None:
    # refused only where every all_reduce is functional and the group has no all_gather / reduce_scatter
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        c = rb.collective(AR, 64 << 10, 100_000)
        rb.compute("_c10d_functional::wait_tensor", 10_000, deps=(c,))
        rb.collective(AG, 64 << 10, 100_000)
    assert identify(load_run(b.write(tmp_path / "run"))).parallelism == "ddp"


def test_a_mesh_family_whose_all_reduces_are_only_partly_functional_is_of_unknown_role(
    tmp_path: Path,
) -> None:
    # a 2 x 2 mesh whose group names say nothing: a_<j> carries reduce_scatters (data parallel); b_<d> an
    # all_reduce waited on by wait_tensor (TP-like) and one that is not (DDP-like): neither, so which
    # dimension is data parallel cannot be told from it
    groups = {"0": (0, 1, 2, 3), "a_0": (0, 2), "a_1": (1, 3), "b_0": (0, 1), "b_1": (2, 3)}
    b = RunBuilder(world_size=4, groups=groups)
    for r in range(4):
        rb = b.rank(r)
        rb.collective(RS, MIB, 100_000, pg=f"a_{r % 2}")
        c = rb.collective(AR, 64 << 10, 100_000, pg=f"b_{r // 2}")
        rb.compute("_c10d_functional::wait_tensor", 10_000, deps=(c,))
        rb.collective(AR, 64 << 10, 100_000, pg=f"b_{r // 2}")
    with pytest.raises(ExtrapolationError, match=r"cannot tell which mesh dimension.*unknown role: .*'b_0'"):
        identify(load_run(b.write(tmp_path / "run")))


def test_the_memory_check_of_a_mesh_counts_the_nodes_of_the_source_ranks_replica(tmp_path: Path) -> None:
    # source rank 3 = (d = 1, j = 1): every one of 4 replicas copies ranks 2 and 3, 8 ranks in all
    run = build(tmp_path / "mesh", world=4, schedule=MESH, groups=MESH_GROUPS, group_of=MESH_OF)
    need = 4 * (len(run.ranks[2]) + len(run.ranks[3])) * NODE_BYTES + 8 * RANK_BYTES
    assert len(scale_run(run, 4, source=3, memory_bytes=need).ranks) == 8
    with pytest.raises(ConfigError, match=r"scale\.dp=4: the replayed run would have 8 ranks"):
        scale_run(run, 4, source=3, memory_bytes=need - 1)


def test_an_all_gather_on_a_replicated_group_keeps_its_bytes_when_the_dp_shards_shrink(
    tmp_path: Path,
) -> None:
    # replicated (tp) groups keep everything: their all_gather input stays 64 KiB on every new rank
    schedule = (("dp", AG, FULL // 2), ("tp", AG, 64 << 10), ("dp", RS, FULL))
    run = build(tmp_path / "mesh", world=4, schedule=schedule, groups=MESH_GROUPS, group_of=MESH_OF)
    scaled = scale_run(run, 4)
    tp = [c for c in scaled.collectives if c.pg_name.startswith("mesh_tp")]
    assert tp and {
        int(scaled.ranks[r].comm_bytes[w]) for c in tp for r, w in zip(c.ranks, c.rows, strict=True)
    } == {64 << 10}


def test_analyze_given_an_extrapolated_replays_outputs_says_no_run_holds_its_ranks_not_to_import_kineto(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "ddp"
    build(run_dir, world=2, schedule=DDP)
    common = [f"trace={run_dir}", *MODEL, "progress=false"]
    assert skewlens_main(["replay", f"out={tmp_path / 'x8'}", "scale.dp=8", *common]) == 0
    assert skewlens_main(["replay", f"out={tmp_path / 'as-run'}", *common]) == 0
    capsys.readouterr()
    for given in (tmp_path / "x8", tmp_path / "x8" / "timeline.json"):
        assert skewlens_main(["analyze", str(given), "--out", str(tmp_path / "a")]) == 2
        said = (
            f"skewlens analyze: error: {given}: timeline.json is a Perfetto timeline skewlens wrote of run "
            f"{run_dir} (a replay's or an analysis' output), not a run: the replay was extrapolated to 8 "
            "ranks (scale.dp), which no run holds, so no command reads it as a run; its per-rank results "
            f"are summary.parquet and timeline.parquet beside it, and {run_dir} is the captured run"
        )
        assert capsys.readouterr().err.splitlines() == [said]
    # a replay of the run as captured points at that run (it read 'holds Kineto traces: import them first')
    assert skewlens_main(["analyze", str(tmp_path / "as-run"), "--out", str(tmp_path / "a")]) == 2
    said = (
        f"skewlens analyze: error: {tmp_path / 'as-run'}: timeline.json is a Perfetto timeline skewlens "
        f"wrote of run {run_dir} (a replay's or an analysis' output), not a run: give the run it was made "
        f"from, {run_dir}"
    )
    assert capsys.readouterr().err.splitlines() == [said]
    assert not (tmp_path / "a").exists()


def test_importing_a_replays_timeline_as_kineto_says_what_it_is_and_names_its_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it said 'no distributedInfo.rank in the trace (give the rank with --rank ...)', and with --rank 0
    # 'nothing to import'
    run_dir = tmp_path / "ddp"
    build(run_dir, world=2, schedule=DDP)
    out = tmp_path / "o"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", *MODEL, "progress=false"]) == 0
    capsys.readouterr()
    given = out / "timeline.json"
    what = f"timeline.json is a Perfetto timeline skewlens wrote of run {run_dir}"
    then = (
        f"(a replay's or an analysis' output), not a Kineto trace: give the run it was made from, {run_dir}"
    )
    for extra in ([], ["--rank", "0"]):
        assert skewlens_main(["import", "--kineto", str(given), *extra, "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err == [f"skewlens import: error: {given}: {what} {then}"]
    assert not (tmp_path / "r").exists()


def test_a_timeline_cut_short_or_with_a_flag_for_its_rank_count_is_still_named_a_timeline_not_a_run(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.errors import ManifestError
    from skewlens.profiler.store.load import locate_run

    # its otherData cut off mid-value (no JSON to read: no run named), or with a rank count that is true:
    # a timeline all the same, not an extrapolated one of 1 rank
    head = '{"displayTimeUnit":"ns","otherData":{"t0_ns":0,'
    for name, text in (("cut", head + '"run_dir":"/r'), ("flag", head + '"extrapolated_ranks":true}}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "timeline.json").write_text(text)
        with pytest.raises(ManifestError) as e:
            locate_run(tmp_path / name)
        assert str(e.value) == (
            f"{tmp_path / name}: timeline.json is a Perfetto timeline skewlens wrote (a replay's or an "
            "analysis' output), not a run: give the run it was made from"
        )


@pytest.mark.parametrize("listed", ["c10d::allgather_", "nccl:all_gather"])
def test_an_fsdp2_runs_gather_into_a_list_keeps_its_bytes_while_its_parameter_gathers_shrink(
    tmp_path: Path, listed: str
) -> None:
    # a metrics gather (dist.all_gather into a list: c10d::allgather_, or ProcessGroupNCCL's annotation of
    # it) beside FSDP2's parameter gathers (all_gather_into_tensor: c10d::_allgather_base_); at 8 ranks it
    # was priced as 4 KiB a rank, not 16
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0)
        b.rank(r).collective(AG, FULL // 2, 1_000_000, start_ns=0, name="c10d::_allgather_base_")
        b.rank(r).collective(RS, FULL, 1_000_000, start_ns=1_000_000, name="c10d::_reduce_scatter_base_")
        b.rank(r).collective(AG, 16_384, 100_000, start_ns=2_000_000, name=listed)
    scaled = scale_run(load_run(b.write(tmp_path / "fsdp2")), 8)
    assert [(c.comm_type, set(c.comm_bytes)) for c in scaled.collectives] == [
        (AG, {FULL // 8}),
        (RS, {FULL}),
        (AG, {16_384}),
    ]
    assert scaled.ranks[5].comm_bytes.tolist()[-3:] == [FULL // 8, FULL, 16_384]
    assert scaled.manifest.notes["scale"].endswith(
        "; 1 all_gather(s) into a list on the data-parallel group (up to 16,384 bytes a rank: metrics or "
        "objects, not FSDP2's parameter gathers) keep their bytes at 8 ranks"
    )
    sim = replay(scaled)
    assert transfers(sim)[2] == ring_ns(AG, 16_384, 8)  # 8 pieces of 16 KiB gathered


def test_fsdp1s_parameter_gathers_into_a_list_on_the_cpu_shrink_while_a_metrics_gather_keeps_its_bytes(
    tmp_path: Path,
) -> None:
    # FullyShardedDataParallel on the CPU gathers each flat parameter with dist.all_gather into a list of its
    # chunks (c10d::allgather_), then reduce-scatters its gradient of the same padded size: a 2-rank capture
    # of 4 Linear(250, 250) units (125,500 bytes a rank) kept 125,500 bytes a rank at 64 ranks, its 40
    # parameter gathers read as "metrics or objects"; only the metrics gather, of no gradient's size, keeps
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0)
        b.rank(r).collective(AG, FULL // 2, 1_000_000, start_ns=0, name="c10d::allgather_")
        b.rank(r).collective(AG, MIB // 2, 1_000_000, start_ns=1_000_000, name="c10d::allgather_")
        b.rank(r).collective(RS, MIB, 1_000_000, start_ns=2_000_000, name="c10d::_reduce_scatter_base_")
        b.rank(r).collective(RS, FULL, 1_000_000, start_ns=3_000_000, name="c10d::_reduce_scatter_base_")
        b.rank(r).collective(AG, 16_384, 100_000, start_ns=4_000_000, name="c10d::allgather_")
    scaled = scale_run(load_run(b.write(tmp_path / "fsdp1")), 8)
    assert [(c.comm_type, set(c.comm_bytes)) for c in scaled.collectives] == [
        (AG, {FULL // 8}),
        (AG, {MIB // 8}),
        (RS, {MIB}),
        (RS, {FULL}),
        (AG, {16_384}),
    ]
    assert scaled.manifest.notes["scale"].endswith(
        "; 1 all_gather(s) into a list on the data-parallel group (up to 16,384 bytes a rank: metrics or "
        "objects, not FSDP2's parameter gathers) keep their bytes at 8 ranks"
    )
    assert transfers(replay(scaled))[0] == ring_ns(AG, FULL // 8, 8)  # 8 shards of FULL / 8 gathered


def test_an_extrapolated_ranks_recorded_step_is_its_captured_ranks_and_the_summary_caption_says_so(
    tmp_path: Path,
) -> None:
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    as_run = {(s.rank, s.step): s.recorded_step_ns for s in summarize(run, replay(run))}
    big = scale_run(run, 6)
    scaled = summarize(big, replay(big))
    assert {(s.rank, s.step): s.recorded_step_ns for s in scaled} == {
        (r, step): ns for r in range(6) for (src, step), ns in as_run.items() if src == r % 2
    }
    text = io.StringIO()
    Console(file=text, width=200).print(summary_table(scaled))
    assert "rank←captured rank it copies, recorded ms that rank's step as captured; " in text.getvalue()


def test_a_ddp_runs_gather_into_a_list_is_not_counted_among_possible_zero_shard_gathers(
    tmp_path: Path,
) -> None:
    # dist.all_gather / all_gather_object (c10d::allgather_) gather whole tensors or objects; ZeRO gathers its
    # shards into one tensor: the note's doubt was raised for every DDP run that gathered a metric
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).collective(AR, BUCKETS[0], 1_000_000, start_ns=0)
        b.rank(r).collective(AG, 8, 100_000, start_ns=1_000_000, name="c10d::allgather_")
    metrics = scale_run(load_run(b.write(tmp_path / "metrics")), 64)
    assert {c.comm_bytes[0] for c in metrics.collectives if c.comm_type == AG} == {8}
    assert "all_gather(s)" not in metrics.manifest.notes["scale"]
    for r in range(2):
        b.rank(r).collective(AG, 2 * MIB, 100_000, start_ns=2_000_000, name="c10d::_allgather_base_")
    zero1 = scale_run(load_run(b.write(tmp_path / "zero1")), 64)
    assert (
        f"; 1 all_gather(s) on the data-parallel group (up to {2 * MIB:,} bytes a rank)"
        in (zero1.manifest.notes["scale"])
    )


def test_an_fsdp1_metrics_gather_the_size_of_an_all_reduce_keeps_its_bytes_a_reduce_scatters_size_shrinks(
    tmp_path: Path,
) -> None:
    # a gather into a list is read as FSDP1's parameter gather only where a reduce_scatter on its group
    # reduces its gathered size: an all_reduce of that size (a loss, a norm) says nothing of parameters
    listed = "c10d::allgather_"
    issued = [
        (AG, FULL // 2, listed),
        (RS, FULL, "c10d::_reduce_scatter_base_"),
        (AR, 32_768, ""),
        (AG, 16_384, listed),
    ]
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0)
        for k, (ctype, size, op) in enumerate(issued):
            b.rank(r).collective(ctype, size, 100_000, start_ns=k * 1_000_000, name=op or None)
    scaled = scale_run(load_run(b.write(tmp_path / "fsdp1")), 8)
    assert [(c.comm_type, set(c.comm_bytes)) for c in scaled.collectives] == [
        (AG, {FULL // 8}),
        (RS, {FULL}),
        (AR, {32_768}),
        (AG, {16_384}),
    ]


def test_hsdp_whose_replica_groups_also_broadcast_and_barrier_still_scales_its_replicas(
    tmp_path: Path,
) -> None:
    # the replica family of HYBRID_SHARD all-reduces gradient shards, and may broadcast buffers and barrier:
    # that is still a replica family, not a second data-parallel family of unknown role
    also = (CommType.BROADCAST, CommType.BARRIER)
    lay = identify(hsdp_run(tmp_path / "run", more={"rep_0": also, "rep_1": also}))
    assert (lay.parallelism, lay.inner, lay.dp_size, lay.tp_size) == ("ddp", "fsdp", 2, 2)


def test_two_data_parallel_families_where_one_replica_group_also_gathers_are_refused_not_read_as_hsdp(
    tmp_path: Path,
) -> None:
    # only a family whose every group carries replica traffic (all_reduce, broadcast, barrier) is HSDP's
    # replicas; one group's gather to a root leaves which family scales unsaid
    run = hsdp_run(tmp_path / "run", more={"rep_1": (CommType.GATHER,)})
    with pytest.raises(ExtrapolationError, match="cannot tell which mesh dimension is data parallel"):
        identify(run)


def test_a_2d_fsdp1_metrics_gather_the_size_of_a_tensor_parallel_reduce_scatter_keeps_its_bytes(
    tmp_path: Path,
) -> None:
    # the reduce_scatter that marks a gather into a list as FSDP1's parameter gather is on the gather's own
    # data-parallel group: a tensor-parallel group's (sequence parallelism) of the gathered size is not
    groups = {"mesh_dp_0": (0, 2), "mesh_dp_1": (1, 3), "mesh_tp_0": (0, 1), "mesh_tp_1": (2, 3)}
    b = RunBuilder(world_size=4, groups=groups)
    for r in range(4):
        dp, tp = f"mesh_dp_{r % 2}", f"mesh_tp_{r // 2}"
        b.rank(r).step(0)
        b.rank(r).collective(AG, FULL // 2, 1_000_000, start_ns=0, pg=dp, name="c10d::allgather_")
        b.rank(r).collective(RS, FULL, 1_000_000, start_ns=1_000_000, pg=dp)
        b.rank(r).collective(RS, 2 * 16_384, 100_000, start_ns=2_000_000, pg=tp)
        b.rank(r).collective(AG, 16_384, 100_000, start_ns=3_000_000, pg=dp, name="c10d::allgather_")
    scaled = scale_run(load_run(b.write(tmp_path / "fsdp1")), 8)
    assert sorted(
        {(c.comm_type, len(c.ranks), c.comm_bytes[0]) for c in scaled.collectives if c.comm_type == AG}
    ) == [(AG, 8, 16_384), (AG, 8, FULL // 8)]


@pytest.mark.parametrize(
    "shards", [AG, CommType.REDUCE_SCATTER_BLOCK], ids=["all_gather", "reduce_scatter_block"]
)
def test_hsdp_whose_shard_groups_only_gather_or_reduce_scatter_a_block_is_still_hsdp(
    tmp_path: Path, shards: CommType
) -> None:
    # a window of forward passes only (the parameters' all_gathers, no gradient reduce_scatter), or shards
    # reduced with reduce_scatter_block: the shard family (named so) is told from the all-reducing replicas
    lay = identify(hsdp_run(tmp_path / "run", shards=shards))
    assert (lay.parallelism, lay.inner, lay.dp_size, lay.tp_size) == ("ddp", "fsdp", 2, 2)


def test_a_pipeline_runs_refusal_names_the_groups_its_pairs_are_on_and_how_many_pairs_it_left_out(
    tmp_path: Path,
) -> None:
    # an 8-rank pp x dp x tp capture was refused with "128 matched pairs: 0->4 x16, ..., 5->1 x16": six of
    # its eight sender -> receiver pairs, with no word of the two left out or of the mesh_pp groups
    groups = {"0": tuple(range(8)), "dp": (0, 1, 2, 3), "dq": (4, 5, 6, 7)}
    groups |= {f"pp{k}": (k, k + 4) for k in range(4)}
    descs = {"dp": "mesh_dp", "dq": "mesh_dp"} | {f"pp{k}": "mesh_pp" for k in range(4)}
    b = RunBuilder(world_size=8, groups=groups, descs=descs)
    for k in range(4):
        b.rank(k).send(k + 4, MIB, 100_000, pg=f"pp{k}")
        b.rank(k + 4).recv(k, MIB, 100_000, pg=f"pp{k}")
        b.rank(k + 4).send(k, MIB, 100_000, pg=f"pp{k}")
        b.rank(k).recv(k + 4, MIB, 100_000, pg=f"pp{k}")
    for r in range(8):
        b.rank(r).collective(RS, MIB, 100_000, pg="dp" if r < 4 else "dq")
    with pytest.raises(ExtrapolationError) as e:
        identify(load_run(b.write(tmp_path / "run")))
    said = str(e.value)
    assert "(8 matched pairs: 0->4 x1, 1->5 x1, 2->6 x1, 3->7 x1, 4->0 x1, 5->1 x1 and 2 more)" in said
    assert ") on 4 groups: 'pp0' (ranks 0, 4, mesh_pp), 'pp1' (ranks 1, 5, mesh_pp), 'pp2'" in said


def test_a_pipeline_refusal_on_many_groups_lists_six_in_the_order_torch_numbered_them_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    # groups '5' to '12', one send/recv pair on each: as text '10' sorts before '5', and a list of every
    # group would run on past the six the pairs are cut to
    names = [str(k) for k in range(5, 13)]
    b = RunBuilder(world_size=2, groups={"0": (0, 1)} | dict.fromkeys(names, (0, 1)))
    for n in names:
        b.rank(0).send(1, MIB, 100_000, pg=n)
        b.rank(1).recv(0, MIB, 100_000, pg=n)
    with pytest.raises(ExtrapolationError) as e:
        identify(load_run(b.write(tmp_path / "run")))
    shown = ", ".join(f"'{n}' (ranks 0-1)" for n in names[:6])
    assert f"(8 matched pairs: 0->1 x8) on 8 groups: {shown} and 2 more: point-to-point" in str(e.value)


def test_a_scaled_runs_columns_are_read_only_as_a_loaded_runs_are(tmp_path: Path) -> None:
    # its execution model is cached per RunTrace as a loaded run's; FSDP2's all_gather bytes, new arrays of
    # the copies, would be writable
    scaled = scale_run(build(tmp_path / "fsdp2", world=2, schedule=FSDP2), 4)
    writable = [
        (rt.rank, f)
        for rt in scaled.ranks.values()
        for f in rt.__slots__
        if isinstance(getattr(rt, f, None), np.ndarray) and getattr(rt, f).flags.writeable
    ]
    assert len(scaled.ranks) == 4 and writable == []


def test_each_rank_of_a_scaled_run_has_the_gpu_and_device_of_the_captured_rank_it_copies(
    tmp_path: Path,
) -> None:
    # (analyze's mixed-GPU note reads manifest.gpus: the copies of an A100 rank ran on an A100)
    run = build(tmp_path / "ddp", world=2, schedule=DDP)
    gpus = {0: "NVIDIA H100 80GB HBM3 (132 SMs, 79.2 GiB)", 1: "NVIDIA A100-SXM4-80GB (108 SMs, 79.2 GiB)"}
    manifest = dataclasses.replace(run.manifest, gpus=gpus, devices={0: "cuda:0", 1: "cuda:1"})
    scaled = scale_run(dataclasses.replace(run, manifest=manifest), 5)
    assert scaled.manifest.gpus == {r: gpus[r % 2] for r in range(5)}
    assert scaled.manifest.devices == {r: f"cuda:{r % 2}" for r in range(5)}


@pytest.mark.parametrize("rooted", [CommType.BROADCAST, CommType.REDUCE])
@pytest.mark.parametrize("row_major", [True, False])
def test_a_broadcasts_root_follows_its_copy_so_every_new_replica_replays_as_the_one_it_copies(
    tmp_path: Path, row_major: bool, rooted: CommType
) -> None:
    # (a reduce's root, its destination, likewise)
    # a 2 x 2 mesh whose tp pairs broadcast from their j = 0 member each step (Megatron's input broadcast)
    # and whose dp groups broadcast from their d = 0 member (DDP's buffers): j = 1 computes longer before the
    # tp broadcast, so its root, who waits for no one, ends earlier than a member that waits for the last.
    # Before, a copy kept the captured root's number: in a new replica not a member of its tp group (root
    # unknown: every member waited for the last), in a column-major mesh the wrong rank of its dp group
    def at(d: int, j: int) -> int:
        return d * 2 + j if row_major else j * 2 + d

    groups = {"0": (0, 1, 2, 3)}
    groups |= {f"mesh_dp_{j}": (at(0, j), at(1, j)) for j in range(2)}
    groups |= {f"mesh_tp_{d}": (at(d, 0), at(d, 1)) for d in range(2)}
    group_of = {
        (at(d, j), k): f"mesh_{k}_{j if k == 'dp' else d}"
        for d in range(2)
        for j in range(2)
        for k in ("dp", "tp")
    }
    roots = {f"mesh_tp_{d}": at(d, 0) for d in range(2)} | {f"mesh_dp_{j}": at(0, j) for j in range(2)}
    schedule = (("dp", AG, FULL // 2), ("tp", rooted, 64 << 10), ("dp", rooted, 4096))
    run = build(tmp_path / "mesh", world=4, schedule=schedule, groups=groups, group_of=group_of, roots=roots)
    scaled = scale_run(run, 4)
    first = {r for r in range(8) if (r % 2 == 0 if row_major else r < 4)}  # the new ranks with j = 0
    roots_of = {}
    for c in scaled.collectives:
        if c.comm_type == rooted:
            col = "src" if rooted == CommType.BROADCAST else "dst"
            roots_of[c.pg_name, c.ranks] = {
                int(getattr(scaled.ranks[r], col)[w]) for r, w in zip(c.ranks, c.rows, strict=True)
            }
    # a tp pair's root is its j = 0 member; a dp group's its d = 0 member, the first
    want = {(n, m): set(m) & first if n.startswith("mesh_tp") else {m[0]} for n, m in roots_of}
    assert roots_of == want and len(roots_of) == 6
    sim = replay(scaled)  # copies of one rank replay identically, in whichever replica
    ends: dict[int, set[tuple[int, ...]]] = {}
    for r, src in scaled.source_ranks.items():
        ends.setdefault(src, set()).add(tuple(sim.end_ns[r].tolist()))
    assert sorted(ends) == [0, 1, 2, 3] and all(len(e) == 1 for e in ends.values())


def test_broadcasts_from_several_roots_on_the_data_parallel_group_are_counted_as_possibly_zeros_owners(
    tmp_path: Path,
) -> None:
    # ZeroRedundancyOptimizer broadcasts each parameter from its owner (here 3 from rank 1, 1 from rank 0):
    # at N ranks its owners spread over N, where the copies keep the captured roots; the line said nothing
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).collective(AR, BUCKETS[0], 1_000_000, start_ns=0)
        for i, root in enumerate((1, 1, 1, 0)):
            b.rank(r).collective(CommType.BROADCAST, 4096, 100_000, start_ns=1_000_000 * (i + 1), root=root)
    zero = load_run(b.write(tmp_path / "zero"))
    note = scale_run(zero, 1024).manifest.notes["scale"]
    assert note.endswith(
        "; 4 broadcast(s) on the data-parallel group from 2 roots keep their captured roots at 1,024 ranks, "
        "where an optimizer sharded by owner (ZeRO) would broadcast from others"
    )
    assert "captured roots" not in scale_run(zero, 2).manifest.notes["scale"]  # at k ranks the owners are k's
    # DDP's buffers broadcast from rank 0 only; a mesh's dp groups each from their own d = 0 member
    ddp = build(tmp_path / "ddp", world=2, schedule=(*DDP, ("0", CommType.BROADCAST, 4096)), roots={"0": 0})
    assert "captured roots" not in scale_run(ddp, 64).manifest.notes["scale"]
    mesh_bcast = (*MESH, ("dp", CommType.BROADCAST, 4096))
    roots = {"mesh_dp_0": 0, "mesh_dp_1": 1}
    mesh = build(
        tmp_path / "mesh", world=4, schedule=mesh_bcast, groups=MESH_GROUPS, group_of=MESH_OF, roots=roots
    )
    assert "captured roots" not in scale_run(mesh, 8).manifest.notes["scale"]


def test_a_root_that_no_new_rank_copies_is_unknown_and_a_broadcast_of_no_recorded_root_is_no_second_owner(
    tmp_path: Path,
) -> None:
    # 4 data-parallel ranks broadcasting from rank 3, at 2: no new rank copies rank 3, so the root is unknown
    four = build(tmp_path / "four", world=4, schedule=(*DDP, ("0", CommType.BROADCAST, 4096)), roots={"0": 3})
    two = scale_run(four, 2)
    roots = {
        int(two.ranks[r].src[w])
        for c in two.collectives
        if c.comm_type == CommType.BROADCAST
        for r, w in zip(c.ranks, c.rows, strict=True)
    }
    assert roots == {-1}
    # broadcasts from rank 0 and one whose root was not recorded: one root, no owners' caveat
    b = RunBuilder(world_size=2)
    for r in range(2):
        for i, root in enumerate((0, None, 0)):
            b.rank(r).collective(CommType.BROADCAST, 4096, 100_000, start_ns=1_000_000 * (i + 1), root=root)
    assert "captured roots" not in scale_run(load_run(b.write(tmp_path / "one")), 8).manifest.notes["scale"]
