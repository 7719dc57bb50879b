"""The launcher forwards a signal to torchrun while it waits for it, whichever of its
threads the kernel hands the signal to (``launcher.wait_for``). Python runs a handler only
in the main thread: blocked in one ``waitpid``, it would run the forward when torchrun has
ended. Here the main thread blocks SIGTERM, so that the kernel must give it to the other
thread, as it may in a launcher with a supervisor and servers running."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from llmtrain_trainer.launch.launcher import wait_for


def test_a_signal_another_thread_receives_is_forwarded_while_the_launcher_waits():
    child = subprocess.Popen(["sleep", "30"])
    forwarded: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(time.monotonic())
        child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    ready = threading.Event()
    # A thread that can take SIGTERM (created before the main thread blocks it: a new
    # thread inherits its creator's mask), and waits as a launcher's threads do.
    other = threading.Thread(target=lambda: ready.set() or time.sleep(3), daemon=True)
    other.start()
    ready.wait(5)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        sent = time.monotonic()
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        code = wait_for(child)
        ended = time.monotonic()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGTERM, previous)
        child.kill()
    assert code == -signal.SIGTERM, code  # torchrun (here `sleep`) got the signal and ended by it
    assert forwarded and forwarded[0] - sent < 2.5 and ended - sent < 3, (forwarded, ended - sent)
