"""Attributes the capture replaces in torch (functions, methods), and how they are put back.

A program may wrap the same functions itself (an in-house communication logger that replaces
``torch.distributed.all_reduce`` with a function that counts and times the call, then calls what it
replaced). Installed after the capture's hooks, its wrapper calls the hook, which calls torch's function;
putting torch's function back as the attribute would then remove the program's wrapper too, so that it
stopped logging at the end of the capture window, in the middle of the run. :func:`put_back` restores an
attribute only where it still holds the capture's replacement; elsewhere it leaves the program's wrapper in
place, and the replacement it calls must then pass calls through unchanged (:class:`Patches.live`).
"""

from __future__ import annotations

from typing import Any


class Patches:
    """The replacements made so far, in the order made, and whether they are still in force."""

    __slots__ = ("_made", "live")

    def __init__(self) -> None:
        self._made: list[tuple[Any, str, Any, Any]] = []
        self.live = False
        """True between :meth:`set` and :meth:`put_back`: a replacement left in a program's chain of
        wrappers after that records nothing and calls what it replaced."""

    def set(self, owner: Any, name: str, orig: Any, new: Any) -> None:
        """Replace ``owner.name`` (now ``orig``) by ``new``."""
        self._made.append((owner, name, orig, new))
        setattr(owner, name, new)
        self.live = True

    def put_back(self) -> None:
        """Undo the replacements, last first, each where ``owner.name`` is still the replacement (a
        wrapper the program installed over one stays, calling it, and it calls the original)."""
        for owner, name, orig, new in reversed(self._made):
            if getattr(owner, name, None) is new:
                setattr(owner, name, orig)
        self._made.clear()
        self.live = False
