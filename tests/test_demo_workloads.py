"""``skewlens demo --workload NAME``: the names it knows, and a clear refusal of any other."""

from __future__ import annotations

from pathlib import Path

import pytest

from skewlens.cli import demo
from skewlens.paths import EXAMPLES_DIR
from skewlens.profiler.errors import SkewlensError


def test_an_unknown_workload_is_refused_naming_every_known_one_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    with pytest.raises(SkewlensError) as err:
        demo.main(["--workload", "bogus", "--out", str(out)])
    msg = str(err.value)
    assert "'bogus'" in msg and "unknown" in msg
    names = ("train", "fsdp2", "fsdp1", "tp", "pipeline-gpipe", "pipeline-1f1b", "ddp-accum", "ddp-compile")
    names += ("mesh2d",)
    assert all(name in msg for name in names)
    assert not out.exists()  # refused before the output directory was made


def test_every_workload_names_a_bundled_script_and_train_stays_the_default() -> None:
    assert set(demo.WORKLOADS) == {
        "train", "fsdp2", "fsdp1", "tp", "pipeline-gpipe", "pipeline-1f1b", "ddp-accum", "ddp-compile",
        "mesh2d",
    }  # fmt: skip
    for name, work in demo.WORKLOADS.items():
        assert (EXAMPLES_DIR / work.script).is_file(), name
        assert 0 <= work.straggler_rank < work.nproc, name
    assert demo._parser().parse_args([]).workload == "train"
    assert (demo.WORKLOADS["train"].nproc, demo.WORKLOADS["train"].straggler_rank) == (4, 2)
    assert demo.WORKLOADS["mesh2d"].nproc == 4
