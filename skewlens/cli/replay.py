"""``skewlens replay``: the Hydra app around :func:`skewlens.replay.driver.replay_run`.

    skewlens replay trace=RUN_DIR out=OUT_DIR topology=dgx_h100_8x slowdown=straggler comm_mode=model
    skewlens replay -m trace=RUN_DIR out=SWEEP_DIR comm_mode=model slowdown=straggler \
        slowdown.factor=1.0,1.25,1.5 topology=ring,switch

The config groups are package data (``skewlens.paths.CONF_DIR``: ``replay.yaml``, ``topology/``,
``slowdown/``; ``conf/`` in a checkout); every value can be overridden on the command line.
``OmegaConf.to_object`` runs once, here; a bad value is a :class:`~skewlens.replay.errors.ConfigError`
naming the key (one line, exit 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import os
import re
import shlex
import shutil
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra.conf import HydraConf
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, Override, QuotedString
from hydra.errors import OverrideParseException
from hydra.plugins.config_source import ConfigSource
from hydra.types import RunMode
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException
from rich.console import Console

from skewlens.cli.options import refuse_yaml_aliases
from skewlens.console import (
    QuietPipe,
    encodable_output,
    print_line,
    print_warning,
    report_console,
    undecodable_name,
)
from skewlens.paths import CONF_DIR, conf_entries, doc
from skewlens.profiler.atomic import why_not_created
from skewlens.profiler.errors import SkewlensError, out_of_memory
from skewlens.profiler.store.issues import counted, lenient_line, override, run_notes, untraced_members_line
from skewlens.progress import NO_PROGRESS
from skewlens.replay.config import (
    ReplayConfig,
    ScaleConfig,
    SlowdownConfig,
    TopologyConfig,
    file_key_problem,
    holds_no,
)
from skewlens.replay.driver import replay_run
from skewlens.replay.errors import ConfigError, first_line, missing_value
from skewlens.replay.execution import clock_note
from skewlens.replay.outputs import (
    SUMMARY_PARQUET,
    TIMELINE_JSON,
    TIMELINE_PARQUET,
    override_key,
    override_setting,
    sweep_record,
)
from skewlens.replay.render import gpu_idle_table, summary_table
from skewlens.replay.slowdown import Slowdown
from skewlens.replay.sweep import append_sweep_row, end_sweep, interrupted, job_sweep_dir, record_failure
from skewlens.rich_progress import RichProgress

SCHEMA_NAME = "replay_schema"


#: The resolver ``replay.yaml``'s help names documents with (``${skewlens_doc:docs/replay.md}``): their
#: installed paths (:func:`skewlens.paths.doc`); a relative ``docs/replay.md`` named nothing a wheel user has.
DOC_RESOLVER = "skewlens_doc"


def register_configs() -> None:
    """Register the root schema in Hydra's ConfigStore (``replay.yaml`` lists it first in its defaults), and
    :data:`DOC_RESOLVER`."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=ReplayConfig)
    if not OmegaConf.has_resolver(DOC_RESOLVER):
        OmegaConf.register_new_resolver(DOC_RESOLVER, doc)


