"""Which host execution trace belongs to which Kineto trace (a host trace has no rank field).

Two rules, both tried:

- **pid**: the host trace's ``pid`` equals the process id of the Kineto trace's ``cpu_op`` events (both
  recorded by the same process). Unique on one host; may collide across hosts.
- **file name**: the trailing number of the host trace's file name is the rank
  (``dlrm_eg_3.json`` -> rank 3, as PARAM and Chakra name them).

A rule applies when it pairs every trace one-to-one. If both apply and disagree, or neither applies,
the import stops with an error saying so; otherwise the applicable rule is used (and named in the
manifest notes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.importers.host_et import HostTrace
from skewlens.profiler.importers.kineto import KinetoTrace

_TRAILING_NUMBER = re.compile(r"(\d+)\.json(?:\.gz)?$")


def _by_pid(kinetos: Sequence[KinetoTrace], hosts: Sequence[HostTrace]) -> dict[int, HostTrace] | None:
    out: dict[int, HostTrace] = {}
    for kt in kinetos:
        cands = [h for h in hosts if h.pid is not None and h.pid in kt.cpu_pids]
        if len(cands) != 1:
            return None
        out[kt.rank] = cands[0]
    return out if len({id(h) for h in out.values()}) == len(hosts) else None


def _by_name(kinetos: Sequence[KinetoTrace], hosts: Sequence[HostTrace]) -> dict[int, HostTrace] | None:
    out: dict[int, HostTrace] = {}
    for h in hosts:
        m = _TRAILING_NUMBER.search(h.path.name)
        if m is None or int(m.group(1)) in out:
            return None
        out[int(m.group(1))] = h
    return out if set(out) == {kt.rank for kt in kinetos} else None


def pair_host_traces(
    kinetos: Sequence[KinetoTrace], hosts: Sequence[HostTrace]
) -> tuple[dict[int, HostTrace], str]:
    """Map each Kineto trace's rank to its host trace; returns the mapping and the rule used."""
    if len(hosts) != len(kinetos):
        raise TraceImportError(
            f"{len(hosts)} host execution trace(s) for {len(kinetos)} Kineto trace(s): give one per rank"
        )
    pid, name = _by_pid(kinetos, hosts), _by_name(kinetos, hosts)
    if pid is not None and name is not None and any(pid[r] is not name[r] for r in pid):
        r = next(r for r in pid if pid[r] is not name[r])
        raise TraceImportError(
            f"ambiguous host-trace pairing for rank {r}: pid says {pid[r].path.name}, "
            f"file-name number says {name[r].path.name}"
        )
    if pid is not None:
        return pid, "pid"
    if name is not None:
        return name, "file-name number"
    raise TraceImportError(
        "cannot pair host execution traces with Kineto traces: neither the pids "
        f"({sorted(h.pid for h in hosts if h.pid is not None)}) nor the trailing numbers of the file names "
        f"({[h.path.name for h in hosts]}) match the ranks {sorted(kt.rank for kt in kinetos)} one-to-one"
    )
