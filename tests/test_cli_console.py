"""The commands' report console: wide where it writes to a file or a pipe, unless COLUMNS says otherwise."""

from __future__ import annotations

import pytest

from skewlens.cli.console import FILE_WIDTH, report_console


def test_a_report_to_a_pipe_is_wide_enough_for_the_cause_column(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = report_console()
    assert not console.is_terminal  # pytest captures stdout
    assert console.width == FILE_WIDTH > 80


def test_columns_in_the_environment_still_decide_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "90")
    assert report_console().width == 90
    assert report_console(stderr=True).width == 90