def unknown_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Keys of ``node`` (and of its typed sub-configs) that its schema does not have: ``+bogus=1`` adds
    one, and ``OmegaConf.to_object`` drops it silently."""
    kind = OmegaConf.get_type(node)
    known = {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else None
    out = []
    for key, child in node.items_ex(resolve=False):
        path = f"{prefix}{key!s}"
        if known is not None and key not in known:
            out.append(path)
        elif OmegaConf.is_missing(node, key):  # (a group a primary config of one's own did not choose)
            continue
        elif OmegaConf.is_dict(child):
            out += unknown_keys(child, f"{path}.")
        elif OmegaConf.is_list(child):
            for i, item in enumerate(child):
                if OmegaConf.is_dict(item):
                    out += unknown_keys(item, f"{path}.{i}.")
    return out


def to_config(cfg: DictConfig) -> ReplayConfig:
    """``OmegaConf.to_object`` with errors turned into one-line :class:`ConfigError`s."""
    if extra := unknown_keys(cfg):
        raise ConfigError(f"{extra[0]}: not a replay setting (skewlens replay --cfg job lists them)")
    try:
        obj = OmegaConf.to_object(cfg)
    except ConfigError as e:  # raised by a schema's __post_init__; OmegaConf may append context lines
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    except MissingMandatoryValue as e:
        key = e.full_key or "?"
        raise ConfigError(missing_value(key)) from None
    except OmegaConfBaseException as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{e.full_key or 'config'}: {first}") from None
    if not isinstance(obj, ReplayConfig):  # a primary config of one's own (-cn) not extending replay.yaml
        raise ConfigError(
            "config: the primary config does not extend replay.yaml: begin it with "
            "'defaults: [replay, _self_]' (a config.yaml an older skewlens wrote into a replay's OUT: add "
            "those lines to replay it again with -cd OUT -cn config)"
        )
    return obj


def name_topology(cfg: DictConfig, choice: str | None) -> None:
    """Give ``topology.name`` the chosen entry's name where the entry sets none: an entry of one's own
    (``--config-dir``, ``hydra.searchpath``) without ``name:`` was refused ('topology.name: missing value')
    while a topology file given by path took its stem. ``topology.name=...`` on the command line wins."""
    if choice and not OmegaConf.is_missing(cfg, "topology") and OmegaConf.is_missing(cfg.topology, "name"):
        cfg.topology.name = choice


def scenario_line(conf: ReplayConfig, items: Sequence[Slowdown]) -> str:
    """What was replayed: the network (the topology where transfers are modelled) and each slowdown."""
    net = f"topology {conf.topology.name}" if conf.comm_mode == "model" else "transfers as recorded"
    what = "; ".join(i.describe() for i in items)
    # a preset named ``none`` that has entries was given them on the command line (slowdown.entries=[...])
    named = f"slowdown {conf.slowdown.name}: " if conf.slowdown.name != "none" else "slowdown "
    slow = f"{named}{what}" if items else "no slowdown"
    scale = f"; as {counted(conf.scale.dp, 'data-parallel replica')}" if conf.scale.dp else ""
    return f"replayed with {net}; {slow}{scale}"


#: The slowdown group's knobs: values its presets' entries may refer to (``${slowdown.factor}``).
KNOBS = ("factor", "rank", "delay_ms", "step")


def unused_knobs(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """A note for each knob ``overrides`` set that no entry of the chosen slowdown refers to, and for
    ``scale.source`` / ``scale.seed`` without ``scale.dp``: it changes nothing (a sweep over it gives the
    same point again and again)."""
    entries = OmegaConf.to_yaml(cfg.slowdown.entries, resolve=False) if "slowdown" in cfg else ""
    notes = []
    for o in overrides:
        key = override_key(o)
        if key in ("scale.source", "scale.seed") and not OmegaConf.select(cfg, "scale.dp", default=0):
            notes.append(f"{o}: scale.dp is 0 (the run replayed as captured), so it changes nothing here")
        knob = key.removeprefix("slowdown.")
        if knob in KNOBS and key != knob and f"${{slowdown.{knob}}}" not in entries:
            name = cfg.slowdown.get("name", "?")
            notes.append(f"{o}: slowdown {name} does not use slowdown.{knob}; it changes nothing here")
    return notes


def run_job(cfg: DictConfig, console: Console) -> None:
    """One Hydra job: validate, replay, write the outputs and ``config.yaml``, render, record the sweep row.

    The replay and ``config.yaml`` are written as :func:`~skewlens.replay.driver.replay_run` writes them
    (staged inside ``OUT`` and moved in once the whole replay has succeeded; a failed or interrupted one
    leaves ``OUT``'s earlier files as they were); a failed job also removes what Hydra made for it."""
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    try:
        name_topology(cfg, hc.runtime.choices.get("topology"))
        conf = to_config(cfg)
        if hc.job.chdir:  # Hydra runs the job in out_dir: a relative trace is where the command was given
            conf = dataclasses.replace(conf, trace=str(Path(hc.runtime.cwd) / conf.trace))
        check_out_dir(conf, hc)
        progress = RichProgress() if conf.progress else NO_PROGRESS
        outcome = replay_run(
            conf, out_dir, progress=progress, config_yaml=config_yaml(cfg, Path(hc.runtime.cwd))
        )
    except BaseException:
        if hc.mode == RunMode.MULTIRUN:  # the sweep's directory for this point, made by Hydra
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        elif (
            not _is_out(OmegaConf.select(cfg, "out", default=None, throw_on_missing=False), hc)
            and (top := _made_for_job(out_dir, Path(hc.runtime.cwd))) is not None
        ):
            # Hydra's outputs/DATE/TIME, made for this job, and what it wrote there of its own
            for name in (
                ".hydra/config.yaml",
                ".hydra/hydra.yaml",
                ".hydra/overrides.yaml",
                f"{hc.job.name}.log",
            ):
                with contextlib.suppress(OSError):
                    (out_dir / name).unlink()
            with contextlib.suppress(OSError):
                (out_dir / ".hydra").rmdir()
            remove_if_empty(top, out_dir.resolve())
        raise
    if (lenient := lenient_line(outcome.run)) is not None:  # a saved report says it too, not stderr alone
        print_line(console, lenient)
    if (
        conf.comm_mode != "as_recorded"
        and (untraced := untraced_members_line(outcome.run, replay=True)) is not None
    ):
        print_line(console, untraced)
    console.print(summary_table(outcome.summary, title=f"Simulated replay ({conf.comm_mode}) -> {out_dir}"))
    if (gpu := gpu_idle_table(outcome.summary)) is not None:
        console.print(gpu)
    console.print(scenario_line(conf, outcome.slowdowns), markup=False, highlight=False)
    clocks = clock_note(outcome.run)
    notes = (*unused_knobs(cfg, hc.overrides.task), *run_notes(outcome.run), *([clocks] if clocks else []))
    # a sweep's warnings name their job (the sweep table's row), as its failure does: they no longer sit
    # under its table
    job = f"sweep job {hc.job.num}: " if hc.mode == RunMode.MULTIRUN else ""
    for note in (*notes, *outcome.notes):  # on stderr: a script's > out.txt gets the results only
        print_warning("replay", job + note)
    if outcome.real is not None:
        from skewlens.replay.real.render import outputs_line, render_comparison

        sim = {}
        for r in sorted(outcome.run.ranks):
            rows = [s.step_time_ns for s in outcome.summary if s.rank == r]
            sim[r] = round(sum(rows) / len(rows)) if rows else 0
        console.print(render_comparison(outcome.real, sim))
        simulated = [n for n in (TIMELINE_PARQUET, SUMMARY_PARQUET, TIMELINE_JSON) if (out_dir / n).exists()]
        print_line(console, outputs_line(outcome.real, simulated))
    if hc.mode == RunMode.MULTIRUN:
        # each step's time as the summary measures it (step mark to step mark), the slowest rank's
        append_sweep_row(
            job_sweep_dir(hc),
            sweep_record(
                job=int(hc.job.num),
                overrides=" ".join(hc.overrides.task),
                topology=conf.topology.name,
                slowdown=conf.slowdown.name,
                comm_mode=conf.comm_mode,
                out_dir=str(out_dir),
                makespan_ns=outcome.sim.makespan_ns,
                summary=outcome.summary,
            ),
        )


def check_out_dir(conf: ReplayConfig, hc: Any) -> None:
    """``out`` is the directory Hydra runs the job in (``replay.yaml`` sets ``hydra.run.dir`` and
    ``hydra.sweep.dir`` to it), else a one-line :class:`ConfigError`: a primary config of one's own
    (``-cn``) that does not extend ``replay``, or sets ``hydra.run.dir`` itself, had the replay write into
    Hydra's ``outputs/DATE/TIME`` (or its own directory), leaving ``out`` empty, with exit 0 (the
    directory Hydra made for the job is removed where it is empty: :func:`run_job`)."""
    if _is_out(conf.out, hc):
        return
    key = "hydra.sweep.dir" if hc.mode == RunMode.MULTIRUN else "hydra.run.dir"
    raise ConfigError(
        f"out={conf.out}: Hydra would write this replay into {_job_dir(hc)} ({key} of the primary config "
        f"{hc.job.config_name!r}); a primary config of your own extends replay.yaml, which sets {key} to "
        "out: begin it with 'defaults: [replay, _self_]' and leave hydra.run.dir and hydra.sweep.dir alone"
    )


def _job_dir(hc: Any) -> Path:
    """The directory Hydra runs the job in: the sweep's directory in a sweep, else the run's (absolute)."""
    cwd = Path(hc.runtime.cwd)
    return (cwd / (hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.runtime.output_dir)).resolve()


def _is_out(out: object, hc: Any) -> bool:
    """Whether ``out`` (a config's, maybe missing) is :func:`_job_dir` (see :func:`check_out_dir`)."""
    if not isinstance(out, str) or out == MISSING:
        return False
    return (Path(hc.runtime.cwd) / out).resolve() == _job_dir(hc)


def _made_for_job(out_dir: Path, cwd: Path) -> Path | None:
    """Where Hydra's run directory ``out_dir`` is one it made for the job below ``cwd`` (its
    ``outputs/DATE/TIME``, or a ``hydra.run.dir`` of the primary config), the topmost directory it may have
    made for it (``cwd/outputs``); else None: ``cwd`` itself, where ``replay.yaml`` runs a job without
    ``out`` (which Hydra neither made nor writes in), is never removed, nor anything in it."""
    made, cwd = out_dir.resolve(), cwd.resolve()
    if made == cwd or not made.is_relative_to(cwd):
        return None
    return cwd / made.relative_to(cwd).parts[0]


def config_yaml(cfg: DictConfig, cwd: Path) -> str:
    """``OUT/config.yaml``: the resolved config (``trace`` and ``out`` absolute) as a primary config that
    extends ``replay``, its values after ``replay.yaml``'s, so that ``skewlens replay -cd OUT -cn config
    out=NEW`` replays the same again (a value is changed by its key, ``slowdown.entries.0.factor=2``: the
    file's values come after any entry a group override would choose)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    for key in ("trace", "out"):
        if isinstance(resolved.get(key), str):  # resolved, as timeline.json's run_dir: 'sub/../run' is 'run'
            resolved[key] = str((cwd / resolved[key]).resolve())
    return (
        "# The resolved config of this replay. Replay it again (a value changed by its key, as\n"
        "# slowdown.entries.0.factor=2; the values below come after any entry a group override chooses):\n"
        "#   skewlens replay -cd THIS_DIRECTORY -cn config out=ANOTHER_DIRECTORY\n"
        "defaults:\n  - replay\n  - _self_\n\n" + OmegaConf.to_yaml(resolved)
    )


def check_entry(group: str, name: str, known: set[str], *, or_file: bool = False) -> None:
    """``group=name`` names a known entry, else a one-line :class:`ConfigError` listing them (Hydra's own
    message is a dozen lines with its search path)."""
    if name not in known:
        alt = "; or a YAML file's path" if or_file else ""
        raise ConfigError(f"{group}={name}: no such entry (one of {', '.join(sorted(known))}{alt})")


#: Config groups whose choice ``check_groups`` checks (``topology=`` may also name a file: checked apart).
CHECKED_GROUPS = ("slowdown", "scale")


def user_conf_dirs(args: list[str]) -> list[Path] | None:
    """The config directories on Hydra's search path besides skewlens's: ``--config-dir`` / ``-cd``, the
    entries of ``hydra.searchpath`` (``file://``, a plain path or a package's ``pkg://``: its directory)
    given on the command line, else those of the user's primary config (``-cn NAME``), and those a
    ``SearchPathPlugin`` of an installed package adds (a pip-installed config package): all that Hydra
    searches, so that an entry of any is not refused ('slowdown=slow_host: no such entry'). None
    where one is not a directory here (a zipped package), whose entries are not listed. One the command
    line or the primary config names that is not a directory is a one-line :class:`ConfigError` naming it
    (Hydra's was a dozen lines, or an argparse error about the next override)."""
    dirs: list[Path] = []
    given = iter(v for flag, v in _flag_values(args) if flag == ("-cd", "--config-dir"))
    searchpath = False
    for arg in args:
        if _hydra_flag(arg) == ("-cd", "--config-dir"):
            value = next(given)
            where = f"{arg.partition('=')[0]} {value}"
            entries = [value]
        elif arg.startswith("hydra.searchpath="):
            value = arg.partition("=")[2].strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            entries = [e.strip().strip("'\"") for e in value.split(",") if e.strip()]
            where, searchpath = "", True
        else:
            continue
        for entry in entries:
            d = _search_dir(entry, where or f"hydra.searchpath: {entry}")
            if d is None:
                return None
            dirs.append(d)
    plugged = _plugin_dirs()
    if plugged is None:
        return None
    dirs += plugged
    primary = None if searchpath else _primary_config_path(args, dirs)
    doc = _read_yaml(primary) if primary is not None else None
    hydra_conf = doc.get("hydra") if isinstance(doc, dict) else None
    listed = hydra_conf.get("searchpath") if isinstance(hydra_conf, dict) else None
    for entry in listed if isinstance(listed, list) else []:
        d = _search_dir(str(entry), f"{primary}: hydra.searchpath: {entry}")
        if d is None:
            return None
        dirs.append(d)
    return dirs


def _search_dir(entry: str, where: str) -> Path | None:
    """The directory of the search path entry ``entry``: a ``file://`` or plain path, else a one-line
    :class:`ConfigError` (``where``: what named it) where it is not a directory; a ``pkg://`` package's
    directory, None where it is not one on disk (Hydra then says what it finds)."""
    if entry.startswith("pkg://"):
        module, _, sub = entry.removeprefix("pkg://").partition("/")
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        places = list(spec.submodule_search_locations or []) if spec is not None else []
        d = Path(places[0]) / sub if len(places) == 1 else None
        return d if d is not None and d.is_dir() else None
    d = Path(entry.removeprefix("file://")).expanduser()
    if not d.is_dir():
        raise ConfigError(f"{where}: {'not a directory' if d.exists() else 'no such directory'}")
    return d


def _plugin_dirs() -> list[Path] | None:
    """The directories the installed ``SearchPathPlugin`` s put on Hydra's search path (a pip-installed
    package of configs), as :func:`_search_dir` finds them; None where one is not a directory here."""
    # Hydra's own composition of the path (private: hydra-core is pinned below 1.4 in pyproject.toml)
    from hydra._internal.utils import create_config_search_path

    dirs = []
    for element in create_config_search_path(None).get_path():
        if element.provider in ("hydra", "schema") or element.path is None:
            continue
        d = _search_dir(element.path, f"{element.provider}: {element.path}")
        if d is None:
            return None
        dirs.append(d)
    return dirs


def _primary_config_path(args: list[str], dirs: list[Path]) -> Path | None:
    """The file of the user's primary config that ``args`` choose (``-cn NAME``: ``NAME.yaml`` in the first
    of ``dirs`` that holds one); None where they choose none, or ``replay`` (skewlens's comes first)."""
    names = [v for flag, v in _flag_values(args) if flag == ("-cn", "--config-name")]
    if not names or names[-1].removesuffix(".yaml") == "replay":
        return None
    files = [d / f"{names[-1].removesuffix('.yaml')}.yaml" for d in dirs]
    return next((f for f in files if f.is_file()), None)


def _read_yaml(path: Path) -> object:
    """The YAML document of ``path``; None where it cannot be read (said where it matters)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None


def check_config_path(args: list[str]) -> None:
    """``--config-path DIR`` (``-cp``) takes the place of skewlens replay's own config directory: a
    ``DIR`` without a ``replay.yaml`` (and its groups) of its own, or a relative one, which Hydra reads from
    skewlens's package, is a one-line :class:`ConfigError` saying to give it with ``-cd`` (Hydra's was
    "In 'acme': Could not load 'replay'" with its search path, or "Primary config module
    'skewlens.cli.DIR' not found"). A package's (``pkg://``) is left to Hydra."""
    for flag, value in _flag_values(args):
        if flag != ("-cp", "--config-path") or value.startswith("pkg://"):
            continue
        d = Path(value.removeprefix("file://")).expanduser()
        if d.is_absolute() and (d / "replay.yaml").is_file():
            continue  # a whole copy of skewlens's configs
        why = (
            "Hydra reads a relative one from skewlens's package, not from here"
            if not d.is_absolute()
            else f"{value} holds no replay.yaml"
        )
        raise ConfigError(
            f"--config-path {value}: takes the place of skewlens replay's own configs (replay.yaml and its "
            f"groups), and {why}; give a directory of your own entries and primary configs with -cd {value} "
            "(--config-dir), which Hydra searches after skewlens's"
        )


def check_config_name(args: list[str]) -> None:
    """``--config-name NAME`` (``-cn``) names a primary config on Hydra's search path: skewlens's ``replay``
    (or its schema, in the ConfigStore), else ``NAME.yaml`` in a ``--config-dir`` or a directory an installed
    ``SearchPathPlugin`` adds; one in none is a one-line :class:`ConfigError` naming the directories searched
    and the likely name (Hydra's was nine lines, its search path and 'Set the environment variable
    HYDRA_FULL_ERROR=1'). A ``hydra.searchpath`` of the command line holds entries, not the primary config,
    which Hydra finds before it reads the overrides: one there is said so. Left to Hydra where
    ``--config-path`` replaces skewlens's configs or a package's directory is searched."""
    names = [v for flag, v in _flag_values(args) if flag == ("-cn", "--config-name")]
    if not names or any(flag == ("-cp", "--config-path") for flag, _ in _flag_values(args)):
        return
    name = names[-1].removesuffix(".yaml")
    searched = user_conf_dirs(args)  # every directory checked, each a one-line error where it is none
    plugged = _plugin_dirs()
    if searched is None or plugged is None:
        return
    dirs = [Path(v).expanduser() for flag, v in _flag_values(args) if flag == ("-cd", "--config-dir")]
    dirs += plugged
    stored = {k.removesuffix(".yaml") for k in ConfigStore.instance().repo if k.endswith(".yaml")}
    if name in stored or any((d / f"{name}.yaml").is_file() for d in (CONF_DIR, *dirs)):
        return
    elsewhere = next((d for d in searched if (d / f"{name}.yaml").is_file()), None)
    if elsewhere is not None:
        raise ConfigError(
            f"--config-name {names[-1]}: {elsewhere} is on hydra.searchpath, which Hydra searches for the "
            f"config groups' entries but not for the primary config; give -cd {elsewhere}"
        )
    found = sorted({"replay", *(f.stem for d in dirs for f in d.glob("*.yaml"))})
    close = difflib.get_close_matches(name, found, n=1)
    where = "skewlens's configs" + (f" or {', '.join(map(str, dirs))}" if dirs else " (no -cd given)")
    raise ConfigError(
        f"--config-name {names[-1]}: no {name}.yaml in {where} (primary configs there: {', '.join(found)})"
        + (f"; did you mean {close[0]!r}?" if close else "")
    )


def check_rerun(args: list[str]) -> None:
    """``--experimental-rerun FILE`` names the ``config.pickle`` Hydra's ``PickleJobInfoCallback`` wrote
    into a replay's ``.hydra/`` (its composed config), else a one-line :class:`ConfigError`: Hydra read a
    missing file, a directory, another pickle (``job_return.pickle`` beside it) or a file that is no pickle
    with a traceback (``ValueError: File ... does not exist!``, ``IsADirectoryError``, ``AttributeError:
    'JobReturn' object has no attribute 'hydra'``). The file is not unpickled here: only Hydra loads it, as
    the user asked, once its name and its first byte (a pickle's protocol mark) say it is that file."""
    give = (
        "give the config.pickle that hydra.callbacks.save_job_info (Hydra's PickleJobInfoCallback) wrote "
        "into a replay's .hydra/"
    )
    for flag, value in _flag_values(args):
        if flag != ("", "--experimental-rerun"):
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"--experimental-rerun {value}: {'not a file' if path.exists() else 'no such file'}; {give}"
            )
        if path.name != _RERUN_FILE:
            raise ConfigError(f"--experimental-rerun {value}: not a replay's {_RERUN_FILE}; {give}")
        with path.open("rb") as f:
            if f.read(1) != _PICKLE_PROTO:
                raise ConfigError(f"--experimental-rerun {value}: not a pickle; {give}")


#: The file ``--experimental-rerun`` takes (Hydra's ``PickleJobInfoCallback`` writes it), and a pickle's
#: first byte (the PROTO opcode of every protocol Hydra writes, 2 and later).
_RERUN_FILE, _PICKLE_PROTO = "config.pickle", b"\x80"


def _primary_config(args: list[str]) -> tuple[list[Path], Path, dict[str, Any]] | None:
    """The user's config directories, the file of the primary config ``args`` choose from them
    (:func:`_primary_config_path`) and its document; None where they choose none of theirs, or its file is
    not a mapping Hydra would read (Hydra's to say)."""
    dirs = user_conf_dirs(args)
    path = _primary_config_path(args, dirs) if dirs else None
    doc = _read_yaml(path) if path is not None else None
    if dirs is None or path is None or not isinstance(doc, dict):
        return None
    return dirs, path, doc


def check_sweeper_params(args: list[str]) -> None:
    """The sweep a primary config of the user's gives in ``hydra.sweeper.params`` (``-cd DIR -cn NAME``,
    ``NAME.yaml`` in ``DIR``): each ``key: values`` is checked as the command line's ``key=values`` are
    (:func:`check_groups`, :func:`check_types`), else a one-line :class:`ConfigError` naming the file. Hydra's
    was four lines, and its advice for a key the schema lacks, "To append to your config use
    +slowdown.factr=1", a second mistake. Its own defaults' files, and a file Hydra cannot read, are left to
    Hydra."""
    if (primary := _primary_config(args)) is None:
        return
    dirs, path, doc = primary
    hydra_conf = doc.get("hydra")
    sweeper = hydra_conf.get("sweeper") if isinstance(hydra_conf, dict) else None
    params = sweeper.get("params") if isinstance(sweeper, dict) else None
    if not isinstance(params, dict):
        return
    # as Hydra's basic sweeper makes them of the file's values
    overrides = [f"{k}={v}" for k, v in params.items()]
    try:
        check_groups([*overrides, *(f"hydra.searchpath=[file://{d}]" for d in dirs)])
        check_types([*overrides, "-cn", path.stem])  # a sweep of the primary config's: -m is not asked for
    except ConfigError as e:
        raise ConfigError(f"{path}: hydra.sweeper.params: {e}") from None


def check_primary_config(args: list[str]) -> None:
    """The user's primary config (``-cn NAME``, :func:`_primary_config_path`) holds settings of the schema,
    each of its type, and the entries its ``defaults`` list chooses (``override topology: NAME``) are
    there, each holding its group's settings (:func:`check_user_entry`), else a one-line
    :class:`ConfigError` naming the file (and the entry's). Hydra's were five lines ("In 'acme':
    ConfigKeyError raised while composing config: Key 'bandwith_gbps' not in 'DimensionConfig'", naming
    neither file nor item), or twenty with its search path for an entry that is not there. A group the
    command line chooses replaces the file's choice, and is checked as the command line's."""
    if (primary := _primary_config(args)) is None:
        return
    dirs, path, doc = primary
    given = {override_key(a) for a in args}
    defaults = doc.get("defaults")
    defaults = defaults if isinstance(defaults, list) else []
    for item in defaults:
        if not isinstance(item, dict) or len(item) != 1:
            continue
        ((key, choice),) = item.items()
        group = str(key).removeprefix("override").strip().lstrip("/")
        if group not in GROUP_SCHEMAS or group in given or not isinstance(choice, str):
            continue
        if not str(key).startswith("override") and any(str(d).lstrip("/") == "replay" for d in defaults):
            # Hydra's "Multiple values for topology", in three lines
            raise ConfigError(
                f"{path}: defaults: '{key}: {choice}': replay.yaml chooses a {group} already; write "
                f"'override {key}: {choice}'"
            )
        try:
            check_entry(group, choice, known_entries(group, dirs))
            check_user_entry(group, choice, dirs, group_settings(group, args))
        except ConfigError as e:
            raise ConfigError(f"{path}: defaults: {e}") from None
    body = {k: v for k, v in doc.items() if k not in ("defaults", "hydra")}
    if (problem := file_key_problem(body, ReplayConfig, "")) is not None:
        raise ConfigError(f"{path}: {problem}")


#: A key of each group's, as a warning shows changing one of a primary config's values by its key.
_GROUP_KEY_EXAMPLES = {
    "topology": "topology.algorithm=tree",
    "slowdown": "slowdown.entries.0.factor=2",
    "scale": "scale.dp=8",
}


def warn_group_overrides(args: list[str]) -> None:
    """A warning (stderr) for each group override of ``args`` (``topology=ring``, read by Hydra's parser)
    whose group the user's primary config sets in its body, as a replay's saved ``config.yaml`` sets every
    group's values (``-cd OUT -cn config topology=ring``): the file's values come after the entry the
    override chooses and win, so the replay kept the saved topology and said nothing. Overrides Hydra's
    grammar refuses are left to :func:`check_types`."""
    if (primary := _primary_config(args)) is None:
        return
    _, path, doc = primary
    last = {o.key_or_group: o for o in group_overrides(args) if o.package is None and not o.is_delete()}
    for group, o in last.items():  # the last override of a group is the one Hydra takes
        if not isinstance(body := doc.get(group), dict):
            continue
        name = body.get("name")
        keeps = f" (this replays {group} {name})" if isinstance(name, str) else ""
        print_warning(
            "replay",
            f"{o.input_line}: {path} sets {group} itself, and the file's values win over the chosen entry's"
            f"{keeps}; change one by its key ({_GROUP_KEY_EXAMPLES[group]}), or delete the file's {group}: "
            f"block to replay {(o.input_line or '').partition('=')[2]}",
        )


def group_overrides(args: list[str]) -> list[Override]:
    """The overrides of ``args`` that set a group (``topology=ring``, ``slowdown=a,b``), as Hydra's parser
    reads them; none where its grammar refuses one (left to :func:`check_types`)."""
    chosen = [a for a in args if (s := override_setting(a)) is not None and s[0] in GROUP_SCHEMAS]
    try:
        return OverridesParser.create().parse_overrides(chosen)
    except OverrideParseException:
        return []


def _flag_values(args: list[str]) -> list[tuple[tuple[str, ...], str]]:
    """Each Hydra flag of ``args`` that takes a value, with its value (``-cn NAME``, ``--config-name=N``)."""
    out: list[tuple[tuple[str, ...], str]] = []
    for i, arg in enumerate(args):
        flag = _hydra_flag(arg) if arg.startswith("-") else None
        if flag in HYDRA_VALUE_FLAGS and flag is not None:
            _, eq, value = arg.partition("=")
            out.append((flag, value if eq else args[i + 1] if i + 1 < len(args) else ""))
    return out


def known_entries(group: str, dirs: list[Path]) -> set[str]:
    """The entries of ``group``: skewlens's (``conf/<group>/``) and those of the user's config ``dirs``."""
    return conf_entries(group).union(*({f.stem for f in (d / group).glob("*.yaml")} for d in dirs))


def check_group_lists(args: list[str]) -> None:
    """No override of ``args`` chooses a list of a group's entries (``slowdown=[straggler,jitter]``, a
    sweep's point too), else a one-line :class:`ConfigError`. Hydra merges such a list into one entry, each
    one's settings over the one's before and the last one's ``entries`` or ``dims`` replacing the others'
    (straggler's knobs on jitter's items: no straggler); the entry check split it at its commas and refused
    ``slowdown=[straggler: no such entry``, and ``scale=[none]`` as ``no such entry (one of none)``.
    Overrides Hydra's grammar refuses are left to :func:`check_types`."""
    for o in group_overrides(args):
        value = o.value()
        points = value.list if isinstance(value, ChoiceSweep) else [value]
        for point in points:
            if not isinstance(point, list):
                continue
            group = o.key_or_group
            give = f"give {group}={point[0]}" if point else f"give one of {group}'s entries"
            also = "; to combine slowdowns, list their items in slowdown.entries" * (group == "slowdown")
            raise ConfigError(
                f"{o.input_line}: {group} takes one entry, not a list (Hydra would merge them into one, the "
                f"last one's settings replacing the others'); {give}{also}"
            )


def check_groups(args: list[str]) -> None:
    """Each ``slowdown=`` and ``scale=`` value of ``args`` (a sweep's comma list too) names an entry of its
    group in ``conf/`` or in a config directory of the user's (``--config-dir``, ``hydra.searchpath``:
    :func:`user_conf_dirs`; not checked where one is a package's)."""
    dirs = user_conf_dirs(args)
    if dirs is None:
        return
    for group in CHECKED_GROUPS:
        known = known_entries(group, dirs)
        for arg in args:
            # ``+slowdown=x`` too (a primary config of the user's that chooses none takes it)
            key, value = override_setting(arg) or ("", "")
            for item in (_plain_choices(value) or []) if key == group else []:
                check_entry(group, item, known)
                check_user_entry(group, item, dirs, group_settings(group, args))


#: The lists of a group's entry that an override may index (``slowdown.entries.0.factor=3``).
GROUP_LISTS = {"slowdown": "entries", "topology": "dims"}


def _group_choices(group: str, args: list[str]) -> list[str] | None:
    """The entries of ``group`` that ``args`` choose (a sweep's comma list too), else ``conf/replay.yaml``'s
    default; none where they choose none under a primary config of the user's (:func:`_own_primary_config`:
    its defaults are Hydra's to compose); None where they are not a plain list of names or paths (a glob, an
    interpolation)."""
    given = [s[1] for s in map(override_setting, args) if s is not None and s[0] == group]
    if not given and _own_primary_config(args):
        return []
    if not given:
        defaults = yaml.safe_load((CONF_DIR / "replay.yaml").read_text(encoding="utf-8"))["defaults"]
        return [str(d[group]) for d in defaults if isinstance(d, dict) and group in d]
    return _plain_choices(given[-1])


def _plain_choices(value: str) -> list[str] | None:
    """The names or paths a group override's ``value`` chooses, a sweep's comma list too, each as Hydra
    reads it in its quotes (``slowdown='straggler'``); None where Hydra computes them (a glob, a range,
    an interpolation), which is left to Hydra."""
    if any(c in value for c in "($"):
        return None
    return [_unquoted(v) for v in value.split(",")]


def _entry_file(group: str, choice: str, dirs: list[Path]) -> Path | None:
    """The YAML file of ``group=choice``: a path given, or the entry Hydra takes: skewlens's before one of
    that name in the user's ``dirs`` (``-cd`` and ``hydra.searchpath`` come after the app's config path)."""
    if Path(choice).suffix in (".yaml", ".yml"):
        return Path(choice).expanduser()
    for d in (CONF_DIR, *dirs):
        if (path := d / group / f"{choice}.yaml").is_file():
            return path
    return None


#: Where the Hydra launchers the docs name come from, for one not installed.
LAUNCHER_PACKAGES = {
    "ray": "hydra-ray-launcher",
    "submitit_slurm": "hydra-submitit-launcher",
    "submitit_local": "hydra-submitit-launcher",
}


def _plugins_store() -> ConfigStore:
    """Hydra's ConfigStore with the installed plugins' entries (launchers, sweepers) registered."""
    from hydra.core.plugins import Plugins

    Plugins.instance()  # registers them
    return ConfigStore.instance()


def check_launcher(args: list[str]) -> None:
    """``hydra/launcher=NAME`` (and ``hydra/sweeper=``) names one that is installed, and ``hydra/GROUP=NAME``
    of Hydra's own groups (``hydra/job_logging=disabled``) an entry of Hydra's, else a one-line
    :class:`ConfigError` listing those there are (Hydra's message was ten lines with its search path); and a
    sweep on ``submitit_slurm`` has SLURM's ``srun`` to submit with (submitit's refusal was a traceback),
    unless it only shows its config (:data:`SHOW_ONLY`), which needs no SLURM.
    Entries of the user's config directories (``hydra/launcher/NAME.yaml``) count; none is checked where one
    of those is a package's."""
    dirs = user_conf_dirs(args)
    shown = any(a.startswith("-") and _hydra_flag(a) in SHOW_ONLY for a in args)  # nothing submitted
    for arg in args:
        key, eq, value = arg.partition("=")
        if not key.startswith("hydra/") or not eq or dirs is None:
            continue
        plugin = key in PLUGIN_GROUPS
        own = [g.name for g in (HYDRA_CONF_DIR / "hydra").iterdir() if g.is_dir() and g.name[0] != "_"]
        groups = sorted({*PLUGIN_GROUPS, *(f"hydra/{g}" for g in own)})
        if key not in groups and not any((d / key).is_dir() for d in dirs):
            raise ConfigError(f"{arg}: no such group of Hydra's (one of {', '.join(groups)})")
        known = {f.removesuffix(".yaml") for f in _plugins_store().list(key)} if plugin else set()
        known |= {f.stem for d in (HYDRA_CONF_DIR, *dirs) for f in (d / key).glob("*.yaml")}
        if value not in known:
            what = key.partition("/")[2]
            package = LAUNCHER_PACKAGES.get(value) if what == "launcher" else None
            hint = f"; pip install {package} for it" if package else ""
            missing = f"no such {what} installed" if plugin else "no such entry"
            raise ConfigError(f"{arg}: {missing} (one of {', '.join(sorted(known))}{hint})")
        if value == "submitit_slurm" and _multirun(args) and not shown and shutil.which("srun") is None:
            raise ConfigError(
                f"{arg}: no SLURM here (srun is not on PATH): run the sweep on a SLURM login node, or "
                "hydra/launcher=submitit_local for the same jobs on this machine"
            )
    chosen = [a.partition("=")[2] for a in args if a.startswith("hydra/launcher=")]
    if chosen or not _own_primary_config(args):  # a primary config of the user's may choose the launcher
        _check_launcher_settings(chosen[-1] if chosen else "basic", args)


def _check_launcher_settings(launcher: str, args: list[str]) -> None:
    """Each ``hydra.launcher.KEY=VALUE`` of ``args`` is a setting of ``launcher`` (an installed one's: its
    schema in Hydra's ConfigStore) of its type, else a one-line :class:`ConfigError` naming it and listing
    the launcher's settings; joblib's ``n_jobs=0`` too. Hydra's message was six lines, and joblib's
    refusal of ``n_jobs=0`` a traceback."""
    lines = [a for a in args if a.startswith("hydra.launcher.")]
    if not lines:
        return
    store = _plugins_store()
    if f"{launcher}.yaml" not in store.list("hydra/launcher"):
        return
    node = store.load(f"hydra/launcher/{launcher}.yaml").node
    with contextlib.suppress(OverrideParseException):
        for o in OverridesParser.create().parse_overrides(lines):
            if o.is_sweep_override() or o.is_delete():
                continue
            key = o.key_or_group.removeprefix("hydra.launcher.")
            try:
                OmegaConf.update(node.copy(), key, o.value(), merge=True)
            except OmegaConfBaseException as e:
                first = str(e).strip().splitlines()[0]
                has = ", ".join(str(k) for k in node if not str(k).startswith("_")) or "no settings"
                raise ConfigError(f"{o.input_line}: {first} (the {launcher} launcher has {has})") from None
            if launcher == "joblib" and key == "n_jobs" and o.value() == 0:
                raise ConfigError(f"{o.input_line}: joblib takes a number of workers, or -1 for one per CPU")


def check_list_items(args: list[str]) -> None:
    """An override of an item of a group entry's list (``slowdown.entries.0.factor=3``,
    ``topology.dims.1.bandwidth_gbps=5``) names an item that each chosen entry has, else a one-line
    :class:`ConfigError` naming the entry and how many it has. Hydra's message was five lines ("Invalid
    type assigned: dict is not a subclass of SlowdownItemConfig. value: {}"), and in a sweep it stopped
    every job. Not checked where the list is given whole, an entry extends another (its ``defaults``) or has
    a ``# @package`` header (Hydra places it: a ``_global_`` file holds ``topology:`` itself), the
    choices are not plain names, or a primary config of the user's may choose the entry: under one
    (:func:`_own_primary_config`) only the entries the command line chooses are checked (before, none were:
    ``-cn mine topology=two_node_ib topology.dims.5.bandwidth_gbps=5`` was Hydra's six lines)."""
    dirs = user_conf_dirs(args)
    for arg in args:
        m = re.fullmatch(r"\+{0,2}(slowdown|topology)\.(entries|dims)\.(\d+)(\..*)?=.*", arg)
        if dirs is None or m is None or GROUP_LISTS[m[1]] != m[2]:
            continue
        group, name, index = m[1], m[2], int(m[3])
        if any(a.startswith(f"{group}.{name}=") for a in args):
            continue
        for choice in _group_choices(group, args) or []:
            path = _entry_file(group, choice, dirs)
            try:
                text = path.read_text(encoding="utf-8") if path else ""
                doc = yaml.safe_load(text) if path else None
                header = package_header(text, f"{group}={choice}")
            except (OSError, yaml.YAMLError, UnicodeDecodeError, ConfigError):
                continue  # said elsewhere
            if not isinstance(doc, dict) or "defaults" in doc or header is not None:
                continue  # (a header's package is Hydra's to place: '_global_' holds 'topology:' itself)
            items = doc.get(name) or []
            if isinstance(items, list) and index >= len(items):
                has = (
                    f"{group} {choice} has {counted(len(items), 'item')} in {group}.{name} (numbered from 0)"
                )
                raise ConfigError(
                    f"{arg.partition('=')[0]}: {has}; give the whole list, {group}.{name}=[...], or choose a "
                    f"{group} that has item {index}"
                )


def _home_written_out(key: str, value: str, *, sweep: bool = False) -> str:
    """What to write for ``key=value``, whose value begins with ``~`` (which Hydra does not expand): the
    override with the home directory written out (``out=/home/me/x``); for a value of a ``sweep``, or a bare
    sweep's values (``~/a,~/b``, which one quoted path would join), the home directory each ``~`` stands
    for; where no user of that name is known (``~bob/x``: Path.expanduser's RuntimeError was a traceback),
    that."""
    user = re.split(r"[/,]", value[1:], maxsplit=1)[0]
    try:
        home = str(Path(f"~{user}").expanduser())
    except RuntimeError:
        return f"no user {user!r} is known here"
    if sweep or "," in value:
        return f"write each ~ out (~{user} is {home})"
    return override(key, str(Path(value).expanduser()))


def _say_how_to_quote(args: Sequence[str]) -> None:
    """A :class:`ConfigError` for the first override in ``args`` whose value Hydra's grammar refuses bare
    and takes quoted (a path with a non-ASCII letter, ``trace=ünï/run``: Hydra's own message was four
    lines pointing at the letter), saying how to write it (:func:`override`); else nothing (Hydra's
    message then)."""
    parser = OverridesParser.create()
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or arg.startswith("-") or not _KEY.fullmatch(key):
            continue
        try:
            parser.parse_overrides([arg])
            continue
        except OverrideParseException:
            pass
        if value.startswith("~"):  # quoted, it would be a directory named ~ (Hydra expands no ~)
            home = _home_written_out(key, value)
            raise ConfigError(f"{arg}: Hydra's override grammar takes no bare ~, and expands none: {home}")
        if (call := _GRAMMAR_CALL.fullmatch(value)) is not None:
            # one of the grammar's own functions written wrong (tag(r,1,0)): quoted, it is a string, which
            # the setting's type refuses next; it said "takes this value only quoted"
            raise ConfigError(
                f"{arg}: Hydra's override grammar cannot read this {call[1]}(...): see its extended "
                "override syntax (choice, range, interval, tag, glob, sort, shuffle; tag(a,b,choice(1,2)) "
                "tags a sweep)"
            )
        quoted = override(key, value)
        try:
            parser.parse_overrides(shlex.split(quoted))
        except OverrideParseException:
            continue
        raise ConfigError(f"{arg}: Hydra's override grammar takes this value only quoted: {quoted}")


#: A value that calls one of Hydra's override grammar functions (its extended override syntax).
_GRAMMAR_CALL = re.compile(
    r"(choice|range|interval|tag|glob|sort|shuffle|extend_list|int|float|str|bool|json_str)\(.*\)", re.S
)


def check_types(args: list[str]) -> None:
    """Each value ``args`` give a setting of the schema (every point of a sweep) has the setting's type,
    and each key they name is a setting, else a one-line :class:`ConfigError` naming the override, before
    any point runs: Hydra refuses these too, in six lines. The type is the schema's declared one, found
    through its dataclasses and list items (``topology.dims.0.bandwidth_gbps``: a float, whichever topology
    is chosen; ``scale.seed``: an int or null); an appended key (``+key=``) is a key the schema has, where
    Hydra would take it (:func:`_check_add`). Overrides Hydra's grammar refuses, group choices, nodes
    (``slowdown.entries.0``), globs (``topology=glob(*ring*)``, whose entries only Hydra's config loader
    lists) and Hydra's settings its schema leaves open (``hydra.launcher.*``, ``hydra.job_logging.*``: the
    launcher's are checked apart) are left to Hydra; its others are checked against ``HydraConf``."""
    try:
        overrides = OverridesParser.create().parse_overrides(
            [a for a in args if "=" in a or a.startswith("~")]
        )
    except OverrideParseException:
        _say_how_to_quote(args)
        return  # Hydra says what is wrong with it
    swept = {o.key_or_group for o in overrides if o.is_sweep_override()}
    deleted: dict[str, str | None] = {}
    for o in overrides:
        if o.is_delete():
            deleted[o.key_or_group] = o.input_line
        elif o.key_or_group in deleted:
            # ~slowdown slowdown=straggler replayed no slowdown, silently, as Hydra does, and ~perfetto
            # perfetto=false was Hydra's six lines (slowdown=straggler ~slowdown deletes it: the later wins)
            both = f"{deleted[o.key_or_group]} and then {o.input_line}"
            raise ConfigError(f"{both}: Hydra drops a value given after its key is deleted; give one of them")
    for o in overrides:
        if o.is_delete():
            _check_delete(o.key_or_group)
            continue
        if _left_to_hydra(o, args):
            continue
        if o.key_or_group == "out" and _multirun(args) and not o.is_sweep_override():
            _check_sweep_out(o.input_line or "out", str(o.value()), swept)
        try:
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        except ValueError as e:  # range(1,2,0): a ValueError traceback
            raise ConfigError(f"{o.input_line}: {e}") from None
        _check_add(o, args, values)
        # a sweep's quoted values as their text
        _check_paths(o, [v.text if isinstance(v, QuotedString) else v for v in values])
        setting = _setting_type(o.key_or_group, adding=o.is_add())
        if setting is None:
            if not all(isinstance(v, dict) for v in values):  # a node is given a mapping, or nothing
                _not_a_node_value(o.key_or_group, o.input_line or o.key_or_group, adding=o.is_add())
            continue
        last = o.key_or_group.rpartition(".")[2]
        name = last if last.isidentifier() else "value"  # what OmegaConf's message calls it
        holder = OmegaConf.structured(
            dataclasses.make_dataclass("Setting", [(name, setting, dataclasses.field(default=MISSING))])
        )
        if typing.get_origin(setting) is list and dataclasses.is_dataclass(typing.get_args(setting)[0]):
            for v in values:
                _check_items(o.input_line or o.key_or_group, holder, name, typing.get_args(setting)[0], v)
            continue
        for v in values:
            try:
                OmegaConf.update(holder, name, v, merge=False)
            except OmegaConfBaseException as e:
                first = first_line(e)
                raise ConfigError(f"{o.input_line}: {first}") from None


def _left_to_hydra(o: Override, args: list[str]) -> bool:
    """Checks of an override's run mode and Hydra's directories (each a one-line :class:`ConfigError`);
    True where its values are Hydra's to draw (a glob of a group's entries, a sampling sweeper's
    ``interval()``), so that nothing here checks them."""
    if o.is_sweep_override() and not _multirun(args) and not _own_primary_config(args):
        # Hydra's three lines: "Sweep parameters '...' requires --multirun"
        raise ConfigError(f"{o.input_line}: a sweep of several values runs with -m (--multirun)")
    if isinstance(o.value(), Glob):  # a glob's choices come from the config loader
        return True
    subdir = o.key_or_group == "hydra.sweep.subdir" and "${" not in (o.input_line or "")
    if subdir and (_multirun(args) or _own_primary_config(args)):  # a single run has no job directories
        # every job replayed into the one directory, each replacing the one before: the sweep's table
        # named it for every row, and only the last job's timeline was there
        raise ConfigError(
            f"{o.input_line}: every job would write into that one directory; it must differ per job "
            "(${hydra.job.num}, the default, or ${hydra.job.override_dirname})"
        )
    params = "hydra.sweeper.params"
    sets_params = o.key_or_group == params or o.key_or_group.startswith(f"{params}.")
    if sets_params and not _own_primary_config(args):
        # replay.yaml's sweeper has none (null), which OmegaConf cannot merge into: its AttributeError
        # ('NoneType' object has no attribute 'get') or AssertionError was a traceback, as in any Hydra app
        raise ConfigError(
            f"{o.input_line}: {params} cannot be set on the command line, where replay.yaml's is null; give "
            "the sweep's values as overrides (slowdown.factor=1,3 with -m), or set hydra.sweeper.params in a "
            "primary config of your own (-cd DIR -cn NAME)"
        )
    if o.key_or_group in ("hydra.run.dir", "hydra.sweep.dir"):  # replay.yaml sets them to out
        value = (o.input_line or "").partition("=")[2]
        raise ConfigError(
            f"{o.input_line}: skewlens replay writes where out= says ({o.key_or_group} follows it): "
            f"give out={value}"
        )
    if isinstance(o.value(), IntervalSweep):  # sweep_iterator's HydraException was a traceback
        if _own_primary_config(args) or any(
            a.startswith("hydra/sweeper=") and a != "hydra/sweeper=basic" for a in args
        ):
            return True  # a sampling sweeper's, which draws its values (a primary config may choose one)
        raise ConfigError(
            f"{o.input_line}: interval() is for sweepers that sample (Optuna, Nevergrad); Hydra's basic "
            "sweeper takes a comma list, range() or choice()"
        )
    return False


def _check_paths(o: Override, texts: list[Any]) -> None:
    """``trace`` and ``out`` (``texts``: the override's values, a sweep's each): no ``~`` that Hydra would
    leave unexpanded, no sweep over ``out``, and interpolations in ``out`` that resolve; each a one-line
    :class:`ConfigError`."""
    homes = [v for v in texts if isinstance(v, str) and v.startswith("~")]
    if o.key_or_group in ("trace", "out") and homes:
        # out='~/x' made ./~/x, a directory named ~ (rm -rf ~ then removes home); trace= looked there
        where = "make" if o.key_or_group == "out" else "look for"
        raise ConfigError(
            f"{o.input_line}: Hydra expands no ~ (it would {where} a directory named ~ here): "
            f"{_home_written_out(o.key_or_group, homes[0], sweep=o.is_sweep_override())}"
        )
    if o.key_or_group == "out" and o.is_sweep_override():
        # the sweep's directory is out: the launching process read it as "." and looked there for the
        # jobs' rows (none), while each job wrote its own under one of the values
        raise ConfigError(
            f"{o.input_line}: a sweep writes every point under one out (OUT/<job>/); sweep other settings"
        )
    if o.key_or_group == "out":
        for v in texts:
            _check_out_interpolations(o.input_line or "out", str(v))


def _check_sweep_out(line: str, value: str, swept: set[str]) -> None:
    """A sweep's ``out`` (``value``) interpolates nothing that differs from job to job, else a one-line
    :class:`ConfigError` saying to name the jobs' directories by it with ``hydra.sweep.subdir``: ``out`` is
    the sweep's directory, made before any job. ``out=S/${slowdown.factor}`` over ``slowdown.factor=1,2``
    replayed into ``S/1.0/0`` and ``S/2.0/1`` while the sweep looked in ``S/1.5`` (the entry's default) and
    said 'the sweep has no jobs', exit 2; ``${hydra:runtime.choices.topology}``, which Hydra sets per job,
    was its traceback ('HydraConfig was not set'). ``swept``: the keys the sweep's overrides sweep."""
    for m in re.finditer(r"\$\{([^${}]*)\}", value):
        name = m[1].strip()
        per_job = name.startswith("hydra:") or any(
            name == k or name.startswith(f"{k}.") or k.startswith(f"{name}.") for k in swept
        )
        if per_job:
            what = "is Hydra's per job" if name.startswith("hydra:") else "differs from job to job"
            raise ConfigError(
                f"{line}: {m[0]} {what}, and a sweep writes every job under one out, made before any job "
                "runs; name the jobs' directories by it with hydra.sweep.subdir instead"
            )


def _check_out_interpolations(line: str, value: str) -> None:
    """Each ``${...}`` in ``out``'s ``value`` names a resolver that exists (``${now:%H-%M}``), an environment
    variable that is set or given a default (``${oc.env:NAME,default}``) or a setting of the schema
    (``${topology.name}``), else a one-line :class:`ConfigError` naming it: Hydra's run directory follows
    ``out``, and resolving it failed in a traceback ("An error occurred during Hydra's exception
    formatting")."""
    from hydra.core.utils import setup_globals

    setup_globals()  # Hydra's resolvers (now, hydra), registered when its app starts
    for m in re.finditer(r"\$\{([^${}]*)\}", value):
        name, colon, arg = m[1].partition(":")
        if colon and not OmegaConf.has_resolver(name):
            raise ConfigError(
                f"{line}: {m[0]}: no resolver {name!r} (Hydra's: now, hydra; OmegaConf's: oc.env, ...)"
            )
        if colon and name == "oc.env" and "," not in arg and arg.strip() not in os.environ:
            raise ConfigError(f"{line}: {m[0]}: environment variable {arg.strip()!r} is not set")
        if not colon and not name.startswith("hydra") and _declared_type(name) is None:
            raise ConfigError(f"{line}: {m[0]}: no setting {name!r} to interpolate")


def _check_delete(key: str) -> None:
    """``~key`` deletes a top-level setting that has a default (it then takes that default), else a
    one-line :class:`ConfigError` naming it. ``~trace`` / ``~out`` had replayed into a trace or output
    directory named ``???`` (the schema's MISSING) or the current one; ``~topology`` was a traceback, and a
    nested key Hydra's five lines (a structured node deletes no key) or, in a list, a traceback."""
    if key.startswith("hydra"):
        return  # Hydra's own
    try:
        _declared_type(key, refuse_unknown=True)  # a key the schema does not have: its settings listed
    except ConfigError as e:
        raise ConfigError(f"~{e}") from None
    if "." in key:
        raise ConfigError(
            f"~{key}: only a top-level setting can be deleted (it then takes its default); give {key} a value"
        )
    if {f.name: f for f in dataclasses.fields(ReplayConfig)}[key].default is MISSING:
        raise ConfigError(f"~{key}: {key} is required and cannot be deleted (give it a value: {key}=...)")


def _check_items(line: str, holder: DictConfig, name: str, item: type, value: Any) -> None:
    """``value`` for a list of ``item`` nodes (``slowdown.entries=[{kind:compute,factor:2}]``): a list whose
    items have only ``item``'s keys, each of its type, else a one-line :class:`ConfigError` naming the item
    (Hydra's own message is six lines, and its advice, ``+key=``, would not mend a typo)."""
    if not isinstance(value, list):
        raise ConfigError(f"{line}: expected a list of {{key:value,...}} items")
    for i, v in enumerate(value):
        try:
            OmegaConf.merge(holder, {name: [v]})
        except OmegaConfBaseException as e:
            first = first_line(e)
            has = ", ".join(f.name for f in dataclasses.fields(item))
            hint = f" (an item has {has})" if isinstance(e, ConfigKeyError) else ""
            raise ConfigError(f"{line}: item {i}: {first}{hint}") from None


def _not_a_node_value(key: str, line: str, *, adding: bool) -> None:
    """``key=value`` where ``key`` names a node of settings (``real``, ``topology.dims.0``), not a group
    Hydra chooses an entry of: a one-line :class:`ConfigError` naming its settings (Hydra's message was six
    lines, or for ``scale=3`` a traceback)."""
    if adding or key.startswith("hydra") or key in (*CHECKED_GROUPS, "topology"):
        return
    t = _declared_type(key)
    if dataclasses.is_dataclass(t):
        names = [f.name for f in dataclasses.fields(t)]
        raise ConfigError(
            f"{line}: {key} holds settings ({', '.join(names)}): set one, e.g. {key}.{names[0]}=..."
        )


def _setting_type(key: str, *, adding: bool = False) -> Any:
    """The declared type of the setting ``key`` names in :class:`ReplayConfig` (:func:`_declared_type`);
    None where ``key`` is a group or node (a dataclass), is Hydra's, or is appended (``adding``) where the
    schema has no such key. A key the schema does not have is a one-line :class:`ConfigError` listing the
    settings it has there."""
    if key.startswith("hydra."):  # Hydra's own, against its schema: 'hydra.job.chdir=abc' was its three lines
        t = _declared(key, refuse_unknown=not adding, root=HydraConf, skip=1)[0]
    else:
        t = _declared_type(key, refuse_unknown=not (adding or key.startswith("hydra")))
    return None if dataclasses.is_dataclass(t) else t  # a list of nodes is a setting: its items are checked


def _declared_type(key: str, *, refuse_unknown: bool = False) -> Any:
    """The schema's type at ``key``, through dataclass fields and list items (a dataclass for a node); None
    where it has none, or with ``refuse_unknown`` a :class:`ConfigError` for a field it does not have."""
    return _declared(key, refuse_unknown=refuse_unknown)[0]


def _declared(
    key: str, *, refuse_unknown: bool = False, root: Any = ReplayConfig, skip: int = 0
) -> tuple[Any, dataclasses.Field[Any] | None]:
    """:func:`_declared_type`, with the dataclass field ``key`` names (None for a list's item); ``root``:
    the schema its first ``skip`` parts name (Hydra's ``HydraConf`` for ``hydra.*``, whose launcher,
    sweeper, logging and callbacks it leaves open: None)."""
    t: Any = root
    f: dataclasses.Field[Any] | None = None
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if depth < skip:
            continue
        if dataclasses.is_dataclass(t):
            hints = typing.get_type_hints(t)
            if part not in hints:
                if not refuse_unknown:
                    return None, None
                where = f"{'.'.join(parts[:depth])} has" if depth else "skewlens replay has"
                close = difflib.get_close_matches(part, list(hints), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{key}: no such setting ({where} {', '.join(hints)}{hint})")
            t, f = hints[part], {g.name: g for g in dataclasses.fields(t)}[part]
        elif typing.get_origin(t) is list and part.isdigit():
            t, f = typing.get_args(t)[0], None
        else:
            return None, None
    return t, f


#: Hydra's groups of plugins, whose entry its own config chooses (``basic``).
PLUGIN_GROUPS = ("hydra/launcher", "hydra/sweeper")
#: Hydra's own configs (``hydra/job_logging/disabled.yaml``, ...), package data of hydra-core.
HYDRA_CONF_DIR = Path(hydra.__file__).parent / "conf"

#: The groups whose entry a ``+``/``++`` override may not add (:func:`_check_group_add`).
_ADDED_GROUPS = (*CHECKED_GROUPS, "topology", *PLUGIN_GROUPS)


def _check_add(o: Override, args: list[str], values: list[Any]) -> None:
    """``+key=value`` (``++key=value``) adds ``key`` to the config: a key the schema does not have is one line
    naming it, before any point runs (a sweep's every job had failed on it, one by one), and so is ``+`` of a
    setting that has a value whatever is chosen (one not null, of a type without null; Hydra merges a
    mapping or list ``values`` into it) or of a group
    ``replay.yaml`` chooses an entry of (``++`` of a group, which Hydra never takes): Hydra's "Could not
    append to config" or "Multiple values" were five lines, and a sweep stopped on them. A setting that may
    be null (``+real.nproc=2``) takes a ``+``."""
    key = o.key_or_group
    if not (o.is_add() or o.is_force_add()):
        return
    plain = (o.input_line or key).lstrip("+")
    if key in _ADDED_GROUPS:
        _check_group_add(o, args)
        return
    if key.startswith("hydra"):
        return
    t, f = _declared(key, refuse_unknown=True)
    if not o.is_add() or f is None or _own_primary_config(args):
        return
    nullable = type(None) in typing.get_args(t)
    unset = f.default == MISSING
    merged = any(isinstance(v, (dict, list)) for v in values)
    if not nullable and not unset and not merged:
        raise ConfigError(
            f"{o.input_line}: {key} has a value already (+ adds a key the config lacks); give {plain}"
        )


def _check_group_add(o: Override, args: list[str]) -> None:
    """``+group=entry`` (``++group=entry``) of a group ``replay.yaml`` (or Hydra's config) chooses an entry
    of, or any ``++`` of a group: a one-line :class:`ConfigError` saying to give ``group=entry``
    (:func:`_check_add`)."""
    key = o.key_or_group
    plain = (o.input_line or key).lstrip("+")
    if o.is_force_add():  # Hydra's "force-add of config groups is not supported", in three lines
        raise ConfigError(f"{o.input_line}: a group's entry is chosen, not added: give {plain}")
    if key in PLUGIN_GROUPS or not _own_primary_config(args):  # Hydra's config chooses basic ones
        what = "Hydra" if key in PLUGIN_GROUPS else "replay.yaml"
        raise ConfigError(f"{o.input_line}: {what} chooses a {key} already; give {plain}, without the +")


def check_group_adds(args: list[str]) -> None:
    """Each ``+``/``++`` override of a group's entry in ``args`` that :func:`_check_group_add` refuses, before
    the checks that read the chosen entries (:func:`check_list_items`), so that the first line says what is
    wrong: ``++topology=two_node_ib topology.dims.5.bandwidth_gbps=5`` said that two_node_ib has 2 items,
    not that a group's entry is chosen, not added. Overrides Hydra's grammar refuses are left to
    :func:`check_types`."""
    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if a.startswith("+")])
    except OverrideParseException:
        return  # check_types says how to quote it
    for o in overrides:
        if (o.is_add() or o.is_force_add()) and o.key_or_group in _ADDED_GROUPS:
            _check_group_add(o, args)


#: The schema of each config group's entries, against which a YAML file of the user's is checked.
GROUP_SCHEMAS: dict[str, type] = {
    "topology": TopologyConfig,
    "slowdown": SlowdownConfig,
    "scale": ScaleConfig,
}


def check_group_file(group: str, item: str, path: Path, settings: Sequence[Override] | None = None) -> None:
    """``path``, given as ``group=item``, is a YAML mapping of ``group``'s settings (what ``skewlens
    calibrate`` writes for a topology), else a one-line :class:`ConfigError` (YAML's own errors, and Hydra's
    around them, are tracebacks; a typo'd key or a value of the wrong type Hydra says in half a dozen lines;
    an empty file read as a missing name), with no YAML aliases
    (:func:`~skewlens.cli.options.refuse_yaml_aliases`). A ``defaults`` list (an entry that extends
    another) is Hydra's, and a file with a ``# @package`` header is left to Hydra. A key the schema lacks
    names its item and the likely key (:func:`file_key_problem`); a topology's values are checked with the
    command line's ``settings`` of it applied (:func:`check_entry_values`)."""
    refuse_yaml_aliases(path, f"{group}={item}")
    try:
        if package_header(path.read_text(encoding="utf-8"), f"{group}={item}") is not None:
            return
        doc = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError, OSError) as e:
        first = first_line(e)
        raise ConfigError(f"{group}={item}: not a YAML {group} ({first})") from None
    schema = GROUP_SCHEMAS[group]
    if not isinstance(doc, DictConfig) or not doc:
        raise ConfigError(f"{group}={item}: {holds_no(schema, group)}")
    extends = "defaults" in doc
    with contextlib.suppress(ConfigKeyError):
        del doc["defaults"]
    if (unknown := file_key_problem(OmegaConf.to_container(doc, resolve=False), schema, group)) is not None:
        # OmegaConf named the key alone ('bandwith_gbps: Key ... not in DimensionConfig'), not which item
        raise ConfigError(f"{group}={item}: {unknown}")
    try:  # a value of the wrong type: Hydra says it in half a dozen lines
        merged = OmegaConf.merge(OmegaConf.structured(schema), doc)
    except OmegaConfBaseException as e:
        first = first_line(e)
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{group}={item}: {key + ': ' if key else ''}{first}") from None
    if not extends and isinstance(merged, DictConfig):
        check_entry_values(group, item, path, merged, settings)


