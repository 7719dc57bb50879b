"""The hang watchdog: no step progress for ``hangTimeoutSeconds`` means a hang.

A stuck NCCL/gloo collective blocks the training thread in C++, where no Python
exception can reach it. A daemon thread watches a heartbeat; when it goes stale, the
watchdog dumps the stacks of every thread (faulthandler, so it works even while the GIL
holder is stuck in native code that released it), records the exit, and terminates the
process with the hang code. torchrun then sees a failed worker and the recovery starts.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import tempfile
import threading
import time
from typing import Callable

log = logging.getLogger("llmtrain.watchdog")


class Watchdog:
    def __init__(self, timeout_seconds: float, on_hang: Callable[[float], None], poll_seconds: float | None = None):
        self.timeout = timeout_seconds
        self.on_hang = on_hang
        self.poll = poll_seconds or min(1.0, timeout_seconds / 10)
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        """Record progress. Cheap enough to call every step (one monotonic read)."""
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            stale = time.monotonic() - self._last
            if stale > self.timeout:
                self.on_hang(stale)
                return


def dump_stacks_and_exit(code: int, stale: float, record: Callable[[], None]) -> None:
    """What the trainer does on a hang: stacks to stderr, an exit record, then _exit.

    ``os._exit`` because a normal exit would try to join the stuck thread and run
    atexit handlers that may themselves block on the dead collective.
    """
    # The ranks of a pod share its stderr and often hang together: each dump goes out in
    # one write, so that two ranks' stacks do not interleave line by line.
    with tempfile.TemporaryFile() as buffer:
        buffer.write(f"llmtrain: HANG: no step progress for {stale:.1f}s; stacks of all threads follow\n".encode())
        buffer.flush()
        faulthandler.dump_traceback(file=buffer, all_threads=True)
        buffer.seek(0)
        text = buffer.read()
    sys.stderr.flush()
    view = memoryview(text)
    while view:
        view = view[os.write(sys.stderr.fileno(), view):]
    try:
        record()
    finally:
        sys.stderr.flush()
        os._exit(code)
