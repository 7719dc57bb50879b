"""The hang watchdog: no step progress for ``hangTimeoutSeconds`` means a hang (for an
attempt's first step, ``first_step_limit``: longer).

A stuck NCCL/gloo collective blocks the training thread in C++, where no Python
exception can reach it. A daemon thread watches a heartbeat; when it goes stale, the
watchdog dumps the stacks of every thread (faulthandler, so it works even while the GIL
holder is stuck in native code that released it), records the exit, and terminates the
process with the hang code. torchrun then sees a failed worker and the recovery starts.

A thread cannot see its own process frozen (SIGSTOP) or its interpreter held by native
code that never releases the GIL, so under the launcher the first detector is the
launcher's supervisor, which reads the rank's heartbeat file from outside
(``supervisor.py``). This watchdog then waits ``SUPERVISOR_GRACE_SECONDS`` longer and
only acts if the supervisor did not.

A rank the supervisor judged a victim may be asked for a rescue checkpoint instead of being
killed (``supervisor.py``): this thread sees the request in the heartbeat page and calls
``on_rescue``, which saves the last step and ends the process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from llmtrain_trainer.pod.heartbeat import Heartbeat, State

log = logging.getLogger("llmtrain.watchdog")


SUPERVISOR_GRACE_SECONDS = 3.0
"""How much later than the supervisor this in-process watchdog fires when supervised."""
FIRST_STEP_EXTRA_SECONDS = 60.0
"""The least extra time an attempt's first step gets (``first_step_limit``)."""


def first_step_limit(timeout_seconds: float) -> float:
    """The limit for an attempt's first step: ``hangTimeoutSeconds`` plus as much again,
    and at least a minute more. A first step carries one-off work that later steps do
    not: NCCL connects its communicators in the first collective, CUDA and the allocator
    warm up, a fresh process faults its pages in, and on a shared machine the pods that
    start beside it compete for the CPU. Measured on the test bed: 10 s of a 2-core
    machine under load for one first step, against a 10 s timeout."""
    return timeout_seconds + max(timeout_seconds, FIRST_STEP_EXTRA_SECONDS)


class Watchdog:
    def __init__(self, timeout_seconds: float, on_hang: Callable[[float], None], poll_seconds: float | None = None,
                 heartbeat: Heartbeat | None = None, supervised: bool = False, on_rescue: Callable[[], None] | None = None):
        self._grace = SUPERVISOR_GRACE_SECONDS if supervised else 0.0
        self._steady = timeout_seconds
        self._first_step_done = False
        self.timeout = first_step_limit(timeout_seconds) + self._grace
        self.on_hang = on_hang
        self.on_rescue = on_rescue
        # A rescue request is answered within a poll: the supervisor's victim is waiting.
        self.poll = poll_seconds or min(0.25, timeout_seconds / 10)
        self.heartbeat = heartbeat
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self.beat()
        if self.heartbeat is not None:
            self.heartbeat.set_state(State.STEPPING)  # armed: the supervisor watches from now on
        self._thread.start()
        return self

    def beat(self, step: int | None = None) -> None:
        """Record progress. Cheap enough to call every step (a monotonic read and a store
        into the shared heartbeat page)."""
        self._last = time.monotonic()
        heartbeat = self.heartbeat  # stop() may clear it from another thread
        if step is not None and not self._first_step_done:
            self._first_step_done = True
            self.timeout = self._steady + self._grace
            if heartbeat is not None:
                heartbeat.set_timeout(self._steady)
                heartbeat.mark_first_step()
        if heartbeat is not None:
            heartbeat.beat(step)

    def offer_rescue(self, budget_seconds: float) -> None:
        """Tell the supervisor this rank can save a rescue checkpoint (``heartbeat.py``)."""
        if self.heartbeat is not None:
            self.heartbeat.offer_rescue(budget_seconds)

    def enter(self, state: State) -> None:
        """Mark where the rank is from now on (no section to return from)."""
        if self.heartbeat is not None:
            self.heartbeat.set_state(state)

    def rescue_requested(self) -> bool:
        heartbeat = self.heartbeat
        return heartbeat is not None and heartbeat.rescue_requested()

    def section(self, state: State) -> AbstractContextManager[None]:
        """Mark where the rank is (a collective, the train step) for whoever reads its
        heartbeat."""
        return self.heartbeat.section(state) if self.heartbeat is not None else contextlib.nullcontext()

    @property
    def state(self) -> State:
        return self.heartbeat.state if self.heartbeat is not None else State.STEPPING

    def stop(self) -> None:
        self._stop.set()
        heartbeat, self.heartbeat = self.heartbeat, None
        if heartbeat is not None:
            heartbeat.close()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            heartbeat = self.heartbeat
            if self.on_rescue is not None and heartbeat is not None and heartbeat.rescue_requested():
                self.on_rescue()
                return
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