def group_settings(group: str, args: Sequence[str]) -> list[Override] | None:
    """The command line's settings of ``group``'s keys (``topology.dims.1.latency_ns=900``); None where they
    do not parse (:func:`check_types` says what is wrong with them)."""
    try:
        return OverridesParser.create().parse_overrides([a for a in args if a.startswith(f"{group}.")])
    except OverrideParseException:
        return None


def check_entry_values(
    group: str, item: str, path: Path, merged: DictConfig, settings: Sequence[Override] | None
) -> None:
    """The values of ``group``'s entry file ``path`` (a topology, slowdown or scale), with the command line's
    ``group.*`` settings applied and a topology's name the file's stem where it has none, pass the schema's
    checks (its ``__post_init__``; a slowdown's items resolved against its knobs), else a one-line
    :class:`ConfigError` naming the file and the key: checked when the composed config was, it did not name
    the file ('slowdown.entries[0].factor: must be a finite number > 0, got -0.5'), and in a sweep every
    job of that entry failed one by one after the others ran. Left to the composed config where a setting
    is swept (or ``settings`` is None: the command line does not parse) or a value is left for the command
    line or refers outside its group."""
    if settings is None or any(o.is_sweep_override() for o in settings):
        return
    if group == "topology" and OmegaConf.is_missing(merged, "name"):
        merged.name = path.stem
    try:
        for o in settings:
            OmegaConf.update(merged, o.key_or_group.removeprefix(f"{group}."), o.value(), merge=True)
        OmegaConf.to_object(OmegaConf.create({group: merged}))  # ${slowdown.factor} resolves there
    except ConfigError as e:
        raise ConfigError(f"{group}={item}: {str(e).strip().splitlines()[0]}") from None
    except OmegaConfBaseException:
        return  # a required value left unset, or a setting of another shape: the composed config says it


