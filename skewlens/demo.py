"""``skewlens demo``: the end-to-end demo on the bundled example."""

from __future__ import annotations


def main(argv: list[str]) -> int:
    from profiler.errors import SkewlensError

    raise SkewlensError("the demo is being built; see README.md")
