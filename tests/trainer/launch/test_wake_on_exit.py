"""The agent's sleep between two monitor passes ends when one of its processes exits
(``torchrun_agent.wake_on_worker_exit``): a rank's failure is seen at once, not up to
``--monitor-interval`` later; without an exit it sleeps the whole interval; and children
exiting by the thousand while the main thread sleeps and wakes never wedge it (a handler
that set a ``threading.Event`` deadlocked there, found in review)."""

from __future__ import annotations

import os
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


STRESS = """
import subprocess, threading, time
from llmtrain_trainer.launch import torchrun_agent
from torch.distributed.elastic.agent.server import api

assert torchrun_agent.wake_on_worker_exit()
stop = time.monotonic() + 3
exited = [0]

def spawn():
    while time.monotonic() < stop:
        children = [subprocess.Popen(["true"]) for _ in range(8)]
        exited[0] += sum(1 for child in children if child.wait() == 0)

threading.Thread(target=spawn, daemon=True).start()
sleeps = 0
while time.monotonic() < stop:
    api.time.sleep(0.001)
    sleeps += 1
print("slept", sleeps, "children", exited[0])
"""


def test_children_exiting_in_a_stream_never_wedge_the_sleeping_main_thread():
    done = subprocess.run([sys.executable, "-c", STRESS], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    slept, children = (int(x) for x in done.stdout.split()[1::2])
    assert slept > 100 and children > 100, done.stdout


def test_an_agent_module_without_time_is_left_unpatched(monkeypatch):
    monkeypatch.setattr(api, "time", object())
    assert not torchrun_agent.wake_on_worker_exit()