def check_user_entry(
    group: str, item: str, dirs: list[Path], settings: Sequence[Override] | None = None
) -> None:
    """Where ``group=item`` names an entry of the user's config ``dirs`` (not one of skewlens's), its file
    holds ``group``'s settings (:func:`check_group_file`, naming the file)."""
    if item in conf_entries(group):
        return
    for d in dirs:
        if (path := d / group / f"{item}.yaml").is_file():
            check_group_file(group, f"{item} ({path})", path, settings)
            return


def make_out_dir(args: list[str]) -> Path | None:
    """Make ``out=`` of ``args`` a directory before Hydra does (where it cannot, Hydra fails with a
    traceback): a one-line :class:`ConfigError` where it cannot be one. Returns the outermost directory this
    made (None where it existed), for :func:`remove_if_empty` after a command that wrote nothing there."""
    value = next((a.partition("=")[2] for a in args if a.startswith("out=")), "")
    if not value or "$" in value:  # an interpolation: Hydra resolves it
        return None
    path = Path(value).expanduser()
    first = path
    while not first.parent.exists() and first.parent != first:
        first = first.parent
    made = None if path.exists() else first
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"out={value}: cannot be made a directory ({why_not_created(path, e)})") from None
    return made


def remove_if_empty(top: Path, leaf: Path) -> None:
    """Remove ``leaf`` and its parents up to ``top`` where they hold nothing."""
    d = leaf
    while True:
        try:
            d.rmdir()
        except OSError:
            return
        if d == top:
            return
        d = d.parent


