"""``skewlens calibrate``: the α-β network model fitted to a run's transfers, waits for late peers removed."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from capture_helpers import EXAMPLE, profile

from skewlens.cli import main as skewlens_main
from skewlens.cli.calibrate import load_topology_entry
from skewlens.profiler.manifest import read_manifest, write_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.calibrate import (
    MAX_BANDWIDTH_GBPS,
    CalibrationError,
    calibrate,
    poor_fits,
    recorded_transfers,
    write_topology,
)
from skewlens.replay.comm import ModelTiming, message_bytes
from skewlens.replay.errors import ConfigError
from skewlens.replay.network.topology import Dimension, Topology
from skewlens.replay.simulate import simulate
from skewlens.replay.summary import summarize

AR, AG, BC = CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.BROADCAST
KIB, MIB = 1 << 10, 1 << 20
MODEL = ("comm_mode=model", "progress=false")

# The closed forms the replay's network model uses (skewlens.replay.network.algorithms), written out here:
# ring all_reduce 2(p-1)(α + S/(pB)), ring all_gather (p-1)(α + S/(pB)), ring broadcast (p-1)α + S/B, with S
# the message size: a member's comm_size, but for all_gather the p pieces gathered (comm_size is a member's
# input, skewlens.replay.comm.message_bytes).
ALPHA_NS, BW = 25_000.0, 12.0  # 25 µs, 12 GB/s (bytes/ns)


def ring_ns(comm_type: CommType, comm_bytes: int, p: int, alpha: float, bw: float) -> float:
    if comm_type == AR:
        return 2 * (p - 1) * (alpha + comm_bytes / (p * bw))
    if comm_type == AG:
        return (p - 1) * (alpha + p * comm_bytes / (p * bw))
    return (p - 1) * alpha + comm_bytes / bw


Schedule = Sequence[tuple[str, CommType, int]]


def build_run(
    path: Path,
    *,
    world: int,
    groups: dict[str, tuple[int, ...]],
    schedule: Schedule,
    transfer_ns: Callable[[str, CommType, int], float],
    noise: float = 0.02,
    outliers: Sequence[int] = (),
    seed: int = 0,
) -> tuple[Path, int, int]:
    """A run whose collectives transfer ``transfer_ns(group, type, size)`` (± ``noise``, x3 for the
    instances in ``outliers``) after the last member arrives; members arrive after compute of random
    length, so most wait for a late peer first. Returns the run, summed transfers and summed waits."""
    rng = random.Random(seed)
    b = RunBuilder(world_size=world, groups=groups)
    clock = dict.fromkeys(range(world), 0)
    total_transfer = total_wait = 0
    for i, (pg, comm_type, nbytes) in enumerate(schedule):
        members = groups[pg]
        arrive = {}
        for r in members:
            dur = rng.randrange(200_000, 3_000_000)
            b.rank(r).compute("aten::mm", dur_ns=dur, start_ns=clock[r])
            arrive[r] = clock[r] + dur
        last = max(arrive.values())
        t = transfer_ns(pg, comm_type, nbytes) * (1 + rng.uniform(-noise, noise))
        t = round(t * (3 if i in outliers else 1))
        for r in members:
            b.rank(r).collective(comm_type, comm_bytes=nbytes, dur_ns=last + t - arrive[r], pg=pg)
            clock[r] = last + t
            total_wait += last - arrive[r]
        total_transfer += t
    return b.write(path), total_transfer, total_wait


SCHEDULE: Schedule = [
    (pg, ty, size)
    for _ in range(3)
    for pg, ty, size in [
        ("0", AR, 4 * KIB),
        ("0", AR, 256 * KIB),
        ("0", AR, 4 * MIB),
        ("0", AR, 32 * MIB),
        ("0", AG, 256 * KIB),
        ("0", AG, 8 * MIB),
        ("0", BC, 1 * MIB),
    ]
]


@pytest.fixture
def synthetic(tmp_path: Path) -> tuple[Path, int, int]:
    return build_run(
        tmp_path / "run",
        world=4,
        groups={"0": (0, 1, 2, 3)},
        schedule=SCHEDULE,
        transfer_ns=lambda _pg, ty, size: ring_ns(ty, size, 4, ALPHA_NS, BW),
        outliers=(9,),
    )


def test_a_calibration_recovers_the_latency_and_bandwidth_the_synthetic_transfers_follow(
    synthetic: tuple[Path, int, int],
) -> None:
    run_dir, transfer, wait = synthetic
    assert wait > transfer  # the waits for late peers are most of the recorded time: they must go
    cal = calibrate(load_validated(run_dir))
    (link,) = cal.links
    assert link.latency_ns == pytest.approx(ALPHA_NS, rel=0.05)
    assert link.bandwidth_gbps == pytest.approx(BW, rel=0.05)
    assert cal.topology.dims[0].latency_ns == round(link.latency_ns)
    assert link.n == len(SCHEDULE) and link.sizes == 6
    # the one inflated transfer (x3) is a residual of 2/3 (of its recorded time), the others within the ±2%
    # noise
    assert link.median_residual < 0.03 and link.p90_residual < 0.05
    by_type = {f.label: f for f in cal.groups}
    assert set(by_type) == {"'0' all_reduce", "'0' all_gather", "'0' broadcast"}
    assert by_type["'0' broadcast"].latency_only and "one size (1048576 B)" in by_type["'0' broadcast"].note
    assert by_type["'0' all_reduce"].bandwidth_gbps == pytest.approx(BW, rel=0.05)


def test_the_transfers_fitted_are_the_recorded_ones_less_the_wait_for_the_last_member(
    synthetic: tuple[Path, int, int],
) -> None:
    run_dir, transfer, _wait = synthetic
    transfers, skipped = recorded_transfers(load_validated(run_dir))
    assert skipped == 0
    assert sum(t.transfer_ns for t in transfers) == transfer
    assert [(t.type_name, t.nbytes) for t in transfers] == [(ty.name.lower(), s) for _pg, ty, s in SCHEDULE]


def two_level_run(
    tmp_path: Path, transfer_ns: Callable[[str, CommType, int], float], *, repeats: int, noise: float
) -> Path:
    """8 ranks, 4 per node: all_reduces of three sizes on the world group "0" (both levels) and on the two
    node groups "1", "2" (the inner level only), ``repeats`` times, timed by ``transfer_ns``."""
    groups = {"0": tuple(range(8)), "1": (0, 1, 2, 3), "2": (4, 5, 6, 7)}
    schedule = [
        (pg, AR, size)
        for _ in range(repeats)
        for size in (16 * KIB, 1 * MIB, 16 * MIB)
        for pg in ("0", "1", "2")
    ]
    run_dir, _t, _w = build_run(
        tmp_path / "run", world=8, groups=groups, schedule=schedule, transfer_ns=transfer_ns, noise=noise
    )
    return run_dir


def two_level_base(links: int = 0) -> Topology:
    """The base the two-level calibrations fit: nodes of 4 (a switch) on a fat tree of 2 nodes."""
    return Topology(
        name="two_level",
        dims=(
            Dimension(kind="switch", size=4, bandwidth_gbps=1.0, latency_ns=1),
            Dimension(kind="fat_tree", size=2, bandwidth_gbps=1.0, latency_ns=1, links_per_node=links),
        ),
    )


def test_a_hierarchical_calibration_fits_each_link_class_of_a_two_level_topology(tmp_path: Path) -> None:
    # 8 ranks, 4 per node: the world group crosses both levels (hierarchical: ring reduce-scatter and
    # all-gather in the node, ring all_reduce of S/p0 between nodes), the node groups only the inner one
    a0, b0, a1, b1 = 3_000.0, 20.0, 15_000.0, 6.0

    def closed_form(pg: str, _ty: CommType, s: int) -> float:
        if pg != "0":
            return 2 * 3 * (a0 + s / (4 * b0))
        return 2 * 3 * (a0 + s / (4 * b0)) + 2 * 1 * (a1 + s / (8 * b1))

    run_dir = two_level_run(tmp_path, closed_form, repeats=2, noise=0.01)
    cal = calibrate(load_validated(run_dir), base=two_level_base(), algorithm="hierarchical")
    inner, outer = cal.topology.dims
    assert inner.latency_ns == pytest.approx(a0, rel=0.05)
    assert inner.bandwidth_gbps == pytest.approx(b0, rel=0.05)
    assert outer.latency_ns == pytest.approx(a1, rel=0.05)
    assert outer.bandwidth_gbps == pytest.approx(b1, rel=0.05)
    assert [f.label for f in cal.links] == ["dim 0 (switch)", "dim 1 (fat_tree)"]
    assert cal.links[0].groups == ("0", "1", "2") and cal.links[1].groups == ("0",)


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_a_calibration_of_transfers_the_replays_model_timed_gives_back_the_latency_and_bandwidth_it_used(
    tmp_path: Path, algorithm: str
) -> None:
    # the transfers are the model's own (ModelTiming, no noise), not the closed forms written out above: the
    # fit inverts the model the replay runs; what a real capture's calibrated replay gives is a figure of
    # benchmarks/fidelity.py ("calibrated sim error"), not an assertion
    a0, b0, a1, b1 = 3_000.0, 20.0, 15_000.0, 6.0
    truth = two_level_base()
    truth = dataclasses.replace(
        truth,
        dims=(
            dataclasses.replace(truth.dims[0], latency_ns=round(a0), bandwidth_gbps=b0),
            dataclasses.replace(truth.dims[1], latency_ns=round(a1), bandwidth_gbps=b1),
        ),
    )
    groups = {"0": tuple(range(8)), "1": (0, 1, 2, 3), "2": (4, 5, 6, 7)}
    timing = ModelTiming(truth.sized(8), algorithm=algorithm)

    def modelled(pg: str, ty: CommType, s: int) -> float:
        members = groups[pg]
        return timing.collective_time_ns(ty, message_bytes(ty, s, len(members)), members)

    run_dir = two_level_run(tmp_path, modelled, repeats=1, noise=0.0)
    cal = calibrate(load_validated(run_dir), base=two_level_base(), algorithm=algorithm)
    inner, outer = cal.topology.dims
    assert inner.latency_ns == pytest.approx(a0, abs=2) and outer.latency_ns == pytest.approx(a1, abs=2)
    assert inner.bandwidth_gbps == pytest.approx(b0, rel=1e-3)
    assert outer.bandwidth_gbps == pytest.approx(b1, rel=1e-3)
    assert all(f.p90_residual < 1e-3 for f in cal.links)


def test_the_written_entrys_calibrated_r2_is_its_worst_link_fit(tmp_path: Path) -> None:
    # the two-level run above with 20% noise: each link class fits with its own R², the entry keeps the lower
    a0, b0, a1, b1 = 3_000.0, 20.0, 15_000.0, 6.0

    def closed_form(pg: str, _ty: CommType, s: int) -> float:
        inner = 2 * 3 * (a0 + s / (4 * b0))
        return inner if pg != "0" else inner + 2 * 1 * (a1 + s / (8 * b1))

    run_dir = two_level_run(tmp_path, closed_form, repeats=2, noise=0.2)
    cal = calibrate(load_validated(run_dir), base=two_level_base(), algorithm="hierarchical")
    inner, outer = (f.r2 for f in cal.links)
    assert inner != outer
    cfg = load_topology_entry(str(write_topology(cal, tmp_path / "cal.yaml")))
    assert cfg.calibrated_r2 == min(inner, outer)


@pytest.mark.parametrize(("links", "written"), [(1, 1), (0, 4)])
def test_a_calibration_fits_one_links_bandwidth_and_writes_the_bases_links_per_node(
    tmp_path: Path, links: int, written: int
) -> None:
    # 8 ranks, 4 per node; with one link per node the 4 inter-node rings of the hierarchical all_reduce
    # each get a quarter of it, with one per rank (the default, written out resolved: 4) a whole link
    a0, b0, a1, b1 = 3_000.0, 20.0, 15_000.0, 6.0
    share = 4 if links == 1 else 1

    def closed_form(pg: str, _ty: CommType, s: int) -> float:
        intra = 2 * 3 * (a0 + s / (4 * b0))
        return intra if pg != "0" else intra + 2 * 1 * (a1 + s / (8 * (b1 / share)))

    run_dir = two_level_run(tmp_path, closed_form, repeats=1, noise=0.0)
    cal = calibrate(load_validated(run_dir), base=two_level_base(links), algorithm="hierarchical")
    assert cal.topology.dims[1].bandwidth_gbps == pytest.approx(b1, rel=1e-3)
    out = tmp_path / "cal.yaml"
    write_topology(cal, out)
    assert f"    links_per_node: {written}\n" in out.read_text()
    cfg = load_topology_entry(str(out))
    assert cfg.dims[1].links_per_node == written
    assert cfg.to_topology().links_per_node(1) == cal.topology.links_per_node(1)


def test_the_written_entry_loads_with_the_replay_schema_and_replays_the_fitted_transfers(
    synthetic: tuple[Path, int, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _t, _w = synthetic
    out = tmp_path / "cal.yaml"
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    said = capsys.readouterr()
    printed = said.out
    assert "dim 0 (switch)" in printed and "'0' all_gather" in printed
    assert "warning" not in said.err  # a good fit (R² near 1, residuals of 2%)
    assert f"{ALPHA_NS / 1e3:.0f}." in printed  # α in µs, e.g. 25.0
    cfg = load_topology_entry(str(out))
    assert cfg.name == "cal" and cfg.algorithm == "ring"
    (dim,) = cfg.dims
    assert dim.latency_ns == pytest.approx(ALPHA_NS, rel=0.05)
    assert dim.bandwidth_gbps == pytest.approx(BW, rel=0.05)
    assert not list(tmp_path.glob(".cal.yaml.*"))  # the temporary file was renamed into place
    # skewlens replay finds the entry by its path
    rc = skewlens_main(["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", f"topology={out}", *MODEL])
    assert rc == 0
    written = (tmp_path / "o" / "config.yaml").read_text()
    assert "name: cal" in written and f"latency_ns: {cfg.dims[0].latency_ns}" in written


def test_a_modelled_replay_on_the_calibrated_topology_keeps_the_recorded_transfer_times(
    synthetic: tuple[Path, int, int],
) -> None:
    run_dir, _t, _w = synthetic
    run = load_validated(run_dir)
    cal = calibrate(run)
    sim = simulate(run, topology=cal.topology, comm_mode="model", algorithm=cal.algorithm)
    modelled = (sim.coll_end_ns - sim.coll_arrival_ns).tolist()
    recorded = [t.transfer_ns for t in cal.transfers]
    rel = sorted(abs(m - r) / r for m, r in zip(modelled, recorded, strict=True))
    assert rel[len(rel) // 2] < 0.03 and rel[-2] < 0.05  # all but the one outlier


def test_transfers_that_do_not_grow_with_size_are_fitted_as_latency_with_a_note(tmp_path: Path) -> None:
    run_dir, _t, _w = build_run(
        tmp_path / "run",
        world=2,
        groups={"0": (0, 1)},
        schedule=[("0", AR, s) for s in (4 * KIB, 1 * MIB, 16 * MIB)] * 2,
        transfer_ns=lambda *_: 400_000.0,
        noise=0.0,
    )
    cal = calibrate(load_validated(run_dir))
    (link,) = cal.links
    assert link.bandwidth_gbps == MAX_BANDWIDTH_GBPS
    assert "do not grow with size" in link.note
    assert 2 * link.latency_ns == pytest.approx(400_000, rel=0.01)  # ring all_reduce on 2 ranks: 2α + S/B


def test_a_group_of_one_size_faster_than_its_links_bandwidth_allows_gets_its_latency_pinned_to_0(
    tmp_path: Path,
) -> None:
    # group "tp" all_gathers 1 MiB in 1 µs; its link class (fitted on these transfers, "0"'s all_reduces of
    # three sizes at 12 GB/s among them: over 12 GB/s but well under 1,000) moves 1 MiB in over 1 µs (ring
    # all_gather on 2 ranks: α + S/B), so its latency alone comes out negative
    run_dir, _t, _w = build_run(
        tmp_path / "run",
        world=2,
        groups={"0": (0, 1), "tp": (0, 1)},
        schedule=[("0", AR, s) for s in (4 * KIB, 1 * MIB, 16 * MIB)] * 2 + [("tp", AG, 1 * MIB)] * 3,
        transfer_ns=lambda pg, ty, s: 1_000.0 if pg == "tp" else ring_ns(ty, s, 2, ALPHA_NS, BW),
        noise=0.0,
    )
    tp = next(f for f in calibrate(load_validated(run_dir)).groups if f.groups == ("tp",))
    assert tp.latency_only and tp.latency_ns == 0.0


def _poorly_fitted_run(tmp_path: Path) -> Path:
    """2 ranks whose all_reduces take 2 ms whatever their size, timed with 40% noise: a fit of R² near 0."""
    run_dir, _t, _w = build_run(
        tmp_path / "run",
        world=2,
        groups={"0": (0, 1)},
        schedule=[("0", AR, s) for s in (4 * KIB, 1 * MIB, 4 * MIB, 16 * MIB)] * 3,
        transfer_ns=lambda *_: 2_000_000.0,
        noise=0.4,
    )
    return run_dir


def _run_with_an_untraced_group(tmp_path: Path) -> Path:
    """2 ranks fitted on group 0, and a group 'w' of 3 whose rank 2 has no trace (a warning)."""
    b = RunBuilder(3, groups={"0": (0, 1), "w": (0, 1, 2)})  # rank 2 has no trace
    for r in (0, 1):
        s = b.rank(r).step(0)
        for k, size in enumerate((4 * KIB, 1 * MIB, 4 * MIB)):
            s.collective(AR, size, 300_000 + size // 40, pg="0", start_ns=k * 2_000_000)
        s.collective(AR, 4 * KIB, 300_000, pg="w", start_ns=10_000_000)
    return b.write(tmp_path / "run")


def test_a_group_calibrate_leaves_out_is_a_warning_on_stderr_and_stdout_holds_the_fit_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 'group 'w' left out: ...' was a line on stdout between the table and 'wrote ...', in a script's out.txt
    run_dir = _run_with_an_untraced_group(tmp_path)
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(tmp_path / "c.yaml"), "--no-progress"]) == 0
    said = capsys.readouterr()
    why = "2 of its 3 ranks have a trace, so its transfers cannot be told from waits for the others"
    assert said.err.splitlines() == [f"skewlens calibrate: warning: group 'w' left out: {why}"]
    assert "left out" not in said.out
    assert f"wrote {tmp_path / 'c.yaml'}" in " ".join(said.out.split())  # as wrapped to the terminal


def test_calibrate_whose_stderr_reader_went_away_still_writes_its_out_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # its warnings went to stderr with print: a closed pipe there (2> >(head -0)) ended it with 141 before
    # it wrote --out
    import io
    import sys

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

        def flush(self) -> None:
            raise BrokenPipeError

    run_dir = _run_with_an_untraced_group(tmp_path)
    monkeypatch.setattr(sys, "stderr", Gone())
    out = tmp_path / "c.yaml"
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    assert out.is_file()
    assert f"wrote {out}" in " ".join(capsys.readouterr().out.split())


def test_calibrates_warnings_show_control_characters_as_replacement_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # its warnings were printed as they were, unlike every other command's: an ESC reached the terminal
    monkeypatch.setattr("skewlens.cli.calibrate.poor_fits", lambda _cal: ["dim 0 (\x1b]0;pwned\x07): poor"])
    run_dir = _poorly_fitted_run(tmp_path)
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(tmp_path / "c.yaml"), "--no-progress"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "skewlens calibrate: warning: dim 0 (\ufffd]0;pwned\ufffd): poor"
    ]


def test_an_extrapolation_on_a_poorly_fitted_topology_of_fewer_ranks_says_what_its_latency_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a 2-rank gloo capture fitted a 2.3 ms "latency" (R2 0.02): at scale.dp=1024 a ring paid it 2046 times,
    # 4,760 ms a step, without a word
    run_dir = _poorly_fitted_run(tmp_path)
    out = tmp_path / "cal.yaml"
    write_topology(calibrate(load_validated(run_dir)), out)
    cfg = load_topology_entry(str(out))
    assert cfg.calibrated_ranks == 2 and cfg.calibrated_r2 < 0.5
    args = ["replay", f"trace={run_dir}", f"topology={out}", *MODEL]
    assert skewlens_main([*args, f"out={tmp_path / 'o'}", "scale.dp=64"]) == 0
    said = capsys.readouterr().err  # a warning, on stderr
    r2 = f"{cfg.calibrated_r2:.2f}"
    head = f"skewlens replay: warning: topology {cfg.name} was calibrated on transfers of at most 2 ranks"
    assert f"{head} with R² {r2}" in said
    assert "at 64 ranks" in said
    assert skewlens_main([*args, f"out={tmp_path / 'o2'}"]) == 0
    assert "was calibrated on" not in capsys.readouterr().err  # its own size: what it was fitted to
    assert skewlens_main([*args, f"out={tmp_path / 'o3'}", "scale.dp=2"]) == 0
    assert "was calibrated on" not in capsys.readouterr().err  # extrapolated to the size it was fitted on


def test_a_fit_that_explains_little_is_written_with_a_warning_that_replays_on_it_will_be_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a small CPU run fitted R² 0.160, median residual 251%: the file was written and "replay with: ..."
    # printed without a word; its bandwidth was printed 1e+04, and the caption said "bold: written" in a pipe
    run_dir = _poorly_fitted_run(tmp_path)
    out = tmp_path / "cal.yaml"
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    said = capsys.readouterr()
    cal = calibrate(load_validated(run_dir))
    (link,) = cal.links
    assert f"{link.r2:.2f}" == "-0.02" and link.median_residual < 0.5
    because = (
        "so replays with this topology (comm_mode=model) will time transfers off by about that much; few "
        "transfers or message sizes, and noisy timing (a short capture, gloo on shared CPU cores), cause it: "
        "calibrate from a longer capture with more message sizes, on the network to model"
    )
    head = "skewlens calibrate: warning: dim 0 (switch): the fit explains little of its 12 transfers"
    assert said.err.splitlines() == [f"{head} (R² -0.02 < 0.5), {because}"]
    # a median residual over 50% is the other sign of it
    worse = dataclasses.replace(cal, links=(dataclasses.replace(link, r2=0.9, median_residual=2.51),))
    assert poor_fits(worse) == [
        f"dim 0 (switch): the fit explains little of its 12 transfers (median residual 251% > 50%), {because}"
    ]
    assert out.is_file()
    printed = " ".join(said.out.split())
    assert re.search(r"│ +10000 │", said.out) and "e+0" not in said.out  # MAX_BANDWIDTH_GBPS, in plain digits
    assert "bold" not in printed
    assert (
        "above the line: per link class, written to the topology; below it: per group and type, each "
        "fitted on its own (not written); res: |recorded − model| / recorded" in printed
    )


def test_a_bandwidth_is_printed_in_plain_digits_with_four_significant_figures() -> None:
    from skewlens.cli.calibrate import plain_number

    said = [plain_number(x) for x in (10_000.0, 12.3456, 0.0123456, 1234.5, 0.5)]
    assert said == ["10000", "12.35", "0.01235", "1234", "0.5"]


def test_a_run_whose_groups_have_members_without_a_trace_is_refused_for_that_reason(tmp_path: Path) -> None:
    # one traced rank of a 2-GPU trace was told "every transfer stays inside one unit of topology ...,
    # give a base topology whose innermost dimension separates the ranks", which cannot help
    b = RunBuilder(world_size=2)
    for s in (4 * KIB, 1 * MIB):
        b.rank(0).compute("aten::mm", dur_ns=1_000_000)
        b.rank(0).collective(AR, s, dur_ns=1_000_000)
    run_dir = b.write(tmp_path / "run")
    (run_dir / "rank-1.et").unlink(missing_ok=True)
    m = read_manifest(run_dir)
    write_manifest(run_dir, dataclasses.replace(m, ranks=(0,), missing_ranks=(1,)))
    with pytest.raises(CalibrationError, match=r"every collective has members without a trace \('0': 1 of 2"):
        calibrate(load_run(run_dir))


def test_transfers_of_one_effective_size_on_one_link_are_refused_for_that_reason(tmp_path: Path) -> None:
    # FSDP2's all_gather of 2 x 131,584 B and reduce_scatter of 263,168 B were told to "calibrate with a base
    # topology of fewer dimensions", though the default base has one
    rs = CommType.REDUCE_SCATTER
    run_dir, _t, _w = build_run(
        tmp_path / "run",
        world=2,
        groups={"0": (0, 1)},
        schedule=[("0", AG, 131_584), ("0", rs, 263_168)] * 4,
        transfer_ns=lambda _pg, ty, size: ring_ns(ty, size, 2, ALPHA_NS, BW),
    )
    with pytest.raises(CalibrationError, match=r"one message size per link once the algorithm's steps"):
        calibrate(load_validated(run_dir))


def test_a_run_without_collectives_is_an_error_naming_it(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).compute("aten::mm", dur_ns=1_000_000)
    run_dir = b.write(tmp_path / "run")
    with pytest.raises(CalibrationError, match="no matched collectives or send/recv pairs") as e:
        calibrate(load_validated(run_dir))
    assert str(run_dir) in str(e.value)


def test_a_group_with_one_message_size_is_an_error_naming_the_group(tmp_path: Path) -> None:
    run_dir, _t, _w = build_run(
        tmp_path / "run",
        world=2,
        groups={"0": (0, 1), "tp": (0, 1)},
        schedule=[("tp", AG, 1 * MIB)] * 4,
        transfer_ns=lambda _pg, ty, s: ring_ns(ty, s, 2, ALPHA_NS, BW),
    )
    with pytest.raises(CalibrationError, match=r"group 'tp' \(all_gather\).*the same size \(1048576 B\)"):
        calibrate(load_validated(run_dir))


def test_a_bad_run_path_or_topology_is_a_one_line_error_naming_it(
    synthetic: tuple[Path, int, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _t, _w = synthetic
    out = ["--out", str(tmp_path / "a.yaml")]
    cases = [
        (["calibrate", str(tmp_path / "nowhere"), *out], str(tmp_path / "nowhere")),
        (["calibrate", str(run_dir), *out, "--topology", "no_such"], "no_such"),
        (["calibrate", str(run_dir), *out, "--topology", "x/missing.yaml"], "x/missing.yaml"),
        (["calibrate", str(run_dir), "--out", str(tmp_path)], "is a directory"),
        (["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", "topology=/no/such.yaml"], "/no/such.yaml"),
    ]
    for argv, named in cases:
        assert skewlens_main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], (argv, err)
    assert not (tmp_path / "a.yaml").exists()


def test_a_base_topology_file_reads_as_the_replay_reads_it(tmp_path: Path) -> None:
    typo = tmp_path / "typo.yaml"  # was "typo.yaml: Key 'bandwith_gbps' not in 'DimensionConfig'"
    typo.write_text("name: t\ndims:\n  - {kind: switch, bandwith_gbps: 5.0, latency_ns: 1000}\n")
    with pytest.raises(ConfigError) as e:
        load_topology_entry(str(typo))
    assert str(e.value) == (
        f"{typo}: topology.dims[0]: unknown key 'bandwith_gbps' (did you mean 'bandwidth_gbps'?)"
    )
    units = tmp_path / "units.yaml"  # was "units.yaml: Value '3.5' of type 'float' ...", no key
    units.write_text("name: t\ndims:\n  - {kind: switch, bandwidth_gbps: 5.0, latency_ns: 3.5}\n")
    with pytest.raises(ConfigError) as e:
        load_topology_entry(str(units))
    assert str(e.value) == (
        f"{units}: topology.dims[0].latency_ns: Value '3.5' of type 'float' could not be converted to Integer"
    )
    noname = tmp_path / "mytopo.yaml"  # was "... has missing mandatory value: name"
    noname.write_text("dims:\n  - {kind: switch, bandwidth_gbps: 5.0, latency_ns: 1000}\n")
    assert load_topology_entry(str(noname)).name == "mytopo"


def test_a_topology_file_named_like_a_bundled_entry_is_still_the_file(
    synthetic: tuple[Path, int, int], tmp_path: Path
) -> None:
    run_dir, _t, _w = synthetic
    cal = calibrate(load_validated(run_dir))
    path = write_topology(cal, tmp_path / "switch.yaml", name="mine")
    rc = skewlens_main(["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", f"topology={path}", *MODEL])
    assert rc == 0
    assert "name: mine" in (tmp_path / "o" / "config.yaml").read_text()


@pytest.mark.slow
def test_a_real_captures_calibrated_topology_loads_with_a_positive_fit_and_replays_every_rank_step(
    tmp_path: Path,
) -> None:
    # how close the replay on it comes to the recorded step time is a figure of benchmarks/fidelity.py
    # ("calibrated sim error"), not an assertion here: under load the capture's own steps move by 10%
    if not EXAMPLE.is_file() or importlib.util.find_spec("skewlens.profiler.capture") is None:
        pytest.skip("capture (profiler/capture, examples/train.py) is not available")
    run_dir = tmp_path / "run"
    res = profile(run_dir, "--steps", "12", steps="1:1:10", nproc=2)  # 10 steps: 70 transfers
    assert res.returncode == 0, res.stderr[-2000:]
    out = tmp_path / "cal.yaml"
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    cfg = load_topology_entry(str(out))
    (dim,) = cfg.dims
    assert 0 < dim.latency_ns < 1_000_000_000 and dim.kind == "switch"
    assert math.isfinite(dim.bandwidth_gbps) and 0 < dim.bandwidth_gbps <= MAX_BANDWIDTH_GBPS
    run = load_validated(run_dir)
    sim = simulate(run, topology=cfg.to_topology(), comm_mode="model", algorithm=cfg.algorithm)
    transfers = sim.coll_end_ns - sim.coll_arrival_ns
    assert len(transfers) > 0 and (transfers > 0).all()  # every collective timed by the fitted model
    rows = summarize(run, sim)
    assert sorted((r.rank, r.step) for r in rows) == sorted((s.rank, s.step) for s in run.manifest.steps)
    assert len(rows) == 2 * 10 and all(r.step_time_ns > 0 for r in rows)


@pytest.mark.parametrize(
    "value", ["/tmp/run", "/tmp/a b", "run ☃", "it's", "a=b,c", "back\\slash", "end\\", "q\\'x", "${x}"]
)
def test_the_printed_replay_command_gives_hydra_the_path_back_whatever_its_characters(value: str) -> None:
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from skewlens.cli.calibrate import override

    (word,) = shlex.split(override("trace", value))
    (parsed,) = OverridesParser.create().parse_overrides([word])
    assert (parsed.key_or_group, parsed.value()) == ("trace", value)


def test_a_bare_topology_name_that_is_a_file_here_and_no_entry_is_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skewlens.cli.calibrate import topology_entry_path

    monkeypatch.chdir(tmp_path)
    Path("mynet").write_text("name: mynet\n")
    assert topology_entry_path("mynet") == Path("mynet")
    assert topology_entry_path("ring").name == "ring.yaml"  # an entry still wins


def test_an_instances_transfer_ends_with_its_last_member_to_finish(tmp_path: Path) -> None:
    # both arrive at 1 us; rank 0 is done 5 us later, rank 1 3 us later: the transfer is the latest, 5 us
    b = RunBuilder(world_size=2)
    for r, dur in ((0, 5_000), (1, 3_000)):
        b.rank(r).compute("aten::mm", dur_ns=1_000, start_ns=0)
        b.rank(r).collective(AR, comm_bytes=MIB, dur_ns=dur, start_ns=1_000)
    (t,), skipped = recorded_transfers(load_validated(b.write(tmp_path / "run")))
    assert (t.transfer_ns, skipped) == (5_000, 0)


def test_a_transfer_three_times_the_models_is_a_residual_of_two_thirds_of_its_recorded_time(
    tmp_path: Path,
) -> None:
    # three of 21 transfers inflated x3 (down-weighted, the fit follows the others): |3T − T| / 3T = 2/3,
    # residuals being relative to the recorded time; p90 of 21 is the 19th smallest, the lowest of the three
    run_dir, _t, _w = build_run(
        tmp_path / "run",
        world=4,
        groups={"0": (0, 1, 2, 3)},
        schedule=SCHEDULE,
        transfer_ns=lambda _pg, ty, size: ring_ns(ty, size, 4, ALPHA_NS, BW),
        noise=0.001,
        outliers=(1, 9, 19),
    )
    (link,) = calibrate(load_validated(run_dir)).links
    assert link.p90_residual == pytest.approx(2 / 3, abs=0.01)


def test_an_out_that_cannot_be_written_is_refused_before_the_fit(
    synthetic: tuple[Path, int, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _t, _w = synthetic
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "cal.yaml"
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(out)]) == 2
    got = capsys.readouterr()
    # it loaded the run and fitted it (its table printed), then said "cannot write ...: Not a directory"
    assert got.out == ""
    assert got.err == f"skewlens calibrate: error: cannot write {out}: {blocker} is not a directory\n"


def test_a_reader_that_goes_away_does_not_stop_calibrate_writing_its_topology(
    synthetic: tuple[Path, int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `skewlens calibrate RUN --out cal.yaml | head -3`: rich ended the command at the fit table's print,
    # exit code 1 and not a word, before cal.yaml was written
    run_dir, _t, _w = synthetic
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as closed:
        monkeypatch.setattr("sys.stdout", closed)
        out = tmp_path / "cal.yaml"
        assert skewlens_main(["calibrate", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    assert load_topology_entry(str(out)).name == "cal"


def test_the_replay_command_calibrate_prints_is_one_line_on_a_narrow_terminal(
    synthetic: tuple[Path, int, int],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # at 40 columns rich broke the command, and the path in it, across lines: a copy of it did not run
    run_dir, _t, _w = synthetic
    monkeypatch.setenv("COLUMNS", "40")
    out = tmp_path / "a_directory_name_longer_than_the_terminal_is_wide" / "cal.yaml"
    out.parent.mkdir()
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    (line,) = [s for s in capsys.readouterr().out.splitlines() if s.startswith("wrote ")]
    assert line == (
        f"wrote {out}; replay with: skewlens replay trace={run_dir} out=OUT topology={out} comm_mode=model"
    )


def test_the_replay_command_calibrate_prints_for_a_path_with_a_space_runs_as_printed(
    synthetic: tuple[Path, int, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it printed "topology='my cal/cal.yaml'" (quoted for Hydra), and skewlens replay took the quotes for
    # part of the path: "topology='my cal/cal.yaml': no such file"
    import shlex

    run_dir, _t, _w = synthetic
    out = tmp_path / "my cal" / "cal.yaml"
    out.parent.mkdir()
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    (line,) = [s for s in capsys.readouterr().out.splitlines() if s.startswith("wrote ")]
    command = shlex.split(line.partition("replay with: ")[2])
    assert f"topology='{out}'" in command
    replay = [f"out={tmp_path / 'o'}" if a == "out=OUT" else a for a in command[1:]]
    assert skewlens_main(replay) == 0
    assert "name: cal" in (tmp_path / "o" / "config.yaml").read_text()


def test_the_written_entry_names_the_run_by_its_absolute_path_where_it_was_given_a_relative_one(
    synthetic: tuple[Path, int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one run calibrated from two directories writes one file
    monkeypatch.chdir(tmp_path)
    cal = calibrate(load_validated("run"))
    first = write_topology(cal, tmp_path / "cal.yaml").read_text(encoding="utf-8").splitlines()[0]
    assert f" from {(tmp_path / 'run').resolve()}: " in first


def test_a_calibration_on_a_base_of_as_many_round_robin_nodes_as_needed_places_the_ranks_as_the_replay(
    tmp_path: Path,
) -> None:
    # nodes of 4 as many as the run needs, ranks dealt round_robin: the even ranks share node 0, the odd node
    # 1, so the groups of the even and of the odd ranks cross the inner level only; unsized, every rank was
    # on a node of its own and every group crossed the outer one
    a0, b0, a1, b1 = 3_000.0, 20.0, 15_000.0, 6.0

    def closed_form(pg: str, _ty: CommType, s: int) -> float:
        if pg != "0":
            return 2 * 3 * (a0 + s / (4 * b0))
        return 2 * 3 * (a0 + s / (4 * b0)) + 2 * 1 * (a1 + s / (8 * b1))

    groups = {"0": tuple(range(8)), "1": (0, 2, 4, 6), "2": (1, 3, 5, 7)}
    schedule = [(pg, AR, size) for _ in range(2) for size in (16 * KIB, 1 * MIB, 16 * MIB) for pg in groups]
    run_dir, _t, _w = build_run(
        tmp_path / "run", world=8, groups=groups, schedule=schedule, transfer_ns=closed_form, noise=0.01
    )
    base = dataclasses.replace(two_level_base(), placement="round_robin")
    base = dataclasses.replace(base, dims=(base.dims[0], dataclasses.replace(base.dims[1], size=0)))
    cal = calibrate(load_validated(run_dir), base=base, algorithm="hierarchical")
    inner, outer = cal.topology.dims
    assert inner.latency_ns == pytest.approx(a0, rel=0.05)
    assert inner.bandwidth_gbps == pytest.approx(b0, rel=0.05)
    assert outer.latency_ns == pytest.approx(a1, rel=0.05)
    assert outer.bandwidth_gbps == pytest.approx(b1, rel=0.05)
    assert outer.size == 0  # the entry written keeps its base's "as many as needed"
    assert cal.links[0].groups == ("0", "1", "2") and cal.links[1].groups == ("0",)
    # and the fit explains the transfers it was given, each within the 1% noise
    assert all(f.median_residual < 0.02 and f.p90_residual < 0.03 for f in (*cal.links, *cal.groups))


def test_an_empty_all_reduce_is_no_transfer_to_fit_and_an_empty_broadcast_is(tmp_path: Path) -> None:
    # the empty all_reduce's 50 us is the call's own time (gloo returns at once, waiting for no one); the
    # model costs it 0 whatever the link, so fitting it would only add a residual of 100%
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).compute("aten::mm", dur_ns=1_000, start_ns=0)
        b.rank(r).collective(AR, comm_bytes=0, dur_ns=50_000, start_ns=1_000)
        b.rank(r).collective(CommType.BROADCAST, comm_bytes=0, dur_ns=7_000, start_ns=60_000)
    (t,), skipped = recorded_transfers(load_validated(b.write(tmp_path / "run")))
    assert (t.comm_type, t.transfer_ns, skipped) == (CommType.BROADCAST, 7_000, 1)


def test_the_fit_tables_title_names_a_long_run_path_on_one_line_in_a_wide_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # rich wrapped the title to the table's 80 columns: in a CI log 160 wide the run's path was broken in
    # two ('.../a_rather_long_run_directory_name_for_the_demo' / '_run_x: 55 transfers')
    deep = tmp_path / ("a_run_directory_name_longer_than_the_fit_table_" * 2)
    run_dir = _run_with_an_untraced_group(deep)
    monkeypatch.setenv("COLUMNS", "200")
    assert skewlens_main(["calibrate", str(run_dir), "--out", str(tmp_path / "c.yaml"), "--no-progress"]) == 0
    title = next(line for line in capsys.readouterr().out.splitlines() if "Calibration" in line)
    assert f"from {run_dir}: " in title
