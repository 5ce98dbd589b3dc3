"""``skewlens calibrate RUN_DIR --out topology.yaml``: fit the network a run saw, write a topology entry.

    skewlens calibrate RUN --out cal.yaml                       # one switch, ring formulas
    skewlens calibrate RUN --out cal.yaml --topology two_node_ib # that shape; fit each dimension crossed
    skewlens replay trace=RUN out=OUT topology=cal.yaml comm_mode=model

The fit is :func:`skewlens.replay.calibrate.calibrate` (see its module docstring); this module loads the
run and the base topology, renders the fit as a table and writes the entry atomically.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.table import Table

from skewlens.cli.options import ArgumentParser, refuse_yaml_aliases, user_path
from skewlens.console import print_line, print_warning, report_console
from skewlens.paths import CONF_DIR, conf_entries
from skewlens.profiler.atomic import check_writable
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.issues import override, replay_command
from skewlens.replay.calibrate import (
    Calibration,
    Fit,
    calibrate,
    poor_fits,
    untraced_members,
    write_topology,
)
from skewlens.replay.config import TopologyConfig, file_key_problem, holds_no
from skewlens.replay.errors import ConfigError, first_line
from skewlens.replay.network.algorithms import ALGORITHMS
from skewlens.rich_progress import RichProgress

#: The option that calibrates from a run whose communication does not match across ranks.
LENIENT_OPTION = "--lenient"


def topology_entry_path(value: str) -> Path:
    """The YAML file of ``value``: a path to a file, or the name of an entry in ``conf/topology/``."""
    p = Path(value).expanduser()
    entry = CONF_DIR / "topology" / f"{value}.yaml"
    if p.suffix in (".yaml", ".yml") or p.name != value or (p.is_file() and not entry.is_file()):
        if not p.is_file():
            raise ConfigError(f"--topology {value}: no such file")
        return p
    if not entry.is_file():
        names = ", ".join(sorted(conf_entries("topology")))
        raise ConfigError(f"--topology {value}: no such file or topology entry (entries: {names})")
    return entry


def load_topology_entry(value: str) -> TopologyConfig:
    """A topology entry (file or ``conf/topology/`` name) read with the replay's schema, as
    ``skewlens replay topology=...`` reads it; errors name the file and the key."""
    path = topology_entry_path(value)
    refuse_yaml_aliases(path, f"--topology {value}")
    try:
        doc = OmegaConf.load(path)
        if not isinstance(doc, DictConfig) or not doc:  # a list: 'Cannot merge DictConfig with ListConfig'
            raise ConfigError(holds_no(TopologyConfig, "topology"))  # as the replay says it
        # as the replay reads a file: a typo named, the name the file's stem
        if (unknown := file_key_problem(OmegaConf.to_container(doc), TopologyConfig, "topology")) is not None:
            raise ConfigError(unknown)
        if "name" not in doc:
            doc.name = path.stem
        merged = OmegaConf.merge(OmegaConf.structured(TopologyConfig), doc)
        obj = OmegaConf.to_object(merged)
    except ConfigError as e:
        raise ConfigError(f"{path}: {str(e).strip().splitlines()[0]}") from None
    except (OmegaConfBaseException, OSError, ValueError) as e:
        first = first_line(e)
        raise ConfigError(f"{path}: {first}") from None
    if not isinstance(obj, TopologyConfig):
        raise ConfigError(f"{path}: not a topology entry")
    return obj


def _num(x: float, fmt: str) -> str:
    if math.isnan(x):
        return "-"
    s = format(x, fmt)
    return s[1:] if s.startswith("-") and float(s) == 0 else s  # -0.000: a fit that explains nothing


def plain_number(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant figures in plain notation, trailing zeros dropped (``10000``,
    ``12.35``, ``0.01234``, ``0.5``), where ``:g`` wrote ``1e+04``."""
    if not math.isfinite(x) or x == 0:
        return format(x, "g")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    s = f"{x:.{decimals}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def _fit_row(f: Fit, mark: str) -> tuple[str, ...]:
    return (
        f.label + mark,
        str(f.n),
        str(f.sizes),
        f"{f.latency_ns / 1e3:.1f}",
        "-" if f.latency_only else plain_number(f.bandwidth_gbps),
        _num(f.r2, ".3f"),
        f"{f.median_residual:.1%}",
        f"{f.p90_residual:.1%}",
    )