def topology_files(args: list[str], stored: list[str]) -> list[str]:
    """``topology=FILE.yaml`` (a path, not an entry name; also in a sweep's comma list): Hydra finds group
    entries only in its config sources, so each file is stored as an entry of the group ``topology`` in
    Hydra's ConfigStore (:func:`store_topology`), whose name is appended to ``stored``; the option is named
    after the file (``file_<stem>`` where a bundled or user entry has that name, where a package's config
    directory may have one, or where Hydra would read the name as a number, bool or null), and so is the
    topology where the file gives it no ``name``. The ConfigStore is in memory, and a sweep's launcher
    hands it to its job processes: each file was copied into a temporary directory put on
    ``hydra.searchpath``, which a replay killed with SIGKILL left behind (one more per kill), and which a
    node with no usable temporary directory could not have."""
    dirs = user_conf_dirs(args)
    builtin = known_entries("topology", dirs or [])
    settings = group_settings("topology", args)
    searched = dirs is None  # entries of a package's config directory may be there
    out = []
    for arg in args:
        key, eq, value = arg.partition("=")
        if key != "topology" or not eq or _plain_choices(value) is None:
            out.append(arg)
            continue
        names = []
        for item in value.split(","):
            p = Path(_unquoted(item)).expanduser()
            if p.suffix not in (".yaml", ".yml") and p.name == item:
                if not searched:
                    check_entry("topology", item, builtin, or_file=True)
                    check_user_entry("topology", item, dirs or [], settings)
                names.append(item)  # an entry of conf/topology/
                continue
            if p.is_dir():
                raise ConfigError(f"topology={item}: a directory; give a topology YAML file in it")
            if not p.is_file():
                raise ConfigError(f"topology={item}: no such file")
            check_group_file("topology", item, p, settings)
            # Hydra looks in the ConfigStore after every directory: an entry of a package's it cannot list
            # would be taken for the file of the same name
            own = not searched and p.stem not in builtin and _hydra_reads_as_name(p.stem)
            name = p.stem if own else f"file_{p.stem}"
            store_topology(p, name)
            stored.append(name)
            names.append(name)
        out.append(f"topology={','.join(names)}")
    return out


