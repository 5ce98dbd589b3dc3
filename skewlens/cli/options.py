"""Checks of the subcommands' number options, after parsing: an out-of-range value is one line naming the
option (``--workers: expected 1..1,048,576, got 100000000000000000000``), as a :class:`SkewlensError`, before
anything starts (a huge ``--workers`` was an OverflowError traceback in the process pool)."""

from __future__ import annotations

import argparse
import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from skewlens.profiler.bounded import open_regular
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.manifest import MANIFEST_NAME
from skewlens.replay.errors import ConfigError


def check_range(option: str, value: float | None, lo: float, hi: float, why: str = "") -> None:
    """``value`` (None: not given) is within ``lo..hi`` (NaN is not), else a :class:`SkewlensError` naming
    ``option``; ``why``: what the bound is, in a few words, said after it."""
    if value is not None and not lo <= value <= hi:
        bound = f"{lo:,g}..{hi:,g}" if isinstance(lo, float) or isinstance(hi, float) else f"{lo:,}..{hi:,}"
        raise SkewlensError(f"{option}: expected {bound}{f' ({why})' if why else ''}, got {value}")


def user_path(value: str) -> str:
    """An argument's path with a leading ``~`` or ``~user`` expanded as the shell expands a word that begins
    with one: the shell leaves ``--out=~/x`` and a quoted ``'~/run'`` as they are, and the command made
    ``./~/x``, a directory named ``~`` (or said of ``'~/run'`` that it found no such run). A user not known
    here leaves the path as written (then named as not found). The argparse ``type`` of path arguments."""
    return os.path.expanduser(value)  # noqa: PTH111 (the str the arguments hold; Path's raises for ~nobody)


def user_file(value: str) -> Path:
    """:func:`user_path` as a :class:`Path`: the ``type`` of the path arguments held as paths."""
    return Path(user_path(value))


def help_text(doc: str | None) -> str:
    """A docstring's words as ``--help`` shows them: without the double backquotes that mark its literals
    (argparse printed them as they stand)."""
    return (doc or "").replace("``", "")


def refuse_yaml_aliases(path: Path, label: str) -> None:
    """A one-line :class:`ConfigError` (``label: ...``) where the YAML file ``path`` uses an alias
    (``*name``), or is not a regular file; read as a stream of events, nothing expanded. Each alias expands
    in place where OmegaConf loads the file: a 443-byte topology of nine aliases nested nine deep (387
    million strings) held 3.5 GB for over 5 minutes. Whether the rest is valid YAML its loader then says."""
    try:
        with open_regular(path) as fh:
            for event in yaml.parse(fh, Loader=yaml.SafeLoader):
                if isinstance(event, yaml.AliasEvent):
                    line = event.start_mark.line + 1
                    raise ConfigError(
                        f"{label}: YAML alias *{event.anchor} at line {line}: aliases are not read (each "
                        "expands in place; write the value out)"
                    )
    except OSError as e:
        raise ConfigError(f"{label}: cannot read {path} ({e.strerror or e})") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        return  # the loader says what is wrong, as before


#: How argparse begins its refusal of words no argument takes.
UNRECOGNIZED = "unrecognized arguments: "


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, which also takes an option's value that begins as a negative number does but is
    not a plain one (``--steps -1:1:3``, ``--straggler-ms -1e3``): argparse took it for an option and said
    ``argument --steps: expected one argument``, where the option's own check says what is wrong with the
    value. argparse already takes ``-1`` and ``-.5`` for values where no option looks like a negative
    number (none of ours does); its rule is widened to any ``-`` then a digit, or ``.`` and a digit. Other
    values that begin with ``-`` (a path ``-x``) are still taken for options, with a hint to write
    ``--out=-x``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> typing.NoReturn:
        if message.endswith(": expected one argument"):
            option = message.removeprefix("argument ").partition(":")[0].split("/")[-1]
            message += f" (a value that begins with '-' is written {option}=VALUE)"
        elif message.startswith(UNRECOGNIZED) and any(
            (Path(a) / MANIFEST_NAME).is_file() for a in message.removeprefix(UNRECOGNIZED).split()
        ):  # `skewlens analyze host0/RUN host1/RUN`: each host's directory of a job captured across hosts
            message += (
                f" ({self.prog} reads one run directory: combine the run directories of a job's hosts "
                "with skewlens merge --out RUN DIR..., then give it RUN)"
            )
        super().error(message)
