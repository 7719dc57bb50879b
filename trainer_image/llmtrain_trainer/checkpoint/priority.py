"""The priority of the checkpoint threads: the lowest CPU priority there is (nice 19).

Persisting a checkpoint is background work, and on a CPU-bound node (CPU training, busy
data loaders) every cycle it takes is taken from training. At nice 19 the kernel runs
these threads mostly in the gaps training leaves, yet never starves them (CFS still
gives them a small share), so a checkpoint always completes; a checkpoint that falls due
before the previous one completed is deferred (counted), never queued. What a lower
priority cannot remove, the benchmark measures: on a virtual machine the hypervisor's
own I/O work is taken from the guest's CPUs (steal time), whatever the guest's
priorities (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("llmtrain.checkpoint")
NICE = 19


def lower_this_thread() -> None:
    """Set the calling thread's nice value (Linux: per thread) to the lowest priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (OSError, AttributeError) as err:  # not Linux, or not allowed: run at normal priority
        log.debug("checkpoint thread priority unchanged: %s", err)
