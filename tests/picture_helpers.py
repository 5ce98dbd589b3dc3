"""For the tests of the pictures: the figures they draw, and how far apart their colours look to people with
and without colour-vision deficiencies."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

#: Machado, Oliveira and Fernandes (2009), severity 1: linear RGB as each dichromacy sees it.
SIMULATIONS = {
    "normal vision": np.eye(3),
    "deuteranopia": np.array(
        [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]
    ),
    "protanopia": np.array(
        [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]
    ),
    "tritanopia": np.array(
        [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]]
    ),
}

_SRGB_TO_XYZ = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
_WHITE = np.array([0.95047, 1.0, 1.08883])


def _lab(linear: Any) -> Any:
    xyz = (_SRGB_TO_XYZ @ linear) / _WHITE
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _linear(rgb: Sequence[float]) -> Any:
    c = np.asarray(rgb[:3], dtype=np.float64)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def closest_pair(colours: Sequence[Sequence[float]]) -> tuple[float, str]:
    """The smallest CIELAB distance between two of ``colours`` (RGB(A) in 0-1) as any of
    :data:`SIMULATIONS` sees them, and which one."""

    def seen(m: Any, rgb: Sequence[float]) -> Any:
        return _lab(np.clip(m @ _linear(rgb), 0, 1))

    return min(
        (float(np.linalg.norm(seen(m, a) - seen(m, b))), name)
        for name, m in SIMULATIONS.items()
        for a, b in itertools.combinations(colours, 2)
    )


def stacked_parts(fig: Any) -> tuple[list[str], list[Any], list[str]]:
    """Of a figure of stacked bars: the parts' names bottom to top, their colours, and the legend's names
    top to bottom."""
    ax = fig.axes[0]
    bars = sorted(ax.containers, key=lambda c: c.patches[0].get_y())
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    return [c.get_label() for c in bars], [c.patches[0].get_facecolor() for c in bars], legend


def assert_read_without_colour_names(fig: Any, parts: list[str]) -> None:
    """Of a figure of stacked bars: its parts bottom to top are ``parts``, the legend lists them as the
    bars stack (top to bottom), and every two of their colours are 30 or more apart (CIELAB) as each
    simulated dichromacy sees them."""
    drawn, colours, legend = stacked_parts(fig)
    assert drawn == parts
    assert legend == parts[::-1]
    distance, seen_with = closest_pair(colours)
    assert distance >= 30, seen_with


def drawn_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the analyses' pictures draw from now on, in order, instead of writing them."""
    drawn: list[Any] = []
    monkeypatch.setattr("skewlens.analysis.plots.save_png", lambda fig, path: drawn.append(fig) or path)
    return drawn
