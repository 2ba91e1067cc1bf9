"""INFO lines on the ``te`` logger said once a process: te's silent fallbacks (a graphed callable
run eagerly, a checkpoint without scaling state) are told, not repeated every step."""

from __future__ import annotations

import logging

_log = logging.getLogger("te")
told: set[str] = set()


def info_once(key: str, msg: str) -> None:
    """Logs ``msg`` at INFO the first time ``key`` is seen in this process."""
    if key not in told:
        told.add(key)
        _log.info(msg)
