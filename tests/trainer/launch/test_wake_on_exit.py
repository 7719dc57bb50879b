"""The agent's sleep between two monitor passes ends when one of its processes exits
(``torchrun_agent.wake_on_worker_exit``): a rank's failure is seen at once, not up to
``--monitor-interval`` later; without an exit it sleeps the whole interval."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from llmtrain_trainer.launch import torchrun_agent
from torch.distributed.elastic.agent.server import api


def test_a_child_s_exit_ends_the_agent_s_sleep(monkeypatch):
    monkeypatch.setattr(api, "time", time)
    previous = signal.getsignal(signal.SIGCHLD)
    try:
        assert torchrun_agent.wake_on_worker_exit()
        assert api.time.monotonic() > 0 and api.time.time() > 0  # the rest of ``time`` as it was
        began = time.monotonic()
        api.time.sleep(0.3)  # no child exits: the whole interval
        assert time.monotonic() - began >= 0.3
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
        began = time.monotonic()
        api.time.sleep(10)
        woke = time.monotonic() - began
        assert child.wait(5) == 0 and woke < 3, woke  # woken by its exit (0.2 s and Python's start)
        began = time.monotonic()
        api.time.sleep(0.3)  # the wake was used: the next sleep is whole again
        assert time.monotonic() - began >= 0.3
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_an_agent_module_without_time_is_left_unpatched(monkeypatch):
    monkeypatch.setattr(api, "time", object())
    assert not torchrun_agent.wake_on_worker_exit()