def calibration_table(cal: Calibration) -> Table:
    """The fit per link class (what the topology holds: the first section, bold) and per (group, type) on
    its own, with the residuals ``|recorded − model| / recorded`` of each row's own fit; notes under the
    table, worded to hold without the styling (a pipe has no bold)."""
    notes: list[str] = []

    def mark(f: Fit) -> str:
        if not f.note:
            return ""
        notes.append(f"[{len(notes) + 1}] {f.label}: {f.note}")
        return f" [{len(notes)}]"

    title = f"Calibration ({cal.algorithm}) from {cal.run_dir}: {len(cal.transfers)} transfers"
    t = Table(title=title, collapse_padding=True, min_width=len(title))  # narrower, it wrapped a path in two
    for col, just in (
        ("fit", "left"),
        ("n", "right"),
        ("sizes", "right"),
        ("α µs", "right"),
        ("B GB/s", "right"),
        ("R²", "right"),
        ("med res", "right"),
        ("p90 res", "right"),
    ):
        t.add_column(col, justify=just, no_wrap=col == "fit")  # type: ignore[arg-type]
    for f in cal.links:
        t.add_row(*_fit_row(f, mark(f)), style="bold")
    if cal.groups:
        t.add_section()
    for f in cal.groups:
        t.add_row(*_fit_row(f, mark(f)))
    t.caption = "\n".join(
        [
            (
                "above the line: per link class, written to the topology; below it: per group and type, "
                "each fitted on its own (not written)"
                if cal.groups
                else "per link class, written to the topology"
            )
            + "; res: |recorded − model| / recorded",
            *notes,
        ]
    )
    t.caption_justify = "left"
    return t


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="skewlens calibrate",
        description="Fit the latency and bandwidth of the α-β network model to a run's recorded transfers "
        "(waits for late peers removed) and write a topology entry that `skewlens replay "
        "topology=FILE comm_mode=model` loads.",
    )
    p.add_argument(
        "run_dir", type=user_path, metavar="RUN_DIR", help="run directory (manifest.json + rank-<r>.et)"
    )
    p.add_argument(
        "--out", type=user_path, required=True, metavar="FILE", help="topology YAML to write (e.g. cal.yaml)"
    )
    p.add_argument(
        "--topology",
        default=None,
        metavar="NAME|FILE",
        help="base topology, a YAML file or one of skewlens replay's topology entries "
        f"({', '.join(sorted(conf_entries('topology')))}): its dimensions are the link classes fitted, its "
        "placement maps ranks to them (default: every rank on one switch)",
    )
    p.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=None,
        help="collective algorithm the formulas assume (default: the base topology's, else ring)",
    )
    p.add_argument("--name", default=None, help="the entry's name (default: the --out file's stem)")
    p.add_argument(
        LENIENT_OPTION,
        action="store_true",
        help="calibrate from a run whose communication does not match across ranks (what disagrees is "
        "left out)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    if out.is_dir():
        raise SkewlensError(f"--out {out}: is a directory (give the YAML file to write)")
    check_writable(out)  # before the fit, which takes a while, not after it
    base_cfg = load_topology_entry(args.topology) if args.topology else None
    from skewlens.profiler.store.validate import load_validated
    from skewlens.progress import NO_PROGRESS

    err = report_console(stderr=True)
    run = load_validated(
        args.run_dir,
        progress=NO_PROGRESS if args.no_progress else RichProgress(err),
        lenient=args.lenient,
        lenient_option=LENIENT_OPTION,
    )
    cal = calibrate(
        run,
        base=base_cfg.to_topology() if base_cfg is not None else None,
        algorithm=args.algorithm or (base_cfg.algorithm if base_cfg is not None else None),
    )
    console = report_console()
    console.print(calibration_table(cal))
    for d in cal.kept:
        console.print(f"dim {d} ({cal.topology.dims[d].kind}): crossed by no transfer, kept from the base")
    if cal.skipped:  # warnings, on stderr: a script's > out.txt gets the results only
        print_warning(
            "calibrate",
            f"{cal.skipped} transfers left out (recorded as 0 ns, or within one unit of the topology)",
        )
    for group, (traced, members) in sorted(untraced_members(run).items()):
        print_warning(
            "calibrate",
            f"group '{group}' left out: {traced} of its {members} ranks have a trace, so its transfers "
            "cannot be told from waits for the others",
        )
    write_topology(cal, out, name=args.name or out.stem)
    print_line(
        console,
        f"wrote {out}; replay with: "
        f"{replay_command(str(args.run_dir), override('topology', str(out)), 'comm_mode=model')}",
    )
    for warning in poor_fits(cal):
        print_warning("calibrate", warning)
    return 0