def store_topology(src: Path, name: str) -> None:
    """Store the topology file ``src`` as the ConfigStore entry ``topology/<name>``, with ``name:`` its stem
    where it gives none (the label of reports; a file without one was refused, 'topology.name: missing
    value'); a file with a ``# @package`` header in the package it names, as Hydra reads one from a
    directory (:meth:`ConfigSource._get_header_dict`, Hydra's own reading of the header)."""
    with src.open(encoding="utf-8") as f:  # as Hydra's FileConfigSource reads one
        package = package_header(f.read(), f"topology={src}")
        f.seek(0)
        doc = OmegaConf.load(f)
    if package is None and isinstance(doc, DictConfig) and "name" not in doc:
        doc.name = src.stem
    ConfigStore.instance().store(group="topology", name=name, node=doc, package=package)


def package_header(text: str, what: str) -> str | None:
    """The package an entry file's ``# @package`` header names (``_global_``), None where it has none, read
    as Hydra reads it (:meth:`ConfigSource._get_header_dict`, over the file's first 512 characters: also
    ``#@package _global_``, or after another ``# @key value`` line). The checks that leave such a file to
    Hydra and :func:`store_topology` all read it here: the checks' own ``startswith("# @package")`` refused
    ``#@package _global_``, which Hydra places. A header Hydra cannot read is a one-line :class:`ConfigError`
    naming ``what`` (``topology=FILE``)."""
    try:
        return ConfigSource._get_header_dict(text[:512])["package"]
    except ValueError as e:  # ('# @package' with no value: "Expected header format: KEY VALUE, got ...")
        raise ConfigError(f"{what}: its header: {first_line(e)}") from None


