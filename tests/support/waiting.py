"""Polling that survives the moment it polls: a kubectl call that fails once (the API
server restarting, a watch cache catching up) is retried until the deadline, and the
timeout reports the last value *and* the last error."""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable


def wait_for(predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.5, what: str = "condition") -> Any:
    """Call ``predicate`` until it returns something truthy; return that. Exceptions
    raised by the predicate count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    error: BaseException | None = None
    while True:
        try:
            last = predicate()
            error = None
            if last:
                return last
        except Exception as err:  # noqa: BLE001 - transient by assumption until the deadline
            error = err
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout:.0f}s (last value: {last!r}; last error: {error!r})")
        time.sleep(interval)
