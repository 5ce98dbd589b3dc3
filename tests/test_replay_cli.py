"""``skewlens replay``: config groups compose and validate, outputs are written, errors are one line."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from user_docs import ROOT, code_lines

from skewlens.cli import main as skewlens_main
from skewlens.cli.replay import (
    _GROUP_KEY_EXAMPLES,
    CONF_DIR,
    GROUP_SCHEMAS,
    check_sweeper_params,
    check_types,
    register_configs,
    to_config,
    warn_group_overrides,
)
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.config import ReplayConfig
from skewlens.replay.errors import ConfigError
from skewlens.replay.outputs import ReplayedNodeRecord
from skewlens.replay.summary import SummaryRecord

TOPOLOGIES = sorted(p.stem for p in (CONF_DIR / "topology").glob("*.yaml"))
SLOWDOWNS = sorted(p.stem for p in (CONF_DIR / "slowdown").glob("*.yaml"))


def compose_replay(overrides: list[str]) -> ReplayConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="replay", overrides=["trace=/nowhere", "out=/nowhere", *overrides])
    return to_config(cfg)


def test_the_ready_made_entries_include_the_documented_ones() -> None:
    assert {"dgx_h100_8x", "two_node_ib", "ring", "switch"} <= set(TOPOLOGIES)
    assert {"straggler", "slow_link", "jitter", "none"} <= set(SLOWDOWNS)


#: The replay config's top-level keys: a code span made only of overrides of these is a replay setting.
REPLAY_FIELDS = dataclasses.fields(ReplayConfig)
REPLAY_KEYS = {f.name for f in REPLAY_FIELDS}
#: The docs' placeholders, as values.
PLACEHOLDERS = {"N": "8", "K": "0", "HOST0": "host0", "R": "1", "F": "0.5"}  # R, F: slow_gpu's rank, factor


def documented_overrides() -> list[tuple[str, bool, list[str]]]:
    """Each ``skewlens replay`` command line and each code span of replay settings in the user docs: (where,
    whether it is a whole command line, its overrides, trace and out left out, a sweep's first value)."""
    found: list[tuple[str, bool, list[str]]] = []
    for where, line in code_lines():
        command = re.search(r"skewlens replay (.*)", line.split("  #")[0])
        words = (command.group(1) if command else line).split()
        # a word in the shell's double quotes ("out='RP/run=a'": Hydra takes a value with = in it quoted)
        words = [w[1:-1] if len(w) > 1 and w[0] == w[-1] == '"' else w for w in words]
        overrides = [w.strip("'") for w in words if "=" in w and not w.startswith(("-", "hydra"))]
        roots = {o.partition("=")[0].split(".")[0] for o in overrides}
        if not overrides or (not command and (len(overrides) < len(words) or roots - REPLAY_KEYS)):
            continue
        sweep = "-m" in words
        kept = []
        for o in overrides:
            key, _, value = o.partition("=")
            value = value.split(",")[0] if sweep and not value.startswith("[") else value
            value = PLACEHOLDERS.get(value, value).replace(",K,", ",0,").replace("HOST0", "host0")
            if key not in ("trace", "out"):
                kept.append(f"{key}={value}")
        found.append((where, bool(command), kept))
    return found


def test_every_replay_setting_the_docs_show_names_a_key_and_value_the_config_has() -> None:
    # what a newcomer copies: every command line composes into a valid config, every setting shown on its
    # own at least composes (a fragment such as scale.dp=N needs the rest of its line); the values the docs
    # show as wrong (abc, nokey) and a topology file (cal.yaml, written by skewlens calibrate) are left out
    found = documented_overrides()
    assert len(found) > 80 and sum(whole for _, whole, _ in found) > 20
    settings: dict[tuple[bool, tuple[str, ...]], str] = {}  # each distinct one once, where it is first
    by_line: dict[str, list[str]] = {}
    for where, whole, overrides in found:
        if any("abc" in o or "nokey" in o or o.endswith((".yaml", "=")) for o in overrides):
            continue
        if whole:
            settings.setdefault((True, tuple(overrides)), where)
        else:  # the settings of one table row or sentence go together (slowdown=stall ... every_step=true)
            by_line.setdefault(where, []).extend(overrides)
    for where, overrides in by_line.items():  # those a command line shows are checked with it
        if not any(set(overrides) <= set(line) for whole, line in settings if whole):
            settings.setdefault((False, tuple(overrides)), where)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for (whole, overrides), where in settings.items():
            try:
                cfg = compose(config_name="replay", overrides=["trace=/r", "out=/o", *overrides])
                if whole:
                    to_config(cfg)
            except Exception as e:
                raise AssertionError(f"{where}: {' '.join(overrides)}: {e}") from None


def test_the_entries_conf_readme_lists_for_each_group_are_the_groups_files() -> None:
    text = (ROOT / "conf" / "README.md").read_text(encoding="utf-8")
    for group in ("topology", "slowdown", "scale"):
        (row,) = re.findall(rf"^\| `{group}` \| (.*?) \|", text, re.M)
        listed = set(re.findall(r"`(\w+)`", row))
        assert listed == {p.stem for p in (CONF_DIR / group).glob("*.yaml")}, group


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_topology_entry_composes_into_a_valid_topology(topology: str) -> None:
    cfg = compose_replay([f"topology={topology}"])
    topo = cfg.topology.to_topology()
    assert topo.name == topology
    assert topo.coords(3)


@pytest.mark.parametrize("slowdown", SLOWDOWNS)
def test_every_slowdown_entry_composes_into_slowdown_items(slowdown: str) -> None:
    cfg = compose_replay([f"slowdown={slowdown}"])
    items = cfg.slowdown.to_items()
    assert cfg.slowdown.name == slowdown
    assert (items == []) == (slowdown == "none")


def test_slowdown_knobs_reach_the_items_through_interpolation() -> None:
    cfg = compose_replay(["slowdown=straggler", "slowdown.factor=1.25", "slowdown.rank=3"])
    (item,) = cfg.slowdown.to_items()
    assert (item.kind, item.factor, item.ranks) == ("compute", 1.25, (3,))


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ([], "replayed with transfers as recorded; no slowdown"),
        (
            ["slowdown=straggler", "slowdown.rank=3", "comm_mode=model", "topology=ring"],
            "replayed with topology ring; slowdown straggler: compute x1.5 on rank 3",
        ),
        (
            ["slowdown=slow_link", "comm_mode=model", "topology=switch"],
            "topology switch; slowdown slow_link: bandwidth x0.25, +20,000 ns latency on links 0-1",
        ),
        (
            ["slowdown=stall"],
            "replayed with transfers as recorded; slowdown stall: a 50 ms stall at the first step on rank 0",
        ),
        (
            ["slowdown=stall", "slowdown.step=3"],
            "replayed with transfers as recorded; slowdown stall: a 50 ms stall at step 3 on rank 0",
        ),
        (
            ["slowdown=stall", "slowdown.entries.0.every_step=true"],
            "replayed with transfers as recorded; slowdown stall: a 50 ms stall at every step on rank 0",
        ),
        (  # an hour: it said "a 3.6e+06 ms stall"
            ["slowdown=stall", "slowdown.delay_ms=3600000"],
            "slowdown stall: a 3,600,000 ms stall at the first step on rank 0",
        ),
        (
            ["slowdown=slow_send", "slowdown.delay_ms=1234567.000001"],
            "slowdown slow_send: +1,234,567.000001 ms before every send op on rank 1",
        ),
        (
            ["slowdown=slow_send", "+slowdown.entries.0.first_step=2"],
            "slowdown slow_send: +5 ms before every send op on rank 1 (steps 2..)",
        ),
        (  # entries of its own under the default preset, "none": not "slowdown none: ..."
            ["slowdown.entries=[{kind:compute,factor:0.5,device:host}]"],
            "replayed with transfers as recorded; slowdown compute x0.5 (host ops)",
        ),
        (["scale.dp=1", "comm_mode=model"], "no slowdown; as 1 data-parallel replica"),
        (["scale.dp=1024", "comm_mode=model"], "no slowdown; as 1,024 data-parallel replicas"),
    ],
)
def test_the_report_states_the_network_and_every_slowdown_replayed(overrides: list[str], line: str) -> None:
    from skewlens.cli.replay import scenario_line

    conf = compose_replay(overrides)
    assert scenario_line(conf, conf.slowdown.to_items()).endswith(line)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["scale.seed=abc"], "scale.seed=abc: Value 'abc' of type 'str' could not be converted to Integer"),
        (["scale.dp=null"], "scale.dp=null: field 'dp' is not Optional"),
        (["real.nproc=abc"], "real.nproc=abc: Value 'abc' of type 'str' could not be converted to Integer"),
        (
            ["real.launcher_args=abc"],
            "real.launcher_args=abc: Invalid value assigned: str is not a ListConfig",
        ),
        (
            ["topology.dims.0.bandwidth_gbps=abc"],
            "topology.dims.0.bandwidth_gbps=abc: Value 'abc' of type 'str' could not be converted to Float",
        ),
        (["topology.dims.0.latency_ns=1.5"], "topology.dims.0.latency_ns=1.5: Value '1.5' of type 'float'"),
        (["topology.contention=maybe"], "topology.contention=maybe: Value 'maybe' is not a valid bool"),
        (
            ["slowdown=straggler", "slowdown.entries.0.factor=abc"],
            "slowdown.entries.0.factor=abc: Value 'abc' of type 'str' could not be converted to Float",
        ),
        (
            ["slowdown.entries=[{kind:compute,factr:0.5}]"],
            (
                "slowdown.entries=[{kind:compute,factr:0.5}]: item 0: Key 'factr' not in "
                "'SlowdownItemConfig' (an item has kind, ranks, factor,"
            ),
        ),
        (
            ["+slowdown.entries=[{kind:compute,factor:2},{kind:compute,factor:abc}]"],
            (
                "+slowdown.entries=[{kind:compute,factor:2},{kind:compute,factor:abc}]: item 1: Value 'abc' "
                "of type 'str' could not be converted to Float"
            ),
        ),
        (["slowdown.entries=abc"], "slowdown.entries=abc: expected a list of {key:value,...} items"),
        (["scale=3"], "scale=3: no such entry (one of none)"),  # was a ValueError traceback from Hydra
        (["real=3"], "real=3: real holds settings (timeout_s, backend, nproc,"),
        (["topology.dims.0=3"], "topology.dims.0=3: topology.dims.0 holds settings (kind, size,"),
        (["scale.nokey=1"], "scale.nokey: no such setting (scale has dp, source, seed)"),
        (["nokey=1"], "nokey: no such setting (skewlens replay has trace, out, mode,"),
        (
            ["topology.dims.0.bandwith_gbps=5"],  # the settings listed, the likely one unsaid
            (
                "topology.dims.0.bandwith_gbps: no such setting (topology.dims.0 has kind, size, "
                "bandwidth_gbps, latency_ns, oversubscription, links_per_node; "
                "did you mean 'bandwidth_gbps'?)"
            ),
        ),
    ],
)
def test_a_value_not_of_its_settings_type_or_an_unknown_key_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], says: str
) -> None:
    # these were Hydra's six lines ("Error merging override ...", full_key, reference_type, ...): a setting
    # whose default is null, one under the topology group or a list, an unknown key
    args = ["replay", f"trace={tmp_path / 'run'}", f"out={tmp_path / 'out'}", "progress=false", *overrides]
    assert skewlens_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"skewlens replay: error: {says}"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        # Hydra's five lines, "Could not append to config. An item is already at 'slowdown.factor'. ..."
        (["+slowdown.factor=2"], "+slowdown.factor=2: slowdown.factor has a value already (+ adds a key"),
        (["+slowdown.entries.0.factor=2"], "+slowdown.entries.0.factor=2: slowdown.entries.0.factor has a"),
        # Hydra's six, "Error merging override ... list index out of range"
        (
            ["+slowdown.entries.1.factor=2"],
            "+slowdown.entries.1.factor: slowdown straggler has 1 item in slowdown.entries (numbered from 0)",
        ),
        # "Multiple values for slowdown. To override a value use 'override slowdown: stall'"
        (["+slowdown=stall"], "+slowdown=stall: replay.yaml chooses a slowdown already; give slowdown=stall"),
        (["+topology=ring"], "+topology=ring: replay.yaml chooses a topology already; give topology=ring"),
        (["++slowdown=stall"], "++slowdown=stall: a group's entry is chosen, not added: give slowdown=stall"),
        (["+hydra/launcher=joblib"], "+hydra/launcher=joblib: Hydra chooses a hydra/launcher already"),
        # every job of the sweep failed on it, one by one, after the launcher had started them
        (["-m", "+slowdown.factr=1,2"], "slowdown.factr: no such setting (slowdown has name, factor,"),
        (["-m", "++nokey=1,2"], "nokey: no such setting (skewlens replay has trace, out, mode,"),
    ],
)
def test_a_plus_override_hydra_would_refuse_or_every_job_would_fail_on_is_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], says: str
) -> None:
    args = ["replay", f"trace={tmp_path / 'run'}", f"out={tmp_path / 'out'}", "progress=false"]
    assert skewlens_main([*args, "slowdown=straggler", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"skewlens replay: error: {says}"), err
    assert not (tmp_path / "out").exists()


def test_a_plus_override_of_a_setting_that_may_be_null_is_taken() -> None:
    # Hydra appends where the value is null: a + there is no mistake to refuse
    conf = compose_replay(["slowdown=straggler", "+real.nproc=2", "+scale.seed=3"])
    assert (conf.real.nproc, conf.scale.seed) == (2, 3)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("mode=fast", "mode"),
        ("comm_mode=guess", "comm_mode"),
        ("topology.algorithm=magic", "topology.algorithm"),
        ("topology.dims.0.bandwidth_gbps=-1", "topology.dims[0].bandwidth_gbps"),
        ("real.timeout_s=0", "real.timeout_s"),
        ("real.timeout_s=inf", "real.timeout_s: must be a finite number > 0, got inf"),
        ("topology.contention=true", "contention"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        compose_replay([override])


def test_a_missing_required_value_names_the_key() -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="replay", overrides=["out=/x"])
    with pytest.raises(ConfigError, match="trace: missing value"):
        to_config(cfg)


def test_replay_writes_timeline_summary_perfetto_and_the_resolved_config(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    rc = skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "progress=false"])
    assert rc == 0
    timeline = pq.read_table(out / "timeline.parquet")
    assert {"replay_start_ns", "replay_end_ns", "node_id", "name"} <= set(timeline.column_names)
    assert set(timeline.column_names) == set(ReplayedNodeRecord.__dataclass_fields__)
    assert timeline.num_rows == sum(1 + 4 for _ in range(4))  # metadata + 2 x (compute + all_reduce)
    summary = pq.read_table(out / "summary.parquet").to_pylist()
    assert len(summary) == 4 * 2
    assert set(summary[0]) == set(SummaryRecord.__dataclass_fields__)
    # the straggler (rank 2, 1.5x) makes every rank's step longer than the recorded 2.6 ms
    assert min(r["step_time_ns"] for r in summary) > 2_600_000
    events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1, 2, 3}
    assert all(isinstance(e["ts"], float) for e in events if e["ph"] == "X")
    saved = OmegaConf.load(out / "config.yaml")
    assert saved.slowdown.entries[0].factor == 1.5
    assert saved.trace == str(run_dir)