def forget_topologies(stored: list[str]) -> None:
    """Remove the ConfigStore entries :func:`topology_files` stored: a later command in the same process
    (the Python API, a test) would otherwise find a file's entry under its name."""
    group = ConfigStore.instance().repo.get("topology", {})
    for name in stored:
        group.pop(f"{name}.yaml", None)


def _hydra_reads_as_name(stem: str) -> bool:
    """Whether Hydra's grammar reads ``topology=<stem>`` as a name: ``400``, ``1e3``, ``true`` and
    ``null`` are a number, a bool and None to it (a file named so was a traceback: 'Config group
    override must be a string or a list. Got int')."""
    try:
        return isinstance(OverridesParser.create().parse_override(f"topology={stem}").value(), str)
    except OverrideParseException:
        return True  # refused later, naming the file, as before


def _unquoted(item: str) -> str:
    """A value as Hydra reads it where it is in Hydra's quotes (``'runs/my cal.yaml'``, as skewlens calibrate
    prints a path with a space: taken as it stood, the file was not found), else as written."""
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
        with contextlib.suppress(OverrideParseException):
            value = OverridesParser.create().parse_override(f"topology={item}").value()
            if isinstance(value, str):
                return value
    return item


#: Hydra's run modes: it takes one at a time, and says so with a traceback.
HYDRA_MODES = (
    ("-m", "--multirun"),
    ("-c", "--cfg"),
    ("-i", "--info"),
    ("-r", "--run"),
    ("-sc", "--shell-completion"),
)


def _multirun(args: Sequence[str]) -> bool:
    """Whether ``args`` ask for a multirun: ``-m``, ``--multirun`` (or a prefix of it), or Hydra's
    ``hydra.mode=MULTIRUN`` override (the last ``hydra.mode=`` given)."""
    modes = [a.partition("=")[2] for a in args if a.startswith("hydra.mode=")]
    if modes and modes[-1].strip("'\"").upper() == "MULTIRUN":
        return True
    return any(a.startswith("-") and _hydra_flag(a) == HYDRA_MODES[0] for a in args)