def test_a_key_of_the_chosen_topology_can_be_set_on_the_command_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the documented `topology=dgx_h100_8x topology.algorithm=tree` ended in OmegaConf's AttributeError: the
    # type check looked the key up under the schema's MISSING topology
    out = tmp_path / "out"
    args = ["replay", f"trace={run_dir}", f"out={out}", "comm_mode=model", "progress=false", "perfetto=false"]
    rc = skewlens_main([*args, "topology=dgx_h100_8x", "topology.algorithm=tree", "topology.contention=true"])
    said = capsys.readouterr()  # the run's warnings (rank 3's no-end communication) go with it
    assert rc == 0, said.err
    saved = OmegaConf.load(out / "config.yaml")
    assert (saved.topology.name, saved.topology.algorithm, saved.topology.contention) == (
        "dgx_h100_8x",
        "tree",
        True,
    )
    rc = skewlens_main([*args, "topology=dgx_h100_8x", "topology.algorithm=magic"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "topology.algorithm" in err[0]


def test_a_replay_into_the_directory_of_an_earlier_one_leaves_none_of_its_outputs_behind(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false"]) == 0
    assert (out / "timeline.json").is_file()
    (out / "notes.txt").write_text("mine")
    args = ["slowdown=straggler", "perfetto=false", "progress=false"]
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", *args]) == 0
    # the earlier replay's timeline.json (no slowdown) would sit beside this one's tables
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml",
        "notes.txt",
        "summary.parquet",
        "timeline.parquet",
    ]
    assert OmegaConf.load(out / "config.yaml").slowdown.name == "straggler"


@pytest.mark.parametrize(
    ("override", "error"),
    [
        (
            "topology=nonexist",
            (
                "topology=nonexist: no such entry (one of dgx_h100_8x, fat_tree_oversub, fully_connected, "
                "ring, switch, two_node_ib; or a YAML file's path)"
            ),
        ),
        (
            "slowdown=straggler,nope",
            (
                "slowdown=nope: no such entry "
                "(one of host_idle, jitter, none, slow_gpu, slow_link, slow_send, stall, straggler)"
            ),
        ),
    ],
)
def test_an_unknown_topology_or_slowdown_entry_is_one_line_listing_the_entries(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, error: str
) -> None:
    rc = skewlens_main(["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", override])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()


#: What the refusal of a list of a group's entries says after the list.
ONE_ENTRY = (
    "takes one entry, not a list (Hydra would merge them into one, the last one's settings replacing the "
    "others')"
)


@pytest.mark.parametrize(
    ("override", "error"),
    [
        # Hydra merges a list into one entry, jitter's items under straggler's knobs: no straggler; the entry
        # check split it at its commas: 'slowdown=[straggler: no such entry'
        (
            "slowdown=[straggler,jitter]",
            (
                f"slowdown=[straggler,jitter]: slowdown {ONE_ENTRY}; give slowdown=straggler; to combine "
                "slowdowns, list their items in slowdown.entries"
            ),
        ),
        # was 'scale=[none]: no such entry (one of none)'
        ("scale=[none]", f"scale=[none]: scale {ONE_ENTRY}; give scale=none"),
        (
            "topology=switch,[ring,switch]",
            f"topology=switch,[ring,switch]: topology {ONE_ENTRY}; give topology=ring",
        ),
    ],
)
def test_a_list_of_a_groups_entries_is_one_line_saying_the_group_takes_one(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, error: str
) -> None:
    rc = skewlens_main(["replay", "-m", f"trace={run_dir}", f"out={tmp_path / 'o'}", override])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()


def test_an_out_that_cannot_be_a_directory_or_a_bad_topology_file_is_one_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text(": : :\n\t- [")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    typo = tmp_path / "typo.yaml"  # was Hydra's six lines around ConfigKeyError
    typo.write_text("name: t\ndims:\n  - {kind: switch, size: 0, bandwidth_gbs: 5.0, latency_ns: 1000}\n")
    for args, error in (
        ([f"out={afile}"], f"out={afile}: cannot be made a directory (File exists)"),
        (
            [f"out={afile / 'sub'}"],
            f"out={afile / 'sub'}: cannot be made a directory ({afile} is not a directory)",
        ),
        ([f"out={tmp_path / 'o'}", f"topology={bad_yaml}"], f"topology={bad_yaml}: not a YAML topology ("),
        ([f"out={tmp_path / 'o'}", f"topology={empty}"], f"topology={empty}: holds no topology"),
        (
            [f"out={tmp_path / 'o'}", f"topology={tmp_path}/"],
            f"topology={tmp_path}/: a directory; give a topology",
        ),
        (
            [f"out={tmp_path / 'o'}", f"topology={tmp_path / 'no.yaml'}"],
            f"topology={tmp_path / 'no.yaml'}: no such file",
        ),
        (
            [f"out={tmp_path / 'o'}", f"topology={typo}", "comm_mode=model"],
            f"topology={typo}: topology.dims[0]: unknown key 'bandwidth_gbs' (did you mean 'bandwidth_gbps'",
        ),
    ):
        assert skewlens_main(["replay", f"trace={run_dir}", *args]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"skewlens replay: error: {error}"), line
    assert not (tmp_path / "o").exists()


TWO_DIMS = (
    "name: mine\nalgorithm: hierarchical\ndims:\n"
    "  - {kind: switch, size: 2, bandwidth_gbps: 450.0, latency_ns: 700}\n"
    "  - {kind: fat_tree, size: 0, bandwidth_gbps: 50.0, latency_ns: 5000, links_per_node: 8}\n"
)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (  # was 'bandwith_gbps: Key 'bandwith_gbps' not in 'DimensionConfig'': no item, no hint
            "name: mine\ndims:\n  - kind: switch\n    bandwith_gbps: 50.0\n    latency_ns: 1000\n",
            "topology.dims[0]: unknown key 'bandwith_gbps' (did you mean 'bandwidth_gbps'?)",
        ),
        (  # was the key alone, checked once composed: which file it came from went unsaid
            "name: mine\ndims:\n  - {kind: switch, bandwidth_gbps: -50.0, latency_ns: 1000}\n",
            "topology.dims[0].bandwidth_gbps: must be > 0, got -50.0",
        ),
        ("name: mine\nlatncy: 3\ndims: []\n", "topology: unknown key 'latncy' (it has name, dims, "),
    ],
)
def test_a_bad_topology_file_is_one_line_naming_the_file_and_the_key(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, error: str
) -> None:
    topo = tmp_path / "mytopo.yaml"
    topo.write_text(text)
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", f"topology={topo}", "comm_mode=model"]
    assert skewlens_main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"skewlens replay: error: topology={topo}: {error}"), line
    assert not (tmp_path / "o").exists()


def test_a_sweep_over_a_bad_topology_file_is_refused_before_any_job_runs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 8 links on a node of 2 ranks: every job of it failed, after the others ran
    topo = tmp_path / "slots.yaml"
    topo.write_text(TWO_DIMS)
    out = tmp_path / "o"
    sweep = ["replay", "-m", f"trace={run_dir}", f"out={out}", "comm_mode=model", "perfetto=false"]
    assert skewlens_main([*sweep, f"topology=ring,{topo},switch"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"skewlens replay: error: topology={topo}: topology.dims[1].links_per_node: a node (a unit of "
        "dimension 0) has 2 rank slots, so at most 2 links (a rank uses one), got 8"
    )
    assert not out.exists()
    # the command line's setting of it is applied before the file's values are checked
    fixed = [f"topology={topo}", "slowdown.factor=1,2", "topology.dims.1.links_per_node=2"]
    assert skewlens_main([*sweep, *fixed]) == 0
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [r["topology"] for r in rows] == ["mine", "mine"]


def test_a_replay_that_fails_leaves_no_output_directory_it_made(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "deeper"
    rc = skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "slowdown.rank=9"])
    assert rc == 2 and "rank 9 is not in the run" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # nor config.yaml: it is written once the replay succeeded


@pytest.mark.parametrize("override", ["+bogus=1", "+topology.zz=2", "+slowdown.entries.0.qq=1"])
def test_a_key_the_schema_does_not_have_is_refused_not_dropped(override: str) -> None:
    key = override[1:].split("=")[0]
    with pytest.raises(ConfigError, match=re.escape(f"{key}: not a replay setting")):
        compose_replay(["slowdown=straggler", override])


def test_an_interrupted_replay_removes_what_it_wrote_and_keeps_what_was_there(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import skewlens.replay.driver as driver

    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.parquet").write_text("an earlier replay's")

    def interrupted(conf: ReplayConfig, out_dir: Path, files: Path, *_a: object) -> None:
        for name in ("timeline.parquet", "summary.parquet"):
            (files / name).write_text("half")
        (out_dir / "real" / "plan").mkdir(parents=True)  # mode=real's working files, across hosts
        (out_dir / "run").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "_replay_into", interrupted)
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false"]) != 0
    assert sorted(p.name for p in out.iterdir()) == ["summary.parquet"]  # there before: kept
    assert (out / "summary.parquet").read_text() == "an earlier replay's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "run"]  # no staging directory left
    capsys.readouterr()


def test_skewlens_replay_and_replay_run_stage_and_publish_the_same_files(
    run_dir: Path, tmp_path: Path
) -> None:
    # run_job staged and published a replay with a copy of replay_run's staging (config.yaml its one
    # addition); both now go through replay_run: the same files, the same stale ones removed
    from skewlens.replay.driver import replay_run

    outs = {"cli": tmp_path / "cli", "python": tmp_path / "python"}
    for out in outs.values():  # an earlier real replay's and its failure's, and a perfetto=true timeline
        for d in ("run", "real", "real-failed"):
            (out / d).mkdir(parents=True)
            (out / d / "meta.json").write_text("{}")
        (out / "timeline.json").write_text("{}")
    args = [f"trace={run_dir}", "perfetto=false", "progress=false", "slowdown=straggler"]
    assert skewlens_main(["replay", *args, f"out={outs['cli']}"]) == 0
    config = (outs["cli"] / "config.yaml").read_text()
    replay_run(compose_replay(args), outs["python"], config_yaml=config)
    files = {k: sorted(p.relative_to(o).as_posix() for p in o.rglob("*")) for k, o in outs.items()}
    assert files["cli"] == files["python"] == ["config.yaml", "summary.parquet", "timeline.parquet"]
    assert (outs["python"] / "config.yaml").read_text() == config
    for name in ("summary.parquet", "timeline.parquet"):
        tables = [pq.read_table(o / name) for o in outs.values()]
        assert tables[0].equals(tables[1]), name


def test_a_replay_killed_while_writing_leaves_a_staging_directory_that_the_next_replay_removes(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # SIGKILL (the OOM killer, a batch system past its time) left OUT/.o.<random>.tmp/ holding the killed
    # replay's files; no later replay into OUT removed it (one more for each replay killed), while a sweep
    # removed its jobs' (skewlens.replay.sweep)
    from skewlens.profiler.atomic import staging_dir

    out = tmp_path / "o"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false"]) == 0
    killed = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from skewlens.profiler.atomic import staging_dir\n"
        "with staging_dir(Path(sys.argv[1]), inside=True) as stage:\n"
        "    (stage / 'summary.parquet').write_text('half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", killed, str(out)], env=env, timeout=60, check=False)
    assert proc.returncode == -9
    (left,) = [p for p in out.iterdir() if p.name.startswith(".")]
    assert (left / "summary.parquet").read_text() == "half"
    with staging_dir(out, inside=True) as running:  # another command's, still writing: left alone
        assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false"]) == 0
        hidden = [p for p in out.iterdir() if p.name.startswith(".")]
        assert hidden == [running]
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml", "summary.parquet", "timeline.json", "timeline.parquet"
    ]  # fmt: skip
    assert pq.read_table(out / "summary.parquet").num_rows > 0
    capsys.readouterr()


def test_two_hydra_run_modes_at_once_give_one_line_not_hydras_traceback(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = skewlens_main(["replay", "-m", f"trace={run_dir}", f"out={tmp_path / 'o'}", "--cfg", "hydra"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    modes = "--multirun, --cfg, --info, --run, --shell-completion"
    assert err == [f"skewlens replay: error: --multirun and --cfg: Hydra takes one of {modes} at a time"]


@pytest.mark.parametrize(
    ("overrides", "key", "has"),
    [
        (["slowdown.entries.0.factor=3"], "slowdown.entries.0.factor", ("slowdown none", 0, 0)),
        (  # in a sweep Hydra's message stopped every job, the straggler's too
            ["-m", "slowdown=straggler,none", "slowdown.entries.0.every_step=true"],
            "slowdown.entries.0.every_step",
            ("slowdown none", 0, 0),
        ),
        (
            ["topology=dgx_h100_8x", "topology.dims.2.bandwidth_gbps=5"],
            "topology.dims.2.bandwidth_gbps",
            ("topology dgx_h100_8x", 2, 2),
        ),
    ],
)
def test_an_item_of_a_list_that_the_chosen_entry_lacks_is_one_line_naming_the_entry_and_its_count(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    overrides: list[str],
    key: str,
    has: tuple[str, int, int],
) -> None:
    # Hydra's five lines: "Invalid type assigned: dict is not a subclass of SlowdownItemConfig. value: {}"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", *overrides]) == 2
    entry, count, index = has
    group, name = key.split(".")[:2]
    error = (
        f"{key}: {entry} has {count} items in {group}.{name} (numbered from 0); give the whole list, "
        f"{group}.{name}=[...], or choose a {group} that has item {index}"
    )
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("out", "error"),
    [  # each was a traceback ending in omegaconf's error, full_key: hydra.run.dir (which follows out)
        ("${nope}", "${nope}: no setting 'nope' to interpolate"),
        ("${nwo:%H}", "${nwo:%H}: no resolver 'nwo' (Hydra's: now, hydra; OmegaConf's: oc.env, ...)"),
        (
            "${oc.env:SKEWLENS_NOT_SET}",
            "${oc.env:SKEWLENS_NOT_SET}: environment variable 'SKEWLENS_NOT_SET' is not set",
        ),
    ],
)
def test_an_interpolation_in_out_that_cannot_resolve_is_one_line_naming_it(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, error: str
) -> None:
    value = f"{tmp_path / 'o'}/{out}"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={value}", "progress=false"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: out={value}: {error}"]
    assert not (tmp_path / "o").exists()


def test_out_may_interpolate_hydras_clock_and_the_chosen_settings(run_dir: Path, tmp_path: Path) -> None:
    args = ["replay", f"trace={run_dir}", "topology=ring", "progress=false", "perfetto=false"]
    assert skewlens_main([*args, f"out={tmp_path}/${{topology.name}}-${{now:%Y}}"]) == 0
    assert [p.name for p in tmp_path.glob("ring-*")] == [f"ring-{time.strftime('%Y')}"]


@pytest.mark.parametrize("sweep", ["slowdown.factor=1,2", "slowdown.rank=range(0,2)", "topology=glob(r*)"])
def test_a_sweep_value_without_multirun_is_one_line_saying_to_add_m(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sweep: str
) -> None:
    # Hydra's three lines: "Sweep parameters 'slowdown.factor=1,2' requires --multirun" and its
    # HYDRA_FULL_ERROR line
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", "slowdown=straggler", sweep]
    assert skewlens_main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"skewlens replay: error: {sweep}: a sweep of several values runs with -m (--multirun)"
    ]
    assert not (tmp_path / "o").exists()


def test_an_item_of_a_list_is_not_checked_against_the_default_entry_where_a_primary_config_chooses(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mine.yaml").write_text("defaults:\n  - replay\n  - override slowdown: straggler\n  - _self_\n")
    args = ["replay", "-cd", str(cfg), "-cn", "mine", f"trace={run_dir}", f"out={tmp_path / 'o'}"]
    assert skewlens_main([*args, "slowdown.entries.0.factor=3", "--cfg", "job", "-p", "slowdown"]) == 0
    assert OmegaConf.create(capsys.readouterr().out).entries[0].factor == 3


@pytest.mark.parametrize(
    ("primary", "overrides", "error"),
    [
        (
            "mine",
            ["topology=two_node_ib", "topology.dims.5.bandwidth_gbps=5"],
            "topology.dims.5.bandwidth_gbps: topology two_node_ib has 2 items in topology.dims",
        ),
        (  # a primary config that chooses no topology takes one added
            "bare",
            ["+topology=two_node_ib", "topology.dims.5.bandwidth_gbps=5"],
            "topology.dims.5.bandwidth_gbps: topology two_node_ib has 2 items in topology.dims",
        ),
        (
            "mine",
            ["slowdown=jitter", "slowdown.entries.1.sigma=0.2"],
            "slowdown.entries.1.sigma: slowdown jitter has 1 item in slowdown.entries",
        ),
        (  # a sweep point that chooses an entry without the item: Hydra's message stopped every job
            "mine",
            ["-m", "topology=two_node_ib,switch", "topology.dims.1.bandwidth_gbps=5"],
            "topology.dims.1.bandwidth_gbps: topology switch has 1 item in topology.dims",
        ),
    ],
)
def test_an_item_of_a_list_is_checked_against_an_entry_the_command_line_chooses_under_a_users_primary_config(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    primary: str,
    overrides: list[str],
    error: str,
) -> None:
    # the check was skipped under any primary config of the user's: Hydra's six lines ("Error merging
    # override topology.dims.5.bandwidth_gbps=5", "Invalid type assigned: dict is not a subclass of
    # DimensionConfig. value: {}", ...) where the command line itself chose the entry
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mine.yaml").write_text("defaults:\n  - replay\n  - _self_\n")
    (cfg / "bare.yaml").write_text("defaults:\n  - replay_schema\n  - slowdown: none\n  - _self_\n")
    args = ["replay", "-cd", str(cfg), "-cn", primary, f"trace={run_dir}", f"out={tmp_path / 'o'}"]
    assert skewlens_main([*args, *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"skewlens replay: error: {error} (numbered from 0); ")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("chosen", "group", "key"),
    [
        ("  - override topology: two_node_ib\n", "topology", "dims.1.bandwidth_gbps"),
        ("  - override slowdown: straggler\n", "slowdown", "entries.0.factor"),
    ],
)
def test_an_item_of_a_list_of_an_entry_only_the_users_primary_config_chooses_is_left_to_hydra(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], chosen: str, group: str, key: str
) -> None:
    # replay.yaml's switch has 1 dim and its slowdown none no entries: checked against them, each was
    # refused, where the entry the primary config chooses has the item (skewlens cannot read its defaults
    # before Hydra composes them); the command line choosing another group's entry changes nothing
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mine.yaml").write_text(f"defaults:\n  - replay\n{chosen}  - _self_\n")
    other = "slowdown=jitter" if group == "topology" else "topology=ring"
    args = ["replay", "-cd", str(cfg), "-cn", "mine", f"trace={run_dir}", f"out={tmp_path / 'o'}", other]
    assert skewlens_main([*args, f"{group}.{key}=5", "--cfg", "job", "-p", group]) == 0
    assert OmegaConf.select(OmegaConf.create(capsys.readouterr().out), key) == 5


@pytest.mark.parametrize("sweep", [False, True])
def test_an_added_group_entry_is_checked_as_a_chosen_one_where_the_users_primary_config_chooses_none(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sweep: bool
) -> None:
    # '+slowdown=nosuch' passed the entry check (it compared 'key == group' with the '+' left on): Hydra's
    # fifteen lines ("In 'mine': Could not find 'slowdown/nosuch'", its options, its search path)
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mine.yaml").write_text("defaults:\n  - replay_schema\n  - topology: switch\n  - _self_\n")
    value = "straggler,nosuch" if sweep else "nosuch"
    args = ["replay", *(["-m"] if sweep else []), "-cd", str(cfg), "-cn", "mine", f"trace={run_dir}"]
    assert skewlens_main([*args, f"out={tmp_path / 'o'}", f"+slowdown={value}"]) == 2
    no_such = (
        "slowdown=nosuch: no such entry (one of host_idle, jitter, none, slow_gpu, slow_link, slow_send, "
        "stall, straggler)"
    )
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {no_such}"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("group", ["hydra/launcher", "hydra/sweeper"])
def test_an_added_hydra_plugin_entry_is_refused_in_one_line_where_the_users_primary_config_chooses_no_group(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], group: str
) -> None:
    # a primary config of the user's may add a group replay.yaml chooses, but Hydra's own config chooses
    # its plugins' (basic) whatever the primary config is: +hydra/launcher=basic is refused as without one
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mine.yaml").write_text("defaults:\n  - replay_schema\n  - _self_\n")
    args = ["replay", "-cd", str(cfg), "-cn", "mine", f"trace={run_dir}", f"out={tmp_path / 'o'}"]
    assert skewlens_main([*args, f"+{group}=basic"]) == 2
    says = f"+{group}=basic: Hydra chooses a {group} already; give {group}=basic, without the +"
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {says}"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("added", "says"),
    [
        ("++topology=two_node_ib", "a group's entry is chosen, not added: give topology=two_node_ib"),
        (
            "+topology=two_node_ib",
            "replay.yaml chooses a topology already; give topology=two_node_ib, without the +",
        ),
    ],
)
def test_an_added_group_entry_is_refused_before_an_item_of_its_list_is_checked(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], added: str, says: str
) -> None:
    # the item check ran first and said what the added entry lacks ("topology two_node_ib has 2 items in
    # topology.dims"), where what is wrong is the + (Hydra takes neither): fixed, the item was still missing
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", added, "topology.dims.5.bandwidth_gbps=5"]
    assert skewlens_main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {added}: {says}"]
    assert not (tmp_path / "o").exists()


def test_an_item_of_a_list_is_checked_against_the_entry_hydra_takes_the_bundled_one_before_the_users(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Hydra takes conf/'s dgx_h100_8x (two dims) before one of that name in the user's config directory;
    # the check read the user's (one dim) and refused 'topology.dims.1.bandwidth_gbps=5', which Hydra takes
    (tmp_path / "cfg" / "topology").mkdir(parents=True)
    mine = "name: dgx_h100_8x\ndims:\n  - {kind: switch, size: 0, bandwidth_gbps: 50.0, latency_ns: 500}\n"
    (tmp_path / "cfg" / "topology" / "dgx_h100_8x.yaml").write_text(mine)
    args = ["replay", "-cd", str(tmp_path / "cfg"), f"trace={run_dir}", f"out={tmp_path / 'o'}"]
    args += ["topology=dgx_h100_8x", "topology.dims.1.bandwidth_gbps=5", "--cfg", "job", "-p", "topology"]
    assert skewlens_main(args) == 0
    assert OmegaConf.create(capsys.readouterr().out).dims[1].bandwidth_gbps == 5


def test_a_group_choice_in_hydras_quotes_is_the_entry_it_names(capsys: pytest.CaptureFixture[str]) -> None:
    # Hydra takes slowdown='straggler' as straggler; the entry check refused it ("no such entry")
    args = ["replay", "trace=RUN", "out=OUT", "slowdown='straggler'", "--cfg", "job", "-p", "slowdown"]
    assert skewlens_main(args) == 0
    assert OmegaConf.create(capsys.readouterr().out).name == "straggler"


def test_a_group_choice_hydra_interpolates_is_left_to_hydra_not_refused_as_an_entry_name(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # slowdown=${oc.env:WHAT} composes as the entry the variable names; the entry check refused the text
    # itself ("slowdown=${oc.env:WHAT}: no such entry"), and topology= took it for a file
    monkeypatch.setenv("WHAT", "straggler")
    monkeypatch.setenv("TOPO", "ring")
    for group, value, name in (
        ("slowdown", "${oc.env:WHAT}", "straggler"),
        ("topology", "${oc.env:TOPO}", "ring"),
    ):
        args = ["replay", "trace=RUN", "out=OUT", f"{group}={value}", "--cfg", "job", "-p", group]
        assert skewlens_main(args) == 0
        assert OmegaConf.create(capsys.readouterr().out).name == name


@pytest.mark.parametrize("flag", ["-sc", "--shell-completion"])
def test_asking_for_hydras_tab_completion_says_in_one_line_that_a_subcommand_cannot_have_it(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # Hydra's documented 'install=bash' was refused as 'install: no such setting (skewlens replay has ...)'
    assert skewlens_main(["replay", flag, "install=bash"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            "skewlens replay: error: --shell-completion: Hydra's tab completion completes a command that is "
            "itself a Hydra app, not a subcommand such as skewlens replay; skewlens replay --help lists the "
            "groups and settings"
        )
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["trace={run}", "out={out}", "--cfg", "job", "topology=ring"],
        ["--cfg=job", "trace={run}", "out={out}", "topology=ring"],
        ["trace={run}", "-p", "topology", "out={out}", "--cfg", "job", "topology=ring"],
        ["trace={run}", "--resolve", "out={out}", "--cfg", "job", "topology=ring"],
    ],
    ids=lambda a: " ".join(a).replace("={run}", "").replace("={out}", ""),
)
def test_hydras_flags_may_come_before_between_or_after_the_overrides(
    args: list[str], run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a flag between two overrides was argparse's usage and `unrecognized arguments: topology=ring`; a bare
    # --info before them took the first override for its value (`invalid choice: 'trace=...'`; not tested
    # in-process: Hydra's --info leaves a logging handler on this test's stream, closed for the next ones)
    out = tmp_path / "o"
    argv = [a.format(run=run_dir, out=out) for a in args]
    assert skewlens_main(["replay", *argv]) == 0
    said = capsys.readouterr()
    assert said.err == ""
    assert "name: ring\n" in said.out  # the override after the flag was taken
    assert not out.exists()  # shown, not run


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (
            ["slowdown=straggler", "slowdown.factor=-2"],
            "slowdown.factor: must be a finite number > 0, got -2.0",
        ),
        (
            ["slowdown=straggler", "slowdown.factor=inf"],
            "slowdown.factor: must be a finite number > 0, got inf",
        ),
        (
            ["slowdown=jitter", "slowdown.factor=-0.5"],
            "slowdown.factor: must be a finite number > 0, got -0.5",
        ),
        (
            ["slowdown=slow_send", "slowdown.delay_ms=nan"],
            "slowdown.delay_ms: must be a finite number >= 0, got nan",
        ),
        (
            ["slowdown=stall", "slowdown.delay_ms=inf"],
            "slowdown.delay_ms: must be a finite number >= 0, got inf",
        ),
        (
            ["slowdown=straggler", "slowdown.entries.0.factor=0"],
            "slowdown.entries[0].factor: must be a finite number > 0, got 0.0 (kind=compute)",
        ),
        (
            ["slowdown=jitter", "slowdown.entries.0.sigma=nan"],
            "slowdown.entries[0].sigma: must be a finite number >= 0, got nan (kind=jitter)",
        ),
        (  # the real replay ran the transfers unslowed: real +6.2% against a simulated +77.0% (ddp-accum)
            ["mode=real", "slowdown=slow_link"],
            (
                "slowdown.entries[0]: kind=network changes transfer times, which a real replay does not: its "
                "transfers run on this host's own network as they run; replay it in mode=sim"
            ),
        ),
        (  # the real replay ran on this host's gloo network: real +17.8% beside a DGX-modelled -18.5%
            ["mode=real", "topology=dgx_h100_8x", "comm_mode=model"],
            (
                "comm_mode=model: a real replay's transfers run on this host's own network as they run, not "
                "on topology dgx_h100_8x's model, and its table would set them beside a simulation of that "
                "other network; replay it with comm_mode=as_recorded (the default), or model the topology in "
                "mode=sim"
            ),
        ),
        (  # was Hydra's traceback around TopologyError
            ["topology=two_node_ib", "comm_mode=model", "scale.dp=16"],
            (
                "topology=two_node_ib: 8 rank slots (topology.dims.0.size=4, topology.dims.1.size=2), and "
                "the replayed run has 16 ranks (scale.dp=16); choose a larger topology or sizes, or a "
                "topology file whose outermost dimension has size 0 (as many as the ranks need)"
            ),
        ),
        (  # as recorded, the ranks are placed on the topology all the same where a slowdown names nodes;
            # before, the override that made the slots too few went unsaid ("2 rank slots, and ...")
            [
                "topology=two_node_ib",
                "topology.dims.0.size=1",
                "slowdown=slow_link",
                "slowdown.entries.0.links=[]",
                "+slowdown.entries.0.nodes=[1]",
            ],
            (
                "topology=two_node_ib: 2 rank slots (topology.dims.0.size=1, topology.dims.1.size=2), and "
                "the replayed run has 4 ranks; choose a larger topology or sizes, or a topology file whose "
                "outermost dimension has size 0 (as many as the ranks need)"
            ),
        ),
        (  # before: "topology: node_of_rank: no node given for rank 1", where others name the key dotted
            ["topology=two_node_ib", "comm_mode=model", "topology.node_of_rank=[0]"],
            (
                "topology.node_of_rank: no node given for rank 1: it lists the nodes of the first 1 rank(s), "
                "and each rank placed needs one"
            ),
        ),
        (  # placed for a network slowdown's nodes, it said "node_of_rank: ..." with no "topology" at all
            [
                "topology=two_node_ib",
                "topology.node_of_rank=[0,1]",
                "slowdown=slow_link",
                "slowdown.entries.0.links=[]",
                "+slowdown.entries.0.nodes=[1]",
            ],
            (
                "topology.node_of_rank: no node given for rank 2: it lists the nodes of the first 2 rank(s), "
                "and each rank placed needs one"
            ),
        ),
        (
            [
                "topology=two_node_ib",
                "comm_mode=model",
                "topology.node_of_rank=[0,0,0,0]",
                "topology.dims.0.size=2",
            ],
            "topology.node_of_rank: node 0 holds more than 2 ranks",
        ),
    ],
)
def test_a_bad_config_gives_one_line_naming_the_key_and_exit_code_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], error: str
) -> None:
    rc = skewlens_main(["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (
            ["slowdown=straggler", "slowdown.rank=4"],
            (
                "slowdown.entries[0].ranks: rank 4 is not in the run (ranks 0-3); the straggler preset takes "
                "it from slowdown.rank"
            ),
        ),
        (  # given on the command line, not taken from a preset's knob: no hint ("the presets take it ...")
            ["+slowdown.entries=[{kind:compute,factor:2,ranks:[7]}]"],
            "slowdown.entries[0].ranks: rank 7 is not in the run (ranks 0-3)",
        ),
        (
            ["slowdown=straggler", "slowdown.entries.0.ranks=[7]"],
            "slowdown.entries[0].ranks: rank 7 is not in the run (ranks 0-3)",
        ),
        (
            ["slowdown=slow_link", "slowdown.entries.0.links=[[0,9]]", "comm_mode=model", "topology=ring"],
            "slowdown.entries[0].links: rank 9 is not in the run (ranks 0-3)",
        ),
        (
            ["+slowdown.entries=[{kind:stall,ranks:[0],step:5,delay_ms:1}]"],
            "slowdown.entries[0].step: step 5 is not in the run (steps 0-1)",
        ),
        (
            ["slowdown=stall", "slowdown.step=5"],
            (
                "slowdown.entries[0].step: step 5 is not in the run (steps 0-1); "
                "the stall preset takes it from slowdown.step"
            ),
        ),
        (
            ["slowdown=stall", "slowdown.entries.0.every_step=true", "slowdown.entries.0.first_step=5"],
            (
                "slowdown.entries[0].first_step: steps 5.. hold none of the run's (steps 0-1): a stall at "
                "every step of them would stall nothing"
            ),
        ),
        (
            ["slowdown=slow_link", "slowdown.entries.0.links=[]", "+slowdown.entries.0.nodes=[9]"],
            (
                "slowdown.entries[0].nodes: node 9 holds none of the run's 4 ranks under topology switch "
                "(nodes 0-3)"
            ),
        ),
        (  # two_node_ib places ranks 0-3 on node 0 (block placement, 4 per node): node 1 holds none
            [
                "slowdown=slow_link",
                "slowdown.entries.0.links=[]",
                "+slowdown.entries.0.nodes=[1]",
                "topology=two_node_ib",
            ],
            (
                "slowdown.entries[0].nodes: node 1 holds none of the run's 4 ranks under topology "
                "two_node_ib (nodes 0-0)"
            ),
        ),
        (  # nodes of 2 as many as needed: 4 ranks dealt round_robin fill nodes 0-1 (unsized, a node a rank)
            [
                "slowdown=slow_link",
                "slowdown.entries.0.links=[]",
                "+slowdown.entries.0.nodes=[3]",
                "topology=dgx_h100_8x",
                "topology.dims.0.size=2",
                "topology.dims.1.links_per_node=2",
                "topology.placement=round_robin",
            ],
            (
                "slowdown.entries[0].nodes: node 3 holds none of the run's 4 ranks under topology "
                "dgx_h100_8x (nodes 0-1)"
            ),
        ),
        (  # slowed nothing, and the report said "ops 'aten::linear' x3 on rank 1" all the same
            ["+slowdown.entries=[{kind:op,pattern:'aten::linear',factor:3.0,ranks:[1]}]"],
            (
                "slowdown.entries[0].pattern: 'aten::linear' matches no compute node of rank 1, so it would "
                "slow nothing; the names with the most compute time there: 'aten::mm'"
            ),
        ),
        (  # several ranks are named as ranges, as in every message on ranks
            ["+slowdown.entries=[{kind:op,pattern:'aten::linear',factor:3.0,ranks:[0,1,2]}]"],
            (
                "slowdown.entries[0].pattern: 'aten::linear' matches no compute node of ranks 0-2, so it "
                "would slow nothing; the names with the most compute time there: 'aten::mm'"
            ),
        ),
        (
            ["+slowdown.entries=[{kind:op,pattern:'re:^linear',factor:3.0}]"],
            (
                "slowdown.entries[0].pattern: 're:^linear' matches no compute node of any rank, so it would "
                "slow nothing; the names with the most compute time there: 'aten::mm'"
            ),
        ),
        (  # delayed nothing (no sends), and the report said "+5 ms before every send op on rank 1"
            ["slowdown=slow_send"],
            (
                "slowdown.entries[0].ranks: rank 1 has no send op, so a delay before every send would delay "
                "nothing (the run has none); the slow_send preset takes the rank from slowdown.rank"
            ),
        ),
        (
            ["+slowdown.entries=[{kind:comm_delay,before:send,ranks:[1],delay_ms:5}]"],
            (
                "slowdown.entries[0].ranks: rank 1 has no send op, so a delay before every send would delay "
                "nothing (the run has none)"
            ),
        ),
    ],
)
def test_a_slowdown_of_a_rank_link_node_step_or_op_the_run_lacks_is_refused_naming_the_key(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], error: str
) -> None:
    rc, said = _replay_said(run_dir, tmp_path / "o", capsys, overrides)
    assert rc == 2
    assert said == [f"skewlens replay: error: {error}"]