def _own_primary_config(args: Sequence[str]) -> bool:
    """Whether ``args`` choose a primary config of the user's (``-cn NAME``) in place of ``conf/replay.yaml``.
    Its defaults and settings may choose other entries, a launcher, a sweeper or ``hydra.mode``, which the
    checks that read ``replay.yaml``'s (the list items, the launcher's settings, a sweep without ``-m``,
    ``interval()``) cannot see: those are left to Hydra there. (A ``replay.yaml`` in a ``-cd`` directory is
    not one: Hydra takes skewlens's first.)"""
    return any(a.startswith("-") and _hydra_flag(a) == ("-cn", "--config-name") for a in args)


def check_modes(args: Sequence[str]) -> None:
    """At most one Hydra run mode in ``args`` (:data:`HYDRA_MODES`), else a one-line :class:`ConfigError`."""
    given = [long for short, long in HYDRA_MODES if any(a in (short, long) for a in args)]
    if len(given) > 1:
        raise ConfigError(
            f"{' and '.join(given)}: Hydra takes one of {', '.join(m for _, m in HYDRA_MODES)} at a time"
        )
    if given == ["--shell-completion"]:
        # its install=bash was refused as 'install: no such setting'; the script Hydra prints asks the
        # command's first word (skewlens) for completions, which is no Hydra app
        raise ConfigError(
            "--shell-completion: Hydra's tab completion completes a command that is itself a Hydra app, not "
            "a subcommand such as skewlens replay; skewlens replay --help lists the groups and settings"
        )


#: Hydra's flags (``hydra._internal.utils.get_args_parser``): those that take a value, the one whose value is
#: optional (with its choices), and those that take none.
HYDRA_CFG = ("-c", "--cfg")
HYDRA_CFG_CHOICES = ("job", "hydra", "all")
HYDRA_VALUE_FLAGS = (
    HYDRA_CFG,
    ("-p", "--package"),
    ("-cp", "--config-path"),
    ("-cn", "--config-name"),
    ("-cd", "--config-dir"),
    ("", "--experimental-rerun"),
)
HYDRA_INFO = ("-i", "--info")
HYDRA_INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
HYDRA_PLAIN_FLAGS = (
    ("-h", "--help"),
    ("", "--hydra-help"),
    ("", "--version"),
    ("", "--resolve"),
    ("-r", "--run"),
    ("-m", "--multirun"),
    ("-sc", "--shell-completion"),
)
_KEY = re.compile(r"\+{0,2}[A-Za-z_]\w*(\.\w+)*")
#: Hydra's flags that show the composed config, or help, and run nothing (a sweep's launcher is not started:
#: ``hydra.mode=MULTIRUN hydra/launcher=submitit_slurm --cfg hydra`` composes its SLURM settings off SLURM).
SHOW_ONLY = (HYDRA_CFG, HYDRA_INFO, ("-h", "--help"), ("", "--hydra-help"))


def _hydra_flag(arg: str) -> tuple[str, ...] | None:
    """The Hydra flag (short, long) ``arg`` names (``--cfg=job`` too; a long one by a unique prefix, as
    argparse takes it), else None."""
    name = arg.partition("=")[0]
    flags = (*HYDRA_VALUE_FLAGS, HYDRA_INFO, *HYDRA_PLAIN_FLAGS)
    for flag in flags:
        if name in flag and name:
            return flag
    if name.startswith("--"):
        close = [f for f in flags if f[1].startswith(name)]
        if len(close) == 1:
            return close[0]
    return None


def _flag_width(flag: tuple[str, ...], arg: str, nxt: str | None) -> int:
    """How many arguments the Hydra flag ``flag`` given as ``arg``, ``nxt`` after it, spans: 2 where the
    next one is its value (``--cfg job``, ``--info config``), else 1 (``--cfg=job``, ``-m``)."""
    takes = flag in HYDRA_VALUE_FLAGS or (flag == HYDRA_INFO and nxt in HYDRA_INFO_CHOICES)
    return 2 if takes and "=" not in arg else 1


def flags_last(args: Sequence[str]) -> list[str]:
    """``args`` (checked by :func:`check_arguments`) with the overrides first and Hydra's flags and their
    values after them, each in its order. Hydra's argparse takes the overrides as one run of positional
    arguments, so a flag between two (``trace=RUN out=OUT --cfg job topology=ring``: a flag added at the end
    of a command line, then another override) was argparse's usage and ``unrecognized arguments:
    topology=ring``; the flags mean the same wherever they are, and last, ``--info`` without a value does
    not take an override for one."""
    flags: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        flag = _hydra_flag(arg) if arg.startswith("-") else None
        if flag is None:
            overrides.append(arg)
            i += 1
            continue
        width = _flag_width(flag, arg, args[i + 1] if i + 1 < len(args) else None)
        flags += args[i : i + width]
        i += width
    return [*overrides, *flags]


def check_arguments(args: Sequence[str]) -> None:
    """Each argument is a ``key=value`` override (``~key`` deletes one), a Hydra flag or its value, else a
    one-line :class:`ConfigError` naming it and saying what was likely meant: a run directory given as a
    path (``check``, ``analyze`` take one) is ``trace=PATH``, ``key value`` and ``--key value`` are
    ``key=value``. Hydra's own message is its grammar error in five lines, or argparse's usage."""
    i = 0
    while i < len(args):
        arg = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        loose = nxt is not None and not nxt.startswith("-") and "=" not in nxt  # a value without its key
        if arg.startswith("-"):
            flag = _hydra_flag(arg)
            if flag is not None:
                value = arg.partition("=")[2] if "=" in arg else nxt
                if flag in HYDRA_VALUE_FLAGS and (value is None or value.startswith("-")):
                    raise ConfigError(f"{arg}: expects a value")
                if flag == HYDRA_CFG and value not in HYDRA_CFG_CHOICES:
                    raise ConfigError(f"{arg}: expects one of {', '.join(HYDRA_CFG_CHOICES)}, got {value!r}")
                i += _flag_width(flag, arg, nxt)
                continue
            name, eq, value = arg.lstrip("-").partition("=")
            key = name.replace("-", "_")
            if _KEY.fullmatch(key) and _declared_type(key) is not None:
                given = value if eq else nxt if loose else None
                if given is None:
                    given = "true" if _declared_type(key) is bool else "..."
                raise ConfigError(f"{arg}: replay takes key=value overrides: did you mean {key}={given}?")
            raise ConfigError(
                f"{arg}: not an option of skewlens replay (it takes key=value overrides and Hydra's flags: "
                "skewlens replay --help)"
            )
        if "=" in arg or arg.startswith("~"):
            i += 1
            continue
        path = Path(arg).expanduser()
        if "/" in arg or path.exists():
            raise ConfigError(f"{arg}: replay takes key=value overrides: did you mean trace={arg}?")
        if _KEY.fullmatch(arg):
            for group in (*CHECKED_GROUPS, "topology"):
                if arg in conf_entries(group):
                    raise ConfigError(f"{arg}: replay takes key=value overrides: did you mean {group}={arg}?")
            given = nxt if loose else "..."
            raise ConfigError(f"{arg}: replay takes key=value overrides: did you mean {arg}={given}?")
        raise ConfigError(f"{arg}: replay takes key=value overrides (quote one that holds spaces)")


def main(argv: list[str] | None = None) -> int:
    """Entry point: Hydra parses ``argv`` (``key=value`` overrides, ``-m`` for sweeps, ``--help``). SIGTERM
    interrupts it as Ctrl-C does (``skewlens.cli.sigterm_as_interrupt``, as every subcommand)."""
    register_configs()
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a == "-V" or (a.startswith("--") and _hydra_flag(a) == ("", "--version")) for a in args):
        from skewlens import __version__

        print(f"skewlens {__version__}")  # as ``skewlens --version``; Hydra's would say its own
        return 0
    check_arguments(args)
    check_modes(args)
    check_config_path(args)
    check_config_name(args)
    check_rerun(args)
    check_group_lists(args)
    check_groups(args)
    check_launcher(args)
    check_group_adds(args)
    check_list_items(args)
    check_types(args)
    check_primary_config(args)
    check_sweeper_params(args)
    warn_group_overrides(args)
    errors: list[SkewlensError] = []

    def task(cfg: DictConfig) -> None:
        # The console is made here, not captured: a sweep's launcher may pickle this function into worker
        # processes (joblib, submitit), and a Console holds a lock. A job of a sweep leaves its error to the
        # sweep's summary (skewlens.replay.sweep), which runs where the sweep was launched. A worker's
        # streams are its own: they print what their encoding lacks as the command's do.
        try:
            with encodable_output():
                run_job(cfg, report_console())
        except SkewlensError as e:
            if not record_failure(e):
                errors.append(e)
        except MemoryError as e:  # Hydra printed it as a traceback, and it ended a sweep's other points
            if not record_failure(failure := out_of_memory(e)):
                errors.append(failure)
        except UnicodeEncodeError as e:  # a name this locale cannot decode: one line, as the dispatcher's
            if (why := undecodable_name(e)) is None:
                raise
            if not record_failure(failure := SkewlensError(why)):
                errors.append(failure)

    app = hydra.main(config_path=str(CONF_DIR), config_name="replay", version_base=None)(task)
    saved = sys.argv
    with contextlib.ExitStack() as stack:
        stored: list[str] = []
        stack.callback(forget_topologies, stored)
        hydra_args = topology_files(args, stored)
        made = make_out_dir(args)
        sys.argv = ["skewlens replay", *flags_last(hydra_args)]  # argparse names the program after it
        # --info prints through logging, whose handler took a closed stdout (`| head`) as an error per line
        info = (
            QuietPipe(sys.stdout) if any(_hydra_flag(a) == HYDRA_INFO for a in args if a[:1] == "-") else None
        )
        try:
            with contextlib.redirect_stdout(info) if info is not None else contextlib.nullcontext():
                app()
        except SystemExit as e:
            if e.code not in (0, None):
                return 2
        except KeyboardInterrupt as e:  # a sweep's says which jobs finished and where their outputs are
            if (said := interrupted()) is None:
                raise
            raise KeyboardInterrupt("; ".join([*map(str, e.args[:1]), said])) from None
        finally:
            end_sweep()  # an interrupted sweep's .jobs/ released
            sys.argv = saved
            if made is not None:  # made here for this command: not left behind empty
                remove_if_empty(made, Path(next(a for a in args if a.startswith("out=")).partition("=")[2]))
    if info is not None and info.broken:
        raise BrokenPipeError  # skewlens.cli: the exit status of a command whose reader went away
    if errors:
        raise errors[0]
    return 0