def _replay_said(
    run_dir: Path, out: Path, capsys: pytest.CaptureFixture[str], overrides: list[str]
) -> tuple[int, list[str]]:
    """``skewlens replay`` of ``run_dir`` into ``out`` with ``overrides``: exit code and stderr's lines."""
    rc = skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false", *overrides])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_an_op_pattern_naming_a_backward_op_as_analyze_does_is_refused_saying_the_whole_name_and_a_glob(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # analyze's cause reads "compute grew: SleepInBackwardBackward +20.1 ms" (the engine's prefix dropped);
    # copied into a pattern it matched nothing, and the refusal listed the whole name among others, unsaid
    engine = "autograd::engine::evaluate_function: SleepInBackwardBackward"
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).compute("aten::mm", dur_ns=1_000_000, start_ns=0)
        b.rank(r).compute(engine, dur_ns=20_000_000 if r == 1 else 10_000)
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=200_000)
    run = b.write(tmp_path / "run")
    item = "{kind:op,pattern:'%s',factor:0,ranks:[1]}"
    rc, said = _replay_said(
        run, tmp_path / "o", capsys, [f"+slowdown.entries=[{item % 'SleepInBackwardBackward'}]"]
    )
    assert rc == 2
    assert said == [
        (
            "skewlens replay: error: slowdown.entries[0].pattern: 'SleepInBackwardBackward' matches no "
            f"compute node of rank 1, so it would slow nothing; it names the backward op '{engine}' as "
            "skewlens analyze's causes do, without the autograd engine's prefix, but a pattern is matched "
            "against whole names: '*SleepInBackwardBackward' matches it; the names with the most compute "
            f"time there: '{engine}', 'aten::mm'"
        )
    ]
    # a regex is searched for anywhere in the name, so only an anchored one can miss: no glob to offer it
    rc, said = _replay_said(run, tmp_path / "o", capsys, [f"+slowdown.entries=[{item % 're:^Sleep'}]"])
    assert rc == 2
    assert said[0].endswith(
        f"it names the backward op '{engine}' as skewlens analyze's causes do, without the autograd engine's "
        f"prefix, but a pattern is matched against whole names; the names with the most compute time there: "
        f"'{engine}', 'aten::mm'"
    )
    # the glob the refusal offers takes rank 1's 20 ms away, and rank 0's wait for it
    glob = f"+slowdown.entries=[{item % '*SleepInBackwardBackward'}]"
    rc, _said = _replay_said(run, tmp_path / "o", capsys, [glob])
    assert rc == 0
    waits = pq.read_table(tmp_path / "o" / "summary.parquet").to_pylist()
    assert {w["rank"]: w["exposed_wait_ns"] for w in waits}[0] < 1_000_000
    assert {w["rank"]: w["compute_ns"] for w in waits}[1] == 1_000_000


def test_a_slow_link_no_transfer_crosses_is_refused_and_one_a_send_crosses_slows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two pairs all_reduce inside themselves, and rank 1 sends to rank 2: link 0-2 carries nothing
    b = RunBuilder(world_size=4, groups={"0": (0, 1, 2, 3), "a": (0, 1), "b": (2, 3)})
    for r in range(4):
        b.rank(r).compute("aten::mm", dur_ns=1_000_000, start_ns=0)
        pg = "a" if r < 2 else "b"
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=200_000, pg=pg)
    b.rank(1).send(2, 1 << 20, dur_ns=100_000)
    b.rank(2).recv(1, 1 << 20, dur_ns=100_000)
    run = b.write(tmp_path / "run")
    base = ["replay", f"trace={run}", "progress=false", "slowdown=slow_link", "comm_mode=model"]
    rc = skewlens_main([*base, f"out={tmp_path / 'o'}", "slowdown.entries.0.links=[[0,2]]"])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            "skewlens replay: error: slowdown.entries[0].links: no collective or send/recv of the run spans "
            "link 0-2, so slowing it would slow nothing; the slow_link preset's link is ranks 0-1"
        )
    ]
    assert skewlens_main([*base, f"out={tmp_path / 'o'}", "slowdown.entries.0.links=[[2,1]]"]) == 0


def test_a_delay_before_every_send_of_ranks_of_which_one_sends_is_replayed(tmp_path: Path) -> None:
    # rank 1 sends to rank 2, rank 0 sends nothing: the delay on ranks 0 and 1 delays rank 1's send
    b = RunBuilder(world_size=4)
    for r in range(4):
        b.rank(r).compute("aten::mm", dur_ns=1_000_000, start_ns=0)
    b.rank(1).send(2, 1 << 20, dur_ns=100_000)
    b.rank(2).recv(1, 1 << 20, dur_ns=100_000)
    run = b.write(tmp_path / "run")
    args = ["replay", f"trace={run}", f"out={tmp_path / 'o'}", "progress=false", "slowdown=slow_send"]
    assert skewlens_main([*args, "slowdown.entries.0.ranks=[0,1]"]) == 0


def test_the_stall_preset_stalls_the_runs_first_step_unless_told_another(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def slowest_step_ms(*overrides: str) -> list[float]:
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false", *overrides]) == 0
        rows = pq.read_table(out / "summary.parquet").to_pylist()
        return [max(r["step_time_ns"] for r in rows if r["step"] == s) / 1e6 for s in (0, 1)]

    plain = slowest_step_ms()
    first = slowest_step_ms("slowdown=stall")
    assert "a 50 ms stall at step 0 on rank 0" in capsys.readouterr().out
    later = slowest_step_ms("slowdown=stall", "slowdown.step=1")
    # rank 0 starts the step 50 ms late, so its peers wait 50 ms (less the 0.3 ms rank 0 waited for them)
    assert [first[0] - plain[0], first[1] - plain[1]] == pytest.approx([49.7, 0.0])
    assert [later[0] - plain[0], later[1] - plain[1]] == pytest.approx([0.0, 49.7])


def test_a_stall_at_every_step_of_a_window_holding_one_of_the_runs_steps_stalls_that_step(
    run_dir: Path, tmp_path: Path
) -> None:
    # the run's steps are 0-1: the window 1.. holds step 1 (not step 0), so the stall is not refused
    def slowest_step_ms(out: Path, *overrides: str) -> list[float]:
        assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false", *overrides]) == 0
        rows = pq.read_table(out / "summary.parquet").to_pylist()
        return [max(r["step_time_ns"] for r in rows if r["step"] == s) / 1e6 for s in (0, 1)]

    plain = slowest_step_ms(tmp_path / "plain")
    every = slowest_step_ms(
        tmp_path / "every",
        "slowdown=stall",
        "slowdown.entries.0.every_step=true",
        "slowdown.entries.0.first_step=1",
    )
    # as a one-off stall at step 1: rank 0 starts it 50 ms late, less the 0.3 ms it waited for its peers
    assert [every[0] - plain[0], every[1] - plain[1]] == pytest.approx([0.0, 49.7])


def test_an_unknown_run_directory_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = skewlens_main(["replay", f"trace={tmp_path / 'none'}", f"out={tmp_path / 'o'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1
    assert str(tmp_path / "none") in err[0]


def test_a_multirun_sweep_writes_one_row_per_job_and_prints_the_comparison(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    rc = skewlens_main(
        [
            "replay",
            "-m",
            f"trace={run_dir}",
            f"out={out}",
            "comm_mode=model",
            "slowdown=straggler",
            "slowdown.factor=1.0,1.5",
            "topology=ring,switch",
            "progress=false",
            "perfetto=false",
        ]
    )
    assert rc == 0
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [r["job"] for r in rows] == [0, 1, 2, 3]
    assert {(r["topology"], "slowdown.factor=1.5" in r["overrides"]) for r in rows} == {
        ("ring", False),
        ("ring", True),
        ("switch", False),
        ("switch", True),
    }
    by = {(r["topology"], "slowdown.factor=1.5" in r["overrides"]): r["mean_step_ns"] for r in rows}
    assert by[("ring", True)] > by[("ring", False)]
    for r in rows:
        assert (Path(r["out_dir"]) / "timeline.parquet").exists()
        assert (Path(r["out_dir"]) / "config.yaml").exists()
    printed = capsys.readouterr().out
    assert "Replay sweep" in printed
    # the report console's width in a pipe (160 columns), not rich's 80: each point's overrides whole
    for factor, topology in (("1.0", "ring"), ("1.5", "switch")):
        assert re.search(rf"slowdown\.factor={factor}\s+topology={topology}", printed), printed


def test_python_dash_m_skewlens_replay_is_the_same_command_from_any_directory(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "m"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "skewlens",
            "replay",
            f"trace={run_dir}",
            f"out={out}",
            "progress=false",
            "perfetto=false",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert (out / "summary.parquet").exists()
    assert "Simulated replay" in res.stdout


def test_the_timeline_record_is_the_store_node_record_plus_replayed_times() -> None:
    from dataclasses import fields

    from skewlens.profiler.store.schema import NodeRecord, arrow_schema

    node = [(f.name, f.type) for f in fields(NodeRecord)]
    replayed = [(f.name, f.type) for f in fields(ReplayedNodeRecord)]
    assert replayed == [*node, ("source_rank", "int"), ("replay_start_ns", "int"), ("replay_end_ns", "int")]
    schema = arrow_schema(ReplayedNodeRecord)
    assert schema.field("replay_end_ns").metadata[b"doc"] == b"Replayed end, ns."


def test_a_knob_the_chosen_slowdown_does_not_use_is_named_as_changing_nothing(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", "progress=false", "perfetto=false"]
    assert skewlens_main([*args, "slowdown=jitter", "slowdown.factor=2", "slowdown.rank=1"]) == 0
    said = capsys.readouterr()
    warn = "skewlens replay: warning: "
    unused = "slowdown.factor=2: slowdown jitter does not use slowdown.factor; it changes nothing here"
    assert f"{warn}{unused}" in said.err.splitlines()
    assert f"{warn}slowdown.rank=1: slowdown jitter does not use slowdown.rank" in said.err
    assert "changes nothing" not in said.out  # on stderr: a script's > out.txt gets the results only
    assert skewlens_main([*args, "slowdown=straggler", "slowdown.factor=2", "slowdown.rank=1"]) == 0
    assert "changes nothing" not in capsys.readouterr().err


def test_a_scale_source_or_seed_without_scale_dp_is_named_as_changing_nothing(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # scale.source=1 alone replayed the run as captured, with no word that scale.dp=0 turned it off
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", "progress=false", "perfetto=false"]
    assert skewlens_main([*args, "scale.source=1", "scale.seed=null"]) == 0
    err = capsys.readouterr().err
    warn = "skewlens replay: warning: "
    unused = "scale.source=1: scale.dp is 0 (the run replayed as captured), so it changes nothing here"
    assert f"{warn}{unused}" in err.splitlines()
    assert f"{warn}scale.seed=null: scale.dp is 0" in err
    assert skewlens_main([*args, "scale.dp=4", "scale.source=1", "comm_mode=model"]) == 0
    assert "changes nothing" not in capsys.readouterr().err


def test_a_knob_added_or_forced_on_the_command_line_is_named_as_changing_nothing_as_one_set() -> None:
    # '+key=value' and '++key=value' name the key as 'key=value' does (outputs.override_key)
    from skewlens.cli.replay import unused_knobs

    cfg = OmegaConf.create({"slowdown": {"name": "jitter", "entries": []}, "scale": {"dp": 0}})
    assert unused_knobs(cfg, ["++slowdown.factor=2", "+scale.seed=3"]) == [
        "++slowdown.factor=2: slowdown jitter does not use slowdown.factor; it changes nothing here",
        "+scale.seed=3: scale.dp is 0 (the run replayed as captured), so it changes nothing here",
    ]


def test_a_failed_replay_into_the_directory_of_an_earlier_one_leaves_that_one_as_it_was(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for bad in (
        ["mode=real", "real.nproc=3"],  # refused before anything is simulated or written
        ["slowdown=straggler", "slowdown.rank=9"],  # refused once the run is loaded
    ):
        assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "progress=false", *bad]) == 2
        assert capsys.readouterr().err.startswith("skewlens replay: error: ")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before, bad
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left


def test_real_replay_of_a_run_recorded_on_cuda_is_refused_where_cuda_is_not_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from skewlens.profiler.manifest import read_manifest
    from skewlens.replay.real import api

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).step(0).compute("k", dur_ns=1_000_000)
    m = dataclasses.replace(read_manifest(b.write(tmp_path / "run")), devices={0: "cuda:0", 1: "cuda:1"})
    monkeypatch.setattr(api, "_cuda_available", lambda: False)
    with pytest.raises(ConfigError, match=r"recorded on CUDA devices \(cuda:0, cuda:1\).*real.backend=gloo"):
        api.resolve_backend("auto", m)
    assert api.resolve_backend("gloo", m) == "gloo"  # asked for: replayed on CPU processes anyway
    assert api.resolve_backend("auto", dataclasses.replace(m, devices={})) == "gloo"


@pytest.mark.parametrize(
    ("mode", "where"),
    [
        ("sim", "out/run"),
        ("real", "out/run"),
        ("sim", "out/run/copy"),
        ("sim", "out/real/run"),
        ("sim", "out"),
        ("real", "out"),
    ],
)
def test_a_trace_that_is_out_or_inside_outs_run_or_real_directory_is_refused_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, where: str
) -> None:
    # replaying a real replay's capture into its own OUT: mode=sim removed OUT/run (the trace) after the
    # replay as an earlier real replay's; mode=real cleared its files and captured over them (and OUT/real,
    # its working files, goes the same way). Into the run's own directory, the replay's files lay among the
    # run's.
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, comm_bytes=1024, dur_ns=300_000)
    out = tmp_path / "out"
    trace = b.write(tmp_path / where)
    files = sorted(p.name for p in trace.iterdir())
    rc = skewlens_main(["replay", f"mode={mode}", f"trace={trace}", f"out={out}", "progress=false"])
    assert rc == 2
    if where == "out":
        error = (
            f"skewlens replay: error: out={out} is the run's own directory (trace={trace}): the replay's "
            "files would lie among the run's; give another out, such as a directory beside it"
        )
    else:
        error = (
            f"skewlens replay: error: trace={trace} lies in out={out}'s {where.split('/')[1]}/, which a "
            "replay into it replaces (mode=real) or removes (mode=sim) along with the trace; give another out"
        )
    assert capsys.readouterr().err.strip().splitlines() == [error]
    assert sorted(p.name for p in trace.iterdir()) == files


def test_hydras_flags_go_after_the_overrides_each_with_its_value_and_a_bare_info_takes_none() -> None:
    from skewlens.cli.replay import flags_last

    assert flags_last(["--cfg", "job", "trace=r", "--info", "out=o", "-m", "--info", "config", "x=1"]) == [
        "trace=r",
        "out=o",
        "x=1",
        "--cfg",
        "job",
        "--info",
        "-m",
        "--info",
        "config",
    ]
    assert flags_last(["--cfg=job", "trace=r", "--info"]) == ["trace=r", "--cfg=job", "--info"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["{run}"], "{run}: replay takes key=value overrides: did you mean trace={run}?"),
        (
            ["trace={run}", "slowdown.rank", "1"],
            "slowdown.rank: replay takes key=value overrides: did you mean slowdown.rank=1?",
        ),
        (
            ["trace={run}", "slowdown.rank"],
            "slowdown.rank: replay takes key=value overrides: did you mean slowdown.rank=...?",
        ),
        (["--trace", "{run}"], "--trace: replay takes key=value overrides: did you mean trace={run}?"),
        (
            ["trace={run}", "--comm-mode=model"],
            "--comm-mode=model: replay takes key=value overrides: did you mean comm_mode=model?",
        ),
        (
            ["trace={run}", "--lenient"],
            "--lenient: replay takes key=value overrides: did you mean lenient=true?",
        ),
        (
            ["trace={run}", "straggler"],
            "straggler: replay takes key=value overrides: did you mean slowdown=straggler?",
        ),
        (
            ["trace={run}", "--bogus"],
            (
                "--bogus: not an option of skewlens replay (it takes key=value overrides and Hydra's flags: "
                "skewlens replay --help)"
            ),
        ),
        (
            ["trace={run}", "compute}]"],
            "compute}]: replay takes key=value overrides (quote one that holds spaces)",
        ),
        (["trace={run}", "--cfg"], "--cfg: expects a value"),
        (["trace={run}", "--cfg", "jobs"], "--cfg: expects one of job, hydra, all, got 'jobs'"),
    ],
)
def test_an_argument_that_is_not_an_override_or_a_hydra_flag_is_one_line_saying_what_was_meant(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    # were Hydra's grammar error in five lines ("extraneous input '/' expecting {EQUAL, ...}", "missing EQUAL
    # at '<EOF>'") or argparse's usage under the program name skewlens-replay
    args = [a.replace("{run}", str(run_dir)) for a in args]
    assert skewlens_main(["replay", f"out={tmp_path / 'o'}", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"skewlens replay: error: {error.replace('{run}', str(run_dir))}"]
    assert not (tmp_path / "o").exists()


#: What deleting a nested key says, of the key.
NESTED_DELETE = "only a top-level setting can be deleted (it then takes its default); give {} a value"


@pytest.mark.parametrize(
    ("delete", "error"),
    [
        # replayed a trace directory named ??? (the schema's MISSING): "???: no such run directory"
        ("~trace", "~trace: trace is required and cannot be deleted (give it a value: trace=...)"),
        # replayed into the current directory, exit 0
        ("~out", "~out: out is required and cannot be deleted (give it a value: out=...)"),
        # a traceback: "MissingMandatoryValue: Cannot iterate a missing DictConfig"
        (
            "~topology",
            "~topology: topology is required and cannot be deleted (give it a value: topology=...)",
        ),
        # Hydra's five lines: "SlowdownConfig (DictConfig) does not support deletion"
        (
            "~slowdown.factor",
            f"~slowdown.factor: {NESTED_DELETE.format('slowdown.factor')}",
        ),
        # a traceback: "TypeError: list indices must be integers or slices, not str"
        (
            "~slowdown.entries.0",
            f"~slowdown.entries.0: {NESTED_DELETE.format('slowdown.entries.0')}",
        ),
        # Hydra's "Could not delete from config. 'bogus' does not exist." and its HYDRA_FULL_ERROR line
        (
            "~bogus",
            f"~bogus: no such setting (skewlens replay has {', '.join(f.name for f in REPLAY_FIELDS)})",
        ),
    ],
)
def test_deleting_a_required_or_nested_setting_is_one_line_naming_it_before_anything_runs(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    delete: str,
    error: str,
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", "slowdown=straggler", "progress=false"]
    assert skewlens_main([*args, delete]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()
    assert list(here.iterdir()) == []


def test_deleting_a_top_level_setting_that_has_a_default_replays_with_that_default(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    args = ["replay", f"trace={run_dir}", f"out={out}", "progress=false", "perfetto=false"]
    assert skewlens_main([*args, "slowdown=straggler", "comm_mode=model", "~slowdown", "~comm_mode"]) == 0
    assert "replayed with transfers as recorded; no slowdown" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_setting_hydras_output_directory_is_one_line_saying_to_give_out_instead(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    # hydra.run.dir=rd replayed into rd, silently leaving out=o empty: the outputs go where Hydra's run
    # directory is, which replay.yaml sets to out
    args = [
        "replay",
        f"trace={run_dir}",
        f"out={tmp_path / 'o'}",
        "progress=false",
        f"{key}={tmp_path / 'rd'}",
    ]
    assert skewlens_main(args) == 2
    rd = tmp_path / "rd"
    said = f"{key}={rd}: skewlens replay writes where out= says ({key} follows it): give out={rd}"
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {said}"]
    assert not (tmp_path / "o").exists()
    assert not (tmp_path / "rd").exists()


def test_hydra_flags_and_their_values_pass_and_version_is_skewlens_version(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens import __version__

    assert skewlens_main(["replay", "--version"]) == 0
    assert capsys.readouterr().out == f"skewlens {__version__}\n"  # was "Hydra 1.3.8"
    args = ["replay", "-c", "job", "-p", "slowdown", f"trace={run_dir}", f"out={tmp_path / 'o'}", "~scale"]
    assert skewlens_main(args) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["# @package slowdown", "name: none"]


def test_an_error_of_hydras_own_parser_names_the_program_skewlens_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert skewlens_main(["replay", "--info", "--cfg=all", "--info=bogus"]) == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1].startswith("skewlens replay: error: argument --info")
    )


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (  # was an OverflowError traceback (core.py)
            ["slowdown=straggler", "slowdown.rank=1", "slowdown.factor=1e13"],
            (
                "slowdown.entries[0].factor: 1e+13 times rank 1's aten::mm (2.1 ms) is 2.1e+10 s, beyond the "
                "simulator's clock (about 146 years); the straggler preset takes it from slowdown.factor"
            ),
        ),
        (  # past the clock by less than twice: each op's own bound, not the end-of-run one
            ["slowdown=straggler", "slowdown.rank=1", "slowdown.factor=3e12"],
            (
                "slowdown.entries[0].factor: 3e+12 times rank 1's aten::mm (2.1 ms) is 6.3e+09 s, beyond the "
                "simulator's clock (about 146 years); the straggler preset takes it from slowdown.factor"
            ),
        ),
        (  # wrapped the replayed times around, silently
            ["slowdown=straggler", "slowdown.rank=1", "slowdown.factor=1e17"],
            (
                "slowdown.entries[0].factor: 1e+17 times rank 1's aten::mm (2.1 ms) is 2.1e+14 s, beyond the "
                "simulator's clock (about 146 years); the straggler preset takes it from slowdown.factor"
            ),
        ),
        (  # was an OverflowError traceback (summary.py)
            ["slowdown=straggler", "slowdown.rank=1", "slowdown.factor=1e308"],
            (
                "slowdown.factor: must be at most 4.61e+18, got 1e+308: beyond it, times leave the "
                "simulator's clock (about 146 years)"
            ),
        ),
        (  # was an OverflowError traceback (slowdown.py)
            ["slowdown=stall", "slowdown.delay_ms=1e308"],
            (
                "slowdown.delay_ms: must be at most 4.61e+12 ms, got 1e+308: beyond it, times leave the "
                "simulator's clock (about 146 years)"
            ),
        ),
        (
            ["slowdown=jitter", "slowdown.entries.0.sigma=1e308"],
            (
                "slowdown.entries[0].sigma: must be at most 4.61e+18, got 1e+308: beyond it, times leave the "
                "simulator's clock (about 146 years) (kind=jitter)"
            ),
        ),
        (
            ["slowdown=jitter", "slowdown.entries.0.sigma=1e17"],
            (
                "slowdown: rank 0's aten::mm x1.02958e+16 lasts 2.06e+13 s, beyond the simulator's clock "
                "(about 146 years): the slowdown's factor / sigma is out of any real range"
            ),
        ),
        (  # past 2**62 ns, within what an int64 holds
            ["slowdown=jitter", "slowdown.entries.0.sigma=5e13"],
            (
                "slowdown: rank 0's aten::mm x5.14791e+12 lasts 1.03e+10 s, beyond the simulator's clock "
                "(about 146 years): the slowdown's factor / sigma is out of any real range"
            ),
        ),
        (  # two delays, each on the clock, add up past it
            ["+slowdown.entries=[{kind:comm_delay,delay_ms:4e12},{kind:comm_delay,delay_ms:4e12}]"],
            (
                "slowdown: rank 0's delay before a node is 8e+09 s, beyond the simulator's clock "
                "(about 146 years)"
            ),
        ),
        (  # the core's times run past the clock (beyond int64 there: an OverflowError)
            ["+slowdown.entries=[{kind:stall,delay_ms:4e12,step:0},{kind:comm_delay,delay_ms:4e12}]"],
            (
                "slowdown: the replayed times run beyond the simulator's clock (about 146 years): the "
                "slowdown's factors / delays (slowdown.*) are out of any real range"
            ),
        ),
        (  # past 2**62 ns, within int64: the outputs' sums would wrap
            ["+slowdown.entries=[{kind:stall,delay_ms:4e12,step:0},{kind:stall,delay_ms:4e12,step:1}]"],
            (
                "slowdown: the replayed times run beyond the simulator's clock (about 146 years): the "
                "slowdown's factors / delays (slowdown.*) are out of any real range"
            ),
        ),
    ],
)
def test_a_slowdown_beyond_the_simulators_clock_is_one_line_naming_the_key(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], error: str
) -> None:
    rc, said = _replay_said(run_dir, tmp_path / "o", capsys, overrides)
    assert said == [f"skewlens replay: error: {error}"]
    assert rc == 2
    assert not (tmp_path / "o").exists()


def test_a_stall_and_a_delay_at_a_steps_first_node_past_the_clock_together_are_one_line_naming_the_stall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each on the clock, they add up past it at the all_reduce that opens step 0
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=300_000)
    run = b.write(tmp_path / "run")
    entries = "[{kind:stall,delay_ms:4e12,step:0},{kind:comm_delay,delay_ms:4e12}]"
    rc, said = _replay_said(run, tmp_path / "o", capsys, [f"+slowdown.entries={entries}"])
    stall = "slowdown: rank 0's stall at step 0 is 4e+09 s, beyond the simulator's clock (about 146 years)"
    assert (rc, said) == (2, [f"skewlens replay: error: {stall}"])


def test_a_sweep_point_beyond_the_simulators_clock_fails_alone_and_the_sweep_is_gathered(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sw"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "slowdown.rank=1"]
    rc = skewlens_main([*args, "slowdown.factor=1.0,1e13,1.5", "progress=false", "perfetto=false"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if ": warning: " not in line]
    assert err == [
        (
            "skewlens replay: error: sweep job 1 (slowdown.factor=10000000000000.0): "
            "slowdown.entries[0].factor: 1e+13 times rank 1's aten::mm (2.1 ms) is 2.1e+10 s, beyond the "
            "simulator's clock (about 146 years); the straggler preset takes it from slowdown.factor"
        ),
        f"skewlens replay: 1 of 3 sweep jobs failed; the others' outputs are in {out}",
    ]
    assert rc == 2
    assert pq.read_table(out / "sweep.parquet").num_rows > 0


@pytest.mark.parametrize("flag", [["--config-dir", "{cfg}"], ["-cd", "{cfg}"], ["--config-dir={cfg}"]])
def test_an_entry_of_a_config_dir_hydra_is_given_is_taken_as_the_searchpaths_is(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    # skewlens's own check knew hydra.searchpath only: 'topology=good: no such entry'
    cfg = tmp_path / "cfg"
    (cfg / "topology").mkdir(parents=True)
    (cfg / "topology" / "good.yaml").write_text(
        (CONF_DIR / "topology" / "switch.yaml").read_text().replace("name: switch", "name: good")
    )
    out = tmp_path / "o"
    args = [f.format(cfg=cfg) for f in flag]
    rc = skewlens_main(["replay", *args, f"trace={run_dir}", f"out={out}", "progress=false", "topology=good"])
    said = capsys.readouterr()  # the run's warnings (rank 3's no-end communication) go with it
    assert rc == 0, said.err
    assert OmegaConf.load(out / "config.yaml").topology.name == "good"
    rc = skewlens_main(["replay", *args, f"trace={run_dir}", f"out={out}", "progress=false", "topology=bad"])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            "skewlens replay: error: topology=bad: no such entry (one of dgx_h100_8x, fat_tree_oversub, "
            "fully_connected, good, ring, switch, two_node_ib; or a YAML file's path)"
        )
    ]


@pytest.mark.parametrize(
    ("group", "text", "error"),
    [
        (  # each of these was Hydra's half a dozen lines, ending with its HYDRA_FULL_ERROR line
            "topology",
            "name: mine\ndims:\n  - {kind: switch, size: 0, bandwith_gbps: 1.0, latency_ns: 5}\n",
            "topology.dims[0]: unknown key 'bandwith_gbps' (did you mean 'bandwidth_gbps'?)",
        ),
        (
            "topology",
            "name: mine\ndims:\n  - {kind: switch, size: 0, bandwidth_gbps: fast, latency_ns: 5}\n",
            "topology.dims[0].bandwidth_gbps: Value 'fast' of type 'str' could not be converted to Float",
        ),
        (
            "slowdown",
            "name: mine\nentries:\n  - {kind: compute, rank: [1], factor: 2}\n",
            "slowdown.entries[0]: unknown key 'rank' (did you mean 'ranks'?)",
        ),
        # a traceback: yaml.scanner.ScannerError
        ("slowdown", "name: mine\n  bad: [\n", "not a YAML slowdown (mapping values are not allowed here)"),
        (  # these named the key, not the file
            "slowdown",
            "name: mine\nentries:\n  - {kind: network, nodes: [1], factor: -0.5}\n",
            "slowdown.entries[0].factor: must be a finite number > 0, got -0.5 (kind=network)",
        ),
        (
            "slowdown",
            "name: mine\nfactor: 0\nentries:\n  - {kind: compute, factor: '${slowdown.factor}'}\n",
            "slowdown.factor: must be a finite number > 0, got 0.0",
        ),
        ("scale", "dp: -4\n", "scale.dp: must be >= 0 (0: off), got -4"),
    ],
)
def test_a_typo_or_wrong_type_in_an_entry_of_the_users_config_dir_is_one_line_naming_its_file(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], group: str, text: str, error: str
) -> None:
    cfg = tmp_path / "cfg"
    (cfg / group).mkdir(parents=True)
    (cfg / group / "mine.yaml").write_text(text)
    args = ["replay", "-cd", str(cfg), f"trace={run_dir}", f"out={tmp_path / 'o'}", f"{group}=mine"]
    assert skewlens_main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"skewlens replay: error: {group}=mine ({cfg / group / 'mine.yaml'}): {error}"
    ]
    assert not (tmp_path / "o").exists()


def _config_dir_topology(tmp_path: Path, run_dir: Path, entry: str, text: str) -> tuple[list[str], Path]:
    """A config directory with the topology entry ``entry`` (YAML ``text``), and the replay's arguments
    choosing it from there, with the output directory they name."""
    cfg = tmp_path / "cfg"
    (cfg / "topology").mkdir(parents=True)
    (cfg / "topology" / f"{entry}.yaml").write_text(text)
    out = tmp_path / "o"
    return [
        "replay",
        "-cd",
        str(cfg),
        f"trace={run_dir}",
        f"out={out}",
        f"topology={entry}",
        "progress=false",
    ], out


def test_an_entry_of_the_users_config_dir_may_extend_a_bundled_one_through_its_defaults_list(
    run_dir: Path, tmp_path: Path
) -> None:
    args, out = _config_dir_topology(
        tmp_path, run_dir, "mine", "defaults:\n  - ring\n  - _self_\nname: mine\nalgorithm: tree\n"
    )
    assert skewlens_main([*args, "comm_mode=model", "perfetto=false"]) == 0
    topology = OmegaConf.load(out / "config.yaml").topology
    assert (topology.name, topology.algorithm, topology.dims[0].kind) == ("mine", "tree", "ring")


def test_an_entry_of_the_users_config_dir_without_a_name_is_named_after_the_entry_as_a_file_is(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # was 'topology.name: missing value', while the same file given by path took its stem
    text = "algorithm: ring\ndims:\n  - {kind: switch, size: 0, bandwidth_gbps: 2.0, latency_ns: 300}\n"
    args, out = _config_dir_topology(tmp_path, run_dir, "noname", text)
    assert skewlens_main([*args, "comm_mode=model", "perfetto=false"]) == 0, capsys.readouterr().err
    assert "replayed with topology noname;" in capsys.readouterr().out
    assert OmegaConf.load(out / "config.yaml").topology.name == "noname"
    # a name on the command line wins over the entry's
    assert skewlens_main([*args, "comm_mode=model", "perfetto=false", "topology.name=lab"]) == 0
    assert OmegaConf.load(out / "config.yaml").topology.name == "lab"


def test_a_config_dir_or_searchpath_that_does_not_exist_is_one_line_naming_it(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nope = tmp_path / "nope"
    for args, error in (
        (["--config-dir", str(nope)], f"--config-dir {nope}: no such directory"),
        ([f"hydra.searchpath=[file://{nope}]"], f"hydra.searchpath: file://{nope}: no such directory"),
    ):
        rc = skewlens_main(["replay", *args, f"trace={run_dir}", f"out={tmp_path / 'o'}", "topology=switch"])
        assert rc == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()


def _site(tmp_path: Path, primary: str, **entries: str) -> Path:
    """A platform team's config directory: the primary config ``site.yaml`` (YAML ``primary``) and
    ``GROUP/NAME.yaml`` entries given as ``GROUP__NAME=text``."""
    cfg = tmp_path / "site"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "site.yaml").write_text(primary)
    for key, text in entries.items():
        group, _, name = key.partition("__")
        (cfg / group).mkdir(exist_ok=True)
        (cfg / group / f"{name}.yaml").write_text(text)
    return cfg


SITE_TOPOLOGY = (
    "name: acme\nalgorithm: hierarchical\ndims:\n"
    "  - {kind: switch, size: 2, bandwidth_gbps: 300.0, latency_ns: 800}\n"
    "  - {kind: fat_tree, size: 0, bandwidth_gbps: 50.0, latency_ns: 3500, links_per_node: 2}\n"
)


def _step_times(out: Path) -> list[int]:
    table = pq.read_table(out / "summary.parquet").sort_by([("rank", "ascending"), ("step", "ascending")])
    return table.column("step_time_ns").to_pylist()


def test_a_primary_config_of_ones_own_replays_as_the_same_choices_given_on_the_command_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    primary = (
        "defaults:\n  - replay\n  - override topology: acme\n  - _self_\ncomm_mode: model\nprogress: false\n"
    )
    cfg = _site(tmp_path, primary, topology__acme=SITE_TOPOLOGY)
    run = [f"trace={run_dir}", "perfetto=false"]
    assert skewlens_main(["replay", "-cd", str(cfg), "-cn", "site", *run, f"out={tmp_path / 'a'}"]) == 0
    given = ["comm_mode=model", "progress=false", "topology=acme", f"out={tmp_path / 'b'}"]
    assert skewlens_main(["replay", "-cd", str(cfg), *run, *given]) == 0
    assert "replayed with topology acme;" in capsys.readouterr().out
    assert _step_times(tmp_path / "a") == _step_times(tmp_path / "b")
    assert skewlens_main(["replay", *run, "comm_mode=model", "progress=false", f"out={tmp_path / 'c'}"]) == 0
    assert _step_times(tmp_path / "c") != _step_times(tmp_path / "a")  # the switch preset, not acme


@pytest.mark.parametrize(
    ("primary", "entry", "error"),
    [
        (  # each was Hydra's five lines ("In 'site': ConfigKeyError raised while composing config: ..."),
            # naming neither file
            "defaults:\n  - replay\n  - override topology: acme\n  - _self_\n",
            SITE_TOPOLOGY.replace("bandwidth_gbps: 50.0", "bandwith_gbps: 50.0"),
            (
                "defaults: topology=acme ({cfg}/topology/acme.yaml): topology.dims[1]: "
                "unknown key 'bandwith_gbps' (did you mean 'bandwidth_gbps'?)"
            ),
        ),
        (  # a latency in µs where ns are asked for
            "defaults:\n  - replay\n  - override topology: acme\n  - _self_\n",
            SITE_TOPOLOGY.replace("latency_ns: 3500", "latency_ns: 3.5"),
            (
                "defaults: topology=acme ({cfg}/topology/acme.yaml): topology.dims[1].latency_ns: "
                "Value '3.5' of type 'float' could not be converted to Integer"
            ),
        ),
        (
            "defaults:\n  - replay\n  - override topology: acme\n  - _self_\n",
            SITE_TOPOLOGY.replace("bandwidth_gbps: 50.0", "bandwidth_gbps: -50.0"),
            (
                "defaults: topology=acme ({cfg}/topology/acme.yaml): topology.dims[1].bandwidth_gbps: "
                "must be > 0, got -50.0"
            ),
        ),
        (  # Hydra's twenty lines, with its search path
            "defaults:\n  - replay\n  - override topology: acme_b\n  - _self_\n",
            SITE_TOPOLOGY,
            (
                "defaults: topology=acme_b: no such entry (one of acme, dgx_h100_8x, fat_tree_oversub, "
                "fully_connected, ring, switch, two_node_ib)"
            ),
        ),
        (  # Hydra's "Multiple values for topology", three lines
            "defaults:\n  - replay\n  - topology: acme\n  - _self_\n",
            SITE_TOPOLOGY,
            (
                "defaults: 'topology: acme': replay.yaml chooses a topology already; "
                "write 'override topology: acme'"
            ),
        ),
        (
            "defaults:\n  - replay\n  - _self_\ncomm_mod: model\n",
            SITE_TOPOLOGY,
            "unknown key 'comm_mod' (did you mean 'comm_mode'?)",
        ),
        (
            "defaults:\n  - replay\n  - _self_\nperfetto_max_events: lots\n",
            SITE_TOPOLOGY,
            "perfetto_max_events: Value 'lots' of type 'str' could not be converted to Integer",
        ),
        (
            "defaults:\n  - replay\n  - _self_\ntopology:\n  dims:\n    - {bandwidth_gbps: 400Gbps}\n",
            SITE_TOPOLOGY,
            "topology.dims[0].bandwidth_gbps: Value '400Gbps' of type 'str' could not be converted to Float",
        ),
    ],
)
def test_a_typo_wrong_type_or_missing_entry_in_a_primary_config_of_ones_own_is_one_line_naming_its_file(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], primary: str, entry: str, error: str
) -> None:
    cfg = _site(tmp_path, primary, topology__acme=entry)
    out = tmp_path / "o"
    assert skewlens_main(["replay", "-cd", str(cfg), "-cn", "site", f"trace={run_dir}", f"out={out}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"skewlens replay: error: {cfg / 'site.yaml'}: {error.format(cfg=cfg)}"
    ]
    assert not out.exists()


def test_the_entries_of_a_directory_a_primary_config_puts_on_hydras_search_path_are_known(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared"
    (shared / "topology").mkdir(parents=True)
    (shared / "topology" / "acme.yaml").write_text(SITE_TOPOLOGY)
    primary = f"defaults:\n  - replay\n  - _self_\nhydra:\n  searchpath:\n    - file://{shared}\n"
    cfg = _site(tmp_path, primary)
    args = ["replay", "-cd", str(cfg), "-cn", "site", f"trace={run_dir}", "comm_mode=model", "progress=false"]
    # was 'topology=acme: no such entry (one of dgx_h100_8x, ...)', though Hydra would find it
    assert skewlens_main([*args, f"out={tmp_path / 'o'}", "topology=acme"]) == 0, capsys.readouterr().err
    assert "replayed with topology acme;" in capsys.readouterr().out
    assert skewlens_main([*args, f"out={tmp_path / 'p'}", "topology=acme_b"]) == 2
    assert "topology=acme_b: no such entry (one of acme, dgx_h100_8x," in capsys.readouterr().err


def test_a_config_path_that_would_take_the_place_of_skewlenss_configs_is_one_line_saying_to_give_cd(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _site(tmp_path, "defaults:\n  - replay\n  - _self_\n")
    # Hydra's "In 'site': Could not load 'replay'" with its search path, and for a relative one "Primary
    # config module 'skewlens.cli.site' not found"
    for where, why in (
        (str(cfg), f"{cfg} holds no replay.yaml"),
        ("site", "Hydra reads a relative one from"),
    ):
        rc = skewlens_main(
            ["replay", "-cp", where, "-cn", "site", f"trace={run_dir}", f"out={tmp_path / 'o'}"]
        )
        assert rc == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0] and f"with -cd {where} (--config-dir)" in err[0], err
    assert not (tmp_path / "o").exists()
    copy = tmp_path / "copy"  # a whole copy of skewlens's configs is what --config-path takes
    shutil.copytree(CONF_DIR, copy)
    rc = skewlens_main(
        ["replay", "-cp", str(copy), f"trace={run_dir}", f"out={tmp_path / 'o'}", "progress=false"]
    )
    assert rc == 0
    assert (tmp_path / "o" / "summary.parquet").is_file()


def test_the_entries_of_a_pip_installed_config_package_are_known_and_checked_as_a_directorys_are(
    run_dir: Path, tmp_path: Path
) -> None:
    # a package of configs that a SearchPathPlugin puts on Hydra's search path (Hydra's documented way);
    # skewlens's own checks knew -cd and hydra.searchpath only: 'topology=acme: no such entry'
    site = tmp_path / "site-packages"
    plugin = site / "hydra_plugins" / "skl_acme_searchpath"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(
        "from hydra.core.config_search_path import ConfigSearchPath\n"
        "from hydra.plugins.search_path_plugin import SearchPathPlugin\n\n\n"
        "class AcmeSearchPath(SearchPathPlugin):\n"
        "    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:\n"
        "        search_path.append(provider='acme', path='pkg://skl_acme_conf')\n"
    )
    conf = site / "skl_acme_conf"
    (conf / "topology").mkdir(parents=True)
    (conf / "__init__.py").write_text("")
    (conf / "topology" / "acme.yaml").write_text(SITE_TOPOLOGY)
    (conf / "topology" / "typo.yaml").write_text(SITE_TOPOLOGY.replace("latency_ns: 800", "latncy_ns: 800"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    def replay(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "skewlens", "replay", f"trace={run_dir}", "comm_mode=model", *args]
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=env)

    res = replay(f"out={tmp_path / 'o'}", "topology=acme", "progress=false", "perfetto=false")
    assert res.returncode == 0, res.stderr
    assert "replayed with topology acme;" in res.stdout
    res = replay(f"out={tmp_path / 'p'}", "topology=typo")  # was Hydra's five lines
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        (
            f"skewlens replay: error: topology=typo ({conf / 'topology' / 'typo.yaml'}): "
            "topology.dims[0]: unknown "
            "key 'latncy_ns' (did you mean 'latency_ns'?)"
        )
    ]


def test_the_root_configs_restated_values_are_the_schemas_defaults_and_the_timeline_cap_is_analyzes() -> None:
    # conf/replay.yaml restates mode, comm_mode, perfetto, perfetto_max_events, progress and lenient over
    # ReplayConfig, whose cap of timeline.json is streaming.DEFAULT_MAX_EVENTS typed again: nothing held the
    # copies equal (the YAML wins, so a changed schema default would be dead, the docs wrong)
    import dataclasses

    import yaml

    from skewlens.replay.streaming import DEFAULT_MAX_EVENTS

    doc = yaml.safe_load((CONF_DIR / "replay.yaml").read_text(encoding="utf-8"))
    restated = {k: v for k, v in doc.items() if k not in ("defaults", "hydra", "trace", "out")}
    defaults = {f.name: f.default for f in dataclasses.fields(ReplayConfig)}
    assert restated == {k: defaults[k] for k in restated}
    assert len(restated) >= 6
    assert defaults["perfetto_max_events"] == DEFAULT_MAX_EVENTS


def test_a_topology_file_with_yaml_aliases_is_refused_in_one_line_before_anything_expands_them(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each alias expands in place: a 443-byte topology of nine aliases nested nine deep held 3.5 GB for over
    # 5 minutes in skewlens replay (and in calibrate --topology); this one nests three deep
    from skewlens.cli.calibrate import load_topology_entry
    from skewlens.replay.errors import ConfigError

    bomb = tmp_path / "bomb.yaml"
    levels = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in (1, 2, 3)]
    bomb.write_text("\n".join([*levels, "name: bomb"]) + "\n")
    said = "YAML alias *a0 at line 2: aliases are not read (each expands in place; write the value out)"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", f"topology={bomb}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"skewlens replay: error: topology={bomb}: {said}"
    with pytest.raises(ConfigError, match=re.escape(f"--topology {bomb}: {said}")):
        load_topology_entry(str(bomb))
    assert not (tmp_path / "o").exists()


def test_a_yaml_file_that_is_a_directory_is_one_config_error_naming_it_before_any_alias_is_looked_for(
    tmp_path: Path,
) -> None:
    from skewlens.cli.options import refuse_yaml_aliases
    from skewlens.replay.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        refuse_yaml_aliases(tmp_path, f"topology={tmp_path}")
    assert str(e.value) == f"topology={tmp_path}: cannot read {tmp_path} (a directory, not a regular file)"


def test_a_path_hydra_takes_only_quoted_is_one_line_saying_how_to_quote_it(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Hydra's grammar refuses a bare non-ASCII letter: its message was four lines pointing at the `ü`
    import shlex

    moved = run_dir.rename(tmp_path / "rün 1")
    out = tmp_path / "o"
    assert skewlens_main(["replay", f"trace={moved}", f"out={out}"]) == 2
    said = capsys.readouterr().err.strip()
    quoted = f"\"trace='{moved}'\""
    assert said == (
        f"skewlens replay: error: trace={moved}: Hydra's override grammar takes this value only quoted: "
        f"{quoted}"
    )
    assert not out.exists()
    assert skewlens_main(["replay", *shlex.split(quoted), f"out={out}"]) == 0  # as it says
    assert (out / "summary.parquet").is_file()


def test_a_grammar_function_written_wrong_is_not_said_to_need_quotes(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "takes this value only quoted: \"slowdown.factor='tag(r,1,0)'\"", which quoted is a string the float
    # setting refuses (question 223)
    out = tmp_path / "o"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "slowdown.factor=tag(r,1,0)"]) == 2
    said = (
        "skewlens replay: error: slowdown.factor=tag(r,1,0): Hydra's override grammar cannot read this "
        "tag(...): see its extended override syntax (choice, range, interval, tag, glob, sort, shuffle; "
        "tag(a,b,choice(1,2)) tags a sweep)"
    )
    assert capsys.readouterr().err.strip().splitlines() == [said]
    assert not out.exists()


def test_a_path_quoted_for_hydra_as_one_argument_replays_from_and_into_that_path(
    run_dir: Path, tmp_path: Path
) -> None:
    # the demo passed trace={run_dir} bare to the skewlens replay it runs: 'skewlens demo --out "my demo"'
    # captured and analysed, then failed with "Hydra's override grammar takes this value only quoted"
    from skewlens.profiler.store.issues import hydra_override

    moved = run_dir.rename(tmp_path / "r\N{LATIN SMALL LETTER U WITH DIAERESIS}n 1, x=2 it's\\")
    out = tmp_path / "-o u t"
    rc = skewlens_main(["replay", hydra_override("trace", str(moved)), hydra_override("out", str(out))])
    assert rc == 0
    assert (out / "summary.parquet").is_file()
    assert hydra_override("out", "runs/x-1") == "out=runs/x-1"  # bare where Hydra takes it so


@pytest.mark.parametrize(
    ("arg", "said"),
    [
        ("out='~/o'", "Hydra expands no ~ (it would make a directory named ~ here)"),
        ("out=~/o", "Hydra's override grammar takes no bare ~, and expands none"),
    ],
)
def test_an_out_under_home_written_with_a_tilde_is_one_line_giving_the_expanded_path(
    arg: str,
    said: str,
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # quoted, Hydra made ./~/o, a directory named ~ (its output in it); bare, its four-line grammar error,
    # and the quoting then advised would have made the same
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert skewlens_main(["replay", f"trace={run_dir}", arg]) == 2
    assert capsys.readouterr().err.strip() == f"skewlens replay: error: {arg}: {said}: out={home}/o"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "run"]  # no ~ made
    assert list(home.iterdir()) == []


@pytest.mark.parametrize(
    ("arg", "said"),
    [
        # a ~user no one here has was Path.expanduser's RuntimeError traceback, quoted or bare
        (
            "trace='~nosuchuser/run'",
            "Hydra expands no ~ (it would look for a directory named ~ here): NO_USER",
        ),
        (
            "trace=~nosuchuser/run",
            "Hydra's override grammar takes no bare ~, and expands none: NO_USER",
        ),
        # a bare sweep's first ~user is the name before its first / or ,
        (
            "trace=~nosuchuser,~/b",
            "Hydra's override grammar takes no bare ~, and expands none: NO_USER",
        ),
        # a sweep's values were quoted as one path, the first ~ alone expanded: "trace='/home/me/a,~/b'"
        (
            "trace=~/a,~/b",
            "Hydra's override grammar takes no bare ~, and expands none: write each ~ out (~ is HOME)",
        ),
        # quoted, a sweep's values were not looked at: ./~/a and ./~/b made, a multirun.yaml beside them
        (
            "out='~/a','~/b'",
            "Hydra expands no ~ (it would make a directory named ~ here): write each ~ out (~ is HOME)",
        ),
    ],
)
def test_a_tilde_that_cannot_be_written_out_as_one_path_is_one_line_saying_so(
    arg: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    other = "trace=run" if arg.startswith("out=") else "out=o"
    assert skewlens_main(["replay", "-m", arg, other]) == 2
    expected = said.replace("HOME", str(tmp_path / "home")).replace(
        "NO_USER", "no user 'nosuchuser' is known here"
    )
    assert capsys.readouterr().err.strip() == f"skewlens replay: error: {arg}: {expected}"
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_job_in_a_worker_whose_output_cannot_encode_its_table_prints_stand_ins(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a joblib worker runs the job without skewlens.cli's main: with PYTHONIOENCODING=ascii and a narrow
    # table, the job's '…' was a UnicodeEncodeError, the job failed and the sweep exited 2
    import io

    from skewlens.cli.replay import main as replay_main

    monkeypatch.setenv("COLUMNS", "50")  # the table's headers cut with …
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", write_through=True))
    assert replay_main([f"trace={run_dir}", f"out={tmp_path / 'o'}"]) == 0
    printed = raw.getvalue().decode("ascii")
    assert "~" in printed and "\\u2026" not in printed


def test_a_replays_config_yaml_replays_it_again_from_anywhere(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it was no primary config ('config: expected a ReplayConfig, got dict'), and held the paths as typed
    monkeypatch.chdir(run_dir.parent)
    args = ["replay", "trace=run", "out=first", "progress=false", "comm_mode=model", "topology=two_node_ib"]
    assert skewlens_main([*args, "slowdown=straggler", "slowdown.rank=1", "slowdown.factor=1.7"]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    first = tmp_path / "first"
    assert OmegaConf.load(first / "config.yaml").out == str(run_dir.parent / "first")  # given as out=first
    assert "${" not in (first / "config.yaml").read_text()  # resolved: no ${slowdown.factor} left
    assert skewlens_main(["replay", "-cd", str(first), "-cn", "config", f"out={tmp_path / 'again'}"]) == 0
    again = tmp_path / "again"
    assert pq.read_table(again / "summary.parquet").equals(pq.read_table(first / "summary.parquet"))
    assert pq.read_table(again / "timeline.parquet").equals(pq.read_table(first / "timeline.parquet"))
    conf = OmegaConf.load(again / "config.yaml")
    assert (conf.trace, conf.out) == (str(run_dir), str(again))
    assert conf.slowdown.entries[0].factor == 1.7 and conf.topology.name == "two_node_ib"
    assert list(elsewhere.iterdir()) == []


def test_a_group_override_of_a_saved_config_that_sets_the_group_says_the_files_values_win(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # -cd OUT -cn config topology=ring replayed the saved two_node_ib (the file's values come after the
    # entry the override chooses) and said nothing
    first, again = tmp_path / "first", tmp_path / "again"
    base = [f"trace={run_dir}", "progress=false", "comm_mode=model"]
    assert skewlens_main(["replay", *base, f"out={first}", "topology=two_node_ib"]) == 0
    capsys.readouterr()
    assert skewlens_main(["replay", "-cd", str(first), "-cn", "config", f"out={again}", "topology=ring"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "sets topology" in line]
    said = (
        f"skewlens replay: warning: topology=ring: {first / 'config.yaml'} sets topology itself, and the "
        "file's values win over the chosen entry's (this replays topology two_node_ib); change one by its "
        "key (topology.algorithm=tree), or delete the file's topology: block to replay ring"
    )
    assert warnings == [said]
    assert OmegaConf.load(again / "config.yaml").topology.name == "two_node_ib"  # as the warning says
    # of two overrides of the group, the last, which Hydra takes, is the one the warning names
    warn_group_overrides(["-cd", str(first), "-cn", "config", "topology=switch", "topology=ring"])
    assert capsys.readouterr().err.splitlines() == [said]
    # a key of the group's, and a group the file leaves to its defaults, are no such case
    (mine := tmp_path / "cfg").mkdir()
    (mine / "mine.yaml").write_text("defaults: [replay, _self_]\ncomm_mode: model\n")
    for args in (
        ["-cd", str(first), "-cn", "config", "topology.algorithm=tree"],
        ["-cd", str(mine), "-cn", "mine", "topology=ring"],
        ["topology=ring"],
    ):
        warn_group_overrides(args)
        assert capsys.readouterr().err == ""


def test_every_group_a_warning_can_name_has_an_example_key_that_its_schema_takes() -> None:
    # warn_group_overrides reads _GROUP_KEY_EXAMPLES[group] for any group of GROUP_SCHEMAS: a group added
    # to one and not the other would be a KeyError's traceback, not a warning
    assert set(_GROUP_KEY_EXAMPLES) == set(GROUP_SCHEMAS)
    for group, example in _GROUP_KEY_EXAMPLES.items():
        key, _, value = example.partition("=")
        first, field = key.split(".")[:2]
        assert first == group and value
        assert field in {f.name for f in dataclasses.fields(GROUP_SCHEMAS[group])}, example


def test_config_yaml_names_a_relative_trace_and_out_as_the_same_replay_given_absolute_paths_does(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from a subdirectory, trace=../run was written as '<cwd>/../run' (and out likewise), where the same
    # replay given absolute paths wrote '<parent>/run', and its timeline.json's run_dir the resolved path
    (sub := run_dir.parent / "sub").mkdir()
    monkeypatch.chdir(sub)
    assert skewlens_main(["replay", "trace=../run", "out=../rel", "progress=false"]) == 0
    absolute_args = [f"trace={run_dir}", f"out={run_dir.parent / 'abs'}", "progress=false"]
    assert skewlens_main(["replay", *absolute_args]) == 0
    rel, absolute = ((run_dir.parent / d / "config.yaml").read_text() for d in ("rel", "abs"))
    conf = OmegaConf.create(rel)
    assert (conf.trace, conf.out) == (str(run_dir), str(run_dir.parent / "rel"))
    assert rel == absolute.replace(str(run_dir.parent / "abs"), str(run_dir.parent / "rel"))
    timeline = json.loads((run_dir.parent / "rel" / "timeline.json").read_text())
    assert timeline["otherData"]["run_dir"] == conf.trace


def test_a_primary_config_whose_run_dir_is_not_out_is_one_line_and_writes_nowhere(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the replay went into the config's hydra.run.dir, or Hydra's outputs/DATE/TIME, with exit 0 and out empty
    monkeypatch.chdir(tmp_path)
    (cfg := tmp_path / "cfg").mkdir()
    (cfg / "mine.yaml").write_text("defaults:\n  - replay\n  - _self_\nhydra:\n  run:\n    dir: elsewhere\n")
    (cfg / "older.yaml").write_text(f"trace: {run_dir}\nout: o\nmode: sim\n")  # an older config.yaml
    assert skewlens_main(["replay", "-cd", str(cfg), "-cn", "mine", f"trace={run_dir}", "out=o"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            f"skewlens replay: error: out=o: Hydra would write this replay into {tmp_path / 'elsewhere'} "
            "(hydra.run.dir of the primary config 'mine'); a primary config of your own extends replay.yaml, "
            "which sets hydra.run.dir to out: begin it with 'defaults: [replay, _self_]' and leave "
            "hydra.run.dir and hydra.sweep.dir alone"
        )
    ]
    # (in a process of its own: without replay.yaml, Hydra sets up its logging, for this process)
    older_cmd = [sys.executable, "-m", "skewlens", "replay", "-cd", str(cfg), "-cn", "older"]
    older = subprocess.run(older_cmd, capture_output=True, text=True, timeout=120, check=False)
    assert older.returncode == 2
    assert older.stderr.startswith("skewlens replay: error: config: the primary config does not extend")
    assert "begin it with 'defaults: [replay, _self_]'" in older.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg", "run"]


def test_a_primary_config_that_chose_no_topology_is_one_line_naming_it() -> None:
    # one extending the schema (replay_schema) but not replay.yaml leaves the topology group unchosen: the
    # check for keys the schema lacks iterated the missing group and raised omegaconf's traceback
    cfg = OmegaConf.structured(ReplayConfig)
    cfg.trace, cfg.out = "run", "o"
    with pytest.raises(ConfigError, match=r"^topology: missing value \(give it on the command line"):
        to_config(cfg)


def test_a_failed_replay_leaves_the_directory_it_was_run_in_and_what_is_in_it(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # without out, replay.yaml runs the job in the current directory, which Hydra did not make: a failed
    # job took it for Hydra's outputs/DATE/TIME, removed its .hydra and job log, then the directory itself
    # where nothing else was in it
    (work := tmp_path / "work").mkdir()
    monkeypatch.chdir(work)
    assert skewlens_main(["replay", f"trace={run_dir}"]) == 2
    assert "error: out: missing value" in capsys.readouterr().err
    assert work.is_dir() and list(work.iterdir()) == []
    (work / ".hydra").mkdir()
    for f in (work / ".hydra" / "config.yaml", work / "replay.log"):
        f.write_text("mine\n")
    assert skewlens_main(["replay", f"trace={run_dir}"]) == 2
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == [
        ".hydra",
        ".hydra/config.yaml",
        "replay.log",
    ]
    # a run dir outside the current directory: not Hydra's below it, left alone, and still one line
    (cfg := tmp_path / "cfg").mkdir()
    (cfg / "mine.yaml").write_text(
        f"defaults:\n  - replay\n  - _self_\nhydra:\n  run:\n    dir: {tmp_path / 'out'}\n"
    )
    assert skewlens_main(["replay", "-cd", str(cfg), "-cn", "mine", f"trace={run_dir}", "out=o"]) == 2
    assert "error: out=o: Hydra would write this replay into" in capsys.readouterr().err
    # a config not extending replay.yaml (in a process of its own: Hydra sets up its logging): Hydra's
    # outputs/DATE/TIME, made for the job, go, and the empty directory it was run in stays
    (cfg / "older.yaml").write_text(f"trace: {run_dir}\nmode: sim\n")  # (with out: the test above)
    (empty := tmp_path / "empty").mkdir()
    cmd = [sys.executable, "-m", "skewlens", "replay", "-cd", str(cfg), "-cn", "older"]
    assert subprocess.run(cmd, cwd=empty, capture_output=True, timeout=120, check=False).returncode == 2
    assert empty.is_dir() and list(empty.iterdir()) == []


@pytest.mark.parametrize(
    ("stem", "name"),
    [("400", "mine"), ("1e3", "mine"), ("true", "mine"), ("null", "mine"), ("mytopo", ""), ("400", "")],
)
def test_a_topology_file_named_like_a_number_or_a_constant_replays_under_its_own_name(
    run_dir: Path, tmp_path: Path, stem: str, name: str
) -> None:
    # the file is an entry of Hydra's group named after it, and `topology=400` is an int
    # to Hydra's grammar: a traceback, 'Config group override must be a string or a list. Got int'; a file
    # without a name is named after it (was 'topology.name: missing value')
    topo = tmp_path / f"{stem}.yaml"
    topo.write_text(
        f"{'name: ' + name if name else ''}\nalgorithm: ring\n"
        "dims:\n  - {kind: switch, size: 0, bandwidth_gbps: 2.0, latency_ns: 300}\n"
    )
    out = tmp_path / "o"
    args = [
        "replay",
        f"trace={run_dir}",
        f"out={out}",
        f"topology={topo}",
        "comm_mode=model",
        "perfetto=false",
    ]
    assert skewlens_main(args) == 0
    saved = OmegaConf.load(out / "config.yaml")
    assert (saved.topology.name, saved.topology.dims[0].bandwidth_gbps) == (name or stem, 2.0)


def test_a_sweep_whose_primary_config_sets_its_own_sweep_dir_is_one_line_naming_hydra_sweep_dir(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # in a sweep the directory Hydra runs the jobs in is hydra.sweep.dir, and the line names that key
    monkeypatch.chdir(tmp_path)
    (cfg := tmp_path / "cfg").mkdir()
    (cfg / "mine.yaml").write_text(
        "defaults:\n  - replay\n  - _self_\nhydra:\n  sweep:\n    dir: elsewhere\n"
    )
    code = skewlens_main(["replay", "-m", "-cd", str(cfg), "-cn", "mine", f"trace={run_dir}", "out=o"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"out=o: Hydra would write this replay into {tmp_path / 'elsewhere'} (hydra.sweep.dir of " in err
    assert "which sets hydra.sweep.dir to out" in err and "hydra.run.dir of" not in err


def test_an_out_reached_through_a_symbolic_link_is_the_directory_hydra_runs_the_job_in(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # out=link/o and Hydra's run dir name one directory by two paths: the replay goes there, not refused
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    assert skewlens_main(["replay", f"trace={run_dir}", "out=link/o", "progress=false"]) == 0
    assert (tmp_path / "real" / "o" / "summary.parquet").is_file()


def test_a_relative_out_of_a_job_hydra_runs_in_its_directory_is_that_directory(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with hydra.job.chdir=true the job runs in out: a relative out is still where the command was given
    monkeypatch.chdir(tmp_path)
    assert skewlens_main(["replay", "trace=run", "out=o", "progress=false", "hydra.job.chdir=true"]) == 0
    assert (tmp_path / "o" / "summary.parquet").is_file()
    assert OmegaConf.load(tmp_path / "o" / "config.yaml").out == str(tmp_path / "o")


def test_a_failed_replay_into_an_out_holding_files_named_as_hydras_keeps_them(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # out is the directory Hydra runs the job in, not one it made for the job: a replay.log kept there (a
    # tee of an earlier replay's output) and a .hydra/config.yaml are the user's, and stay
    monkeypatch.chdir(tmp_path)
    (tmp_path / "o" / ".hydra").mkdir(parents=True)
    for f in (tmp_path / "o" / "replay.log", tmp_path / "o" / ".hydra" / "config.yaml"):
        f.write_text("mine\n")
    assert skewlens_main(["replay", "trace=no_such_run", "out=o", "progress=false"]) == 2
    assert sorted(str(p.relative_to(tmp_path / "o")) for p in (tmp_path / "o").rglob("*")) == [
        ".hydra",
        ".hydra/config.yaml",
        "replay.log",
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        ["slowdown=straggler", "+real.nproc=2", "+scale.seed=3"],  # null: Hydra appends there
        ["+trace=/runs/a"],  # a required setting without its value ('???'): Hydra takes the +
        ["+hydra.job.env_set.FOO=1"],  # Hydra's own keys are Hydra's to add
        ["-cn", "mine", "+slowdown.factor=2"],  # the user's primary config may lack the key: Hydra's to say
    ],
)
def test_a_plus_override_hydra_takes_passes_the_check_before_anything_runs(overrides: list[str]) -> None:
    check_types(overrides)  # (composed: +trace and +hydra.job.env_set.FOO end as /runs/a and '1')


def test_the_sweeper_params_of_a_replay_yaml_in_a_config_dir_are_not_checked_as_hydra_takes_skewlenss(
    tmp_path: Path,
) -> None:
    # -cn replay is skewlens's replay.yaml (Hydra searches it first: --cfg hydra shows params: null), so a
    # mistake in a replay.yaml of -cd's is not the sweep's; a pkg:// searchpath's files are left to Hydra
    (tmp_path / "replay.yaml").write_text("hydra:\n  sweeper:\n    params:\n      slowdown.factr: 1,2\n")
    (tmp_path / "mine.yaml").write_text("hydra:\n  sweeper:\n    params:\n      slowdown.factr: 1,2\n")
    check_sweeper_params(["-cd", str(tmp_path), "-cn", "replay"])
    check_sweeper_params(["-cn", "mine", "hydra.searchpath=[pkg://somepkg]"])
    with pytest.raises(ConfigError, match=r"mine\.yaml: hydra\.sweeper\.params: slowdown\.factr: no such"):
        check_sweeper_params(["-cd", str(tmp_path), "-cn", "mine"])


def test_a_pkg_searchpath_entry_is_its_packages_directory_and_none_where_that_is_not_one_directory_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skewlens.cli.replay import user_conf_dirs

    json_dir = Path(json.__file__).parent
    assert user_conf_dirs(["hydra.searchpath=[pkg://json]"]) == [json_dir]
    # a directory the package lacks, or a package that is not there: Hydra's to say, none listed
    assert user_conf_dirs(["hydra.searchpath=[pkg://json/nope]"]) is None
    assert user_conf_dirs(["hydra.searchpath=[pkg://skl_no_such_package]"]) is None
    # a module path Python refuses to look up (an empty or relative name, a missing parent): no traceback
    for name in ("", ".json", "json.nope.deep"):
        assert user_conf_dirs([f"hydra.searchpath=[pkg://{name}]"]) is None, name
    # a namespace package over two directories: which one holds the entries is not known here
    for part in ("a", "b"):
        (tmp_path / part / "skl_ns_conf" / "topology").mkdir(parents=True)
        monkeypatch.syspath_prepend(str(tmp_path / part))
    assert user_conf_dirs(["hydra.searchpath=[pkg://skl_ns_conf]"]) is None


def test_a_primary_configs_searchpath_is_listed_unless_the_command_line_gives_one_a_missing_one_named(
    tmp_path: Path,
) -> None:
    from skewlens.cli.replay import user_conf_dirs

    missing, other = tmp_path / "missing", tmp_path / "other"
    other.mkdir()
    cfg = _site(
        tmp_path, f"defaults:\n  - replay\n  - _self_\nhydra:\n  searchpath:\n    - file://{missing}\n"
    )
    with pytest.raises(ConfigError) as e:
        user_conf_dirs(["-cd", str(cfg), "-cn", "site"])
    assert str(e.value) == f"{cfg / 'site.yaml'}: hydra.searchpath: file://{missing}: no such directory"
    # the command line's hydra.searchpath takes the place of the file's, as Hydra composes it
    given = ["-cd", str(cfg), "-cn", "site", f"hydra.searchpath=[file://{other}]"]
    assert user_conf_dirs(given) == [cfg, other]


def test_the_primary_config_checked_is_the_last_cn_found_in_the_first_directory_that_holds_it(
    tmp_path: Path,
) -> None:
    from skewlens.cli.replay import check_primary_config

    cfg = _site(tmp_path, "defaults:\n  - replay\n  - _self_\ncomm_mod: model\n")
    with pytest.raises(ConfigError) as e:  # the last -cn wins, as in Hydra
        check_primary_config(["-cd", str(cfg), "-cn", "replay", "-cn", "site"])
    assert str(e.value) == f"{cfg / 'site.yaml'}: unknown key 'comm_mod' (did you mean 'comm_mode'?)"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError) as e:  # the first directory has no site.yaml: the second's
        check_primary_config(["-cd", str(empty), f"hydra.searchpath=[file://{cfg}]", "-cn", "site"])
    assert str(e.value).startswith(f"{cfg / 'site.yaml'}: unknown key 'comm_mod'")
    with pytest.raises(ConfigError) as e:  # named with its suffix, as Hydra takes it
        check_primary_config(["-cd", str(cfg), "-cn", "site.yaml"])
    assert str(e.value).startswith(f"{cfg / 'site.yaml'}: unknown key 'comm_mod'")
    # a replay.yaml of the user's is not the primary config: Hydra takes skewlens's, which comes first
    shutil.copy(cfg / "site.yaml", cfg / "replay.yaml")
    check_primary_config(["-cd", str(cfg), "-cn", "replay.yaml"])


def test_a_relative_config_path_is_refused_though_it_holds_a_replay_yaml_and_a_packages_is_left_to_hydra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skewlens.cli.replay import check_config_path

    shutil.copytree(CONF_DIR, tmp_path / "copy")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="Hydra reads a relative one from skewlens's package"):
        check_config_path(["-cp", "copy"])
    check_config_path(["-cp", str(tmp_path / "copy")])
    check_config_path(["-cp", "pkg://skl_site_conf"])


def test_a_primary_configs_choice_is_checked_with_the_command_lines_settings_and_not_where_it_replaces_it(
    tmp_path: Path,
) -> None:
    from skewlens.cli.replay import check_primary_config

    bad = SITE_TOPOLOGY.replace("bandwidth_gbps: 50.0", "bandwidth_gbps: -50.0")
    cfg = _site(
        tmp_path, "defaults:\n  - replay\n  - override topology: acme\n  - _self_\n", topology__acme=bad
    )
    site = ["-cd", str(cfg), "-cn", "site"]
    with pytest.raises(ConfigError, match=r"topology\.dims\[1\]\.bandwidth_gbps: must be > 0, got -50\.0"):
        check_primary_config(site)
    check_primary_config([*site, "topology.dims.1.bandwidth_gbps=50"])  # the setting mends the file's value
    check_primary_config([*site, "topology=switch"])  # the command line's choice replaces the file's
    check_primary_config([*site, "~topology"])  # and so does deleting it


def test_a_primary_configs_group_choice_without_override_is_refused_only_where_it_extends_replay(
    tmp_path: Path,
) -> None:
    from skewlens.cli.replay import check_primary_config

    cfg = _site(tmp_path, "defaults:\n  - topology: acme\n  - _self_\n", topology__acme=SITE_TOPOLOGY)
    check_primary_config(["-cd", str(cfg), "-cn", "site"])  # no replay.yaml chose one before it
    # two groups in one defaults item is Hydra's to say, not a traceback of ours
    (cfg / "site.yaml").write_text("defaults:\n  - replay\n  - {topology: acme, slowdown: none}\n")
    check_primary_config(["-cd", str(cfg), "-cn", "site"])


def test_a_primary_config_that_is_not_yaml_or_not_a_mapping_is_left_to_hydra_not_a_traceback(
    tmp_path: Path,
) -> None:
    from skewlens.cli.replay import check_primary_config

    cfg = _site(tmp_path, "")
    for text in ("a: [\n", "- 1\n", "\xff"):
        (cfg / "site.yaml").write_bytes(text.encode("latin-1"))
        check_primary_config(["-cd", str(cfg), "-cn", "site"])


def test_a_users_entry_chosen_on_the_command_line_is_checked_with_the_command_lines_settings_of_it(
    tmp_path: Path,
) -> None:
    from skewlens.cli.replay import check_groups

    slow = "name: mine\nfactor: 0\nentries:\n  - {kind: compute, factor: '${slowdown.factor}'}\n"
    cfg = _site(tmp_path, "", slowdown__mine=slow)
    with pytest.raises(ConfigError) as e:
        check_groups(["-cd", str(cfg), "slowdown=mine"])
    assert str(e.value) == (
        f"slowdown=mine ({cfg / 'slowdown' / 'mine.yaml'}): slowdown.factor: "
        "must be a finite number > 0, got 0.0"
    )
    check_groups(["-cd", str(cfg), "slowdown=mine", "slowdown.factor=2"])  # the setting mends the file's 0


def test_a_search_path_plugins_directory_is_listed_and_none_where_a_plugins_package_is_not_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hydra._internal.utils as hydra_utils
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.config_search_path import ConfigSearchPath

    from skewlens.cli.replay import user_conf_dirs

    plugged: list[tuple[str, str]] = []

    def search_path(config_dir: str | None) -> ConfigSearchPath:
        path = ConfigSearchPathImpl()
        for provider, where in [("hydra", "pkg://hydra.conf"), *plugged]:
            path.append(provider, where)
        return path

    monkeypatch.setattr(hydra_utils, "create_config_search_path", search_path)
    plugged.append(("acme", f"file://{tmp_path}"))
    assert user_conf_dirs(["-cd", str(CONF_DIR)]) == [CONF_DIR, tmp_path]
    plugged.append(("zipped", "pkg://json/nope"))  # Hydra reads it; its entries are not listed here
    assert user_conf_dirs(["-cd", str(CONF_DIR)]) is None


def test_a_replay_of_a_topology_file_puts_nothing_in_the_temporary_directory_and_leaves_no_entry_behind(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the file was copied into TMPDIR/skewlens-topology-*/ for as long as the replay ran: one killed there
    # by SIGKILL (the OOM killer, a scheduler's time limit) left it behind, one more per kill
    import tempfile

    import skewlens.cli.replay as cli_replay

    (temp := tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    seen: list[list[str]] = []
    job = cli_replay.run_job

    def run_job(*a: object) -> None:
        seen.append(sorted(p.name for p in temp.iterdir()))  # what a SIGKILL here would leave
        job(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(cli_replay, "run_job", run_job)
    topo = tmp_path / "mine.yaml"
    topo.write_text((CONF_DIR / "topology" / "ring.yaml").read_text())
    args = ["replay", f"trace={run_dir}", "comm_mode=model", "perfetto=false", "progress=false"]
    assert skewlens_main([*args, f"out={tmp_path / 'a'}", f"topology={topo}"]) == 0
    assert seen == [[]] and list(temp.iterdir()) == []
    # the file's entry is the command's own: the next command of this process does not find it by name
    from hydra.core.config_store import ConfigStore

    assert "mine.yaml" not in ConfigStore.instance().repo.get("topology", {})
    assert skewlens_main([*args, f"out={tmp_path / 'b'}", "topology=mine"]) == 2
    assert (
        capsys.readouterr().err.splitlines()[-1].startswith("skewlens replay: error: topology=mine: no such")
    )


@pytest.mark.parametrize(
    "header", ["# @package _global_", "#@package _global_", "# @key v\n# @package _global_"]
)
def test_a_topology_file_whose_header_puts_it_at_the_configs_root_replays_under_the_files_topology(
    run_dir: Path, tmp_path: Path, header: str
) -> None:
    # a file with '# @package _global_' holds 'topology:' itself: stored as Hydra reads the header, in the
    # package it names, and given no name at its root (the config has no key 'name': refused). Hydra reads
    # '#@package' too, which the checks' own test of the header's text refused ('topology=mine.yaml:
    # unknown key 'topology'')
    ring = (CONF_DIR / "topology" / "ring.yaml").read_text().replace("latency_ns: 500", "latency_ns: 321")
    body = [f"  {line}" for line in ring.splitlines() if line and not line.startswith(("#", "name:"))]
    topo = tmp_path / "mine.yaml"
    topo.write_text("\n".join([header, "topology:", *body, ""]))
    args = ["replay", f"trace={run_dir}", "comm_mode=model", "perfetto=false", "progress=false"]
    assert skewlens_main([*args, f"out={tmp_path / 'out'}", f"topology={topo}"]) == 0
    written = OmegaConf.load(tmp_path / "out" / "config.yaml").topology
    assert (written.name, written.algorithm, written.dims[0].latency_ns) == ("mine", "ring", 321)
    # an item of its list set by key: it was refused, 'topology.dims.0.latency_ns: topology mine.yaml has 0
    # items in topology.dims' (the check read the file as if it held the topology at its root)
    latency = "topology.dims.0.latency_ns=777"
    assert skewlens_main([*args, f"out={tmp_path / 'out'}", f"topology={topo}", latency]) == 0
    assert OmegaConf.load(tmp_path / "out" / "config.yaml").topology.dims[0].latency_ns == 777


def test_a_topology_file_whose_package_header_has_no_package_is_one_line_naming_it(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = tmp_path / "mine.yaml"
    topo.write_text("# @package\n" + (CONF_DIR / "topology" / "ring.yaml").read_text())
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'out'}", f"topology={topo}", "progress=false"]
    assert skewlens_main(args) == 2
    said = f"skewlens replay: error: topology={topo}: its header: Expected header format: KEY VALUE, got "
    assert capsys.readouterr().err.splitlines() == [f"{said}'@package'"]
    assert not (tmp_path / "out").exists()


def test_a_topology_file_named_as_an_entry_of_a_zipped_config_package_replays_under_the_files_topology(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the entries of a zipped package on Hydra's search path cannot be listed, and Hydra looks in it before
    # the ConfigStore: the file's entry is file_<stem>, never the package's entry of the same name
    import zipfile

    ring = (CONF_DIR / "topology" / "ring.yaml").read_text()
    with zipfile.ZipFile(tmp_path / "confs.zip", "w") as z:
        z.writestr("zipped_confs/__init__.py", "")
        z.writestr("zipped_confs/topology/mine.yaml", ring.replace("latency_ns: 500", "latency_ns: 999"))
    monkeypatch.syspath_prepend(str(tmp_path / "confs.zip"))
    (topo := tmp_path / "mine.yaml").write_text(ring.replace("latency_ns: 500", "latency_ns: 321"))
    args = ["replay", f"trace={run_dir}", "comm_mode=model", "perfetto=false", "progress=false"]
    searched = "hydra.searchpath=[pkg://zipped_confs]"
    assert skewlens_main([*args, f"out={tmp_path / 'out'}", searched, f"topology={topo}"]) == 0
    assert OmegaConf.load(tmp_path / "out" / "config.yaml").topology.dims[0].latency_ns == 321


@pytest.mark.filterwarnings("ignore:Experimental rerun CLI option")
def test_hydras_rerun_of_a_replays_config_pickle_replays_it_and_any_other_file_is_one_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    pickled = "+hydra.callbacks.save_job_info={_target_:hydra.experimental.callbacks.PickleJobInfoCallback}"
    args = ["replay", f"trace={run_dir}", f"out={out}", "hydra.output_subdir=.hydra", pickled]
    assert skewlens_main(args) == 0
    summary = (out / "summary.parquet").read_bytes()
    (out / "summary.parquet").unlink()
    assert skewlens_main(["replay", "--experimental-rerun", str(out / ".hydra" / "config.pickle")]) == 0
    assert (out / "summary.parquet").read_bytes() == summary
    capsys.readouterr()
    garbage = tmp_path / "g" / "config.pickle"
    garbage.parent.mkdir()
    garbage.write_text("garbage\n")
    # each was Hydra's traceback: ValueError: File ... does not exist!, IsADirectoryError, ValueError: invalid
    # literal for int(), AttributeError: 'JobReturn' object has no attribute 'hydra' (none unpickled to tell)
    give = "give the config.pickle that hydra.callbacks.save_job_info (Hydra's PickleJobInfoCallback) wrote"
    give += " into a replay's .hydra/"
    for path, error in (
        (tmp_path / "nope.pickle", f"no such file; {give}"),
        (out, f"not a file; {give}"),
        (garbage, f"not a pickle; {give}"),
        (out / ".hydra" / "job_return.pickle", f"not a replay's config.pickle; {give}"),
    ):
        assert skewlens_main(["replay", "--experimental-rerun", str(path)]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"skewlens replay: error: --experimental-rerun {path}: {error}"
        ]


def test_a_primary_config_that_is_not_there_is_one_line_naming_where_it_was_looked_for(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = [f"trace={run_dir}", f"out={tmp_path / 'o'}"]
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "site.yaml").write_text("defaults:\n  - replay\n  - _self_\ncomm_mode: model\n")
    # each was Hydra's nine lines: "Cannot find primary config 'sit'. Check that it's in your config search
    # path.", the search path, "Set the environment variable HYDRA_FULL_ERROR=1 ..."
    for args, error in (
        (
            ["-cd", str(cfg), "-cn", "sit"],
            (
                f"--config-name sit: no sit.yaml in skewlens's configs or {cfg} (primary configs there: "
                "replay, site); did you mean 'site'?"
            ),
        ),
        (
            ["-cn", "site"],
            (
                "--config-name site: no site.yaml in skewlens's configs (no -cd given) (primary "
                "configs there: replay)"
            ),
        ),
        # Hydra finds the primary config before it reads hydra.searchpath, which holds groups' entries
        (
            [f"hydra.searchpath=[file://{cfg}]", "-cn", "site"],
            (
                f"--config-name site: {cfg} is on hydra.searchpath, which Hydra searches for the config "
                f"groups' entries but not for the primary config; give -cd {cfg}"
            ),
        ),
    ):
        assert skewlens_main(["replay", *args, *run]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()
    for args in (["-cd", str(cfg), "-cn", "site.yaml"], ["-cn", "replay_schema"]):  # Hydra's names for them
        assert skewlens_main(["replay", *args, *run, "--cfg", "job", "-p", "comm_mode"]) == 0
    assert capsys.readouterr().out.split() == ["model", "as_recorded"]


@pytest.mark.parametrize(
    ("override", "error"),
    [  # each was Hydra's three lines ('Value ... is not a valid bool', 'Key 'chdr' not in 'JobConf'', 'Set
        # the environment variable HYDRA_FULL_ERROR=1 ...')
        ("hydra.job.chdir=abc", "hydra.job.chdir=abc: Value 'abc' is not a valid bool (type str)"),
        ("hydra.mode=abc", "hydra.mode=abc: Invalid value 'abc', expected one of [RUN, MULTIRUN]"),
        (
            "hydra.job.chdr=true",
            (
                "hydra.job.chdr: no such setting (hydra.job has name, chdir, override_dirname, id, num, "
                "config_name, env_set, env_copy, config; did you mean 'chdir'?)"
            ),
        ),
    ],
)
def test_a_hydra_setting_of_the_wrong_type_or_name_is_one_line_naming_it(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, error: str
) -> None:
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", override]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {error}"]
    assert not (tmp_path / "o").exists()


def test_hydras_settings_of_the_right_type_and_those_its_schema_leaves_open_pass_the_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    given = [
        "hydra.job.chdir=true",
        "hydra.mode=RUN",
        "hydra.verbose=[skewlens]",
        "hydra.job.config.override_dirname.exclude_keys=[out,trace]",
        "+hydra.job.env_set.FOO=bar",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
    ]
    args = ["replay", "trace=RUN", "out=OUT", *given, "--cfg", "hydra", "-p", "hydra.job"]
    assert skewlens_main(args) == 0
    job = OmegaConf.create(capsys.readouterr().out)
    assert (job.chdir, job.env_set.FOO, list(job.config.override_dirname.exclude_keys)) == (
        True,
        "bar",
        ["out", "trace"],
    )


@pytest.mark.parametrize(
    "given",
    [  # ~slowdown slowdown=straggler replayed no slowdown, silently (as Hydra does); ~perfetto perfetto=false
        # was Hydra's six lines. slowdown=straggler ~slowdown deletes it: the later wins
        ["~slowdown", "slowdown=straggler"],
        ["~perfetto", "perfetto=false"],
        ["~slowdown", "slowdown=straggler,none"],
    ],
)
def test_a_value_given_after_its_key_is_deleted_is_one_line_naming_both(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], given: list[str]
) -> None:
    multirun = ["-m"] if "," in given[1] else []
    assert skewlens_main(["replay", *multirun, f"trace={run_dir}", f"out={tmp_path / 'o'}", *given]) == 2
    said = "Hydra drops a value given after its key is deleted; give one of them"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"skewlens replay: error: {given[0]} and then {given[1]}: {said}"
    ]
    assert not (tmp_path / "o").exists()
