"""Whether an exception says that a *peer* failed: a collective or the process group broke
because another rank died, froze or timed out, not because of this rank's own error.

Such a rank is a *victim* (exit ``COLLECTIVE_TIMEOUT``): the failure is charged where it
happened, never to every survivor. Used by the built-in trainer and by the script runner
for a user's script, so both classify the same exceptions alike.
"""

from __future__ import annotations

import sys

PEER_FAILURE_TEXT = ("timed out", "timeout", "connection closed by peer", "connection reset", "gloo")
"""What torch's RuntimeErrors from gloo and the c10d store say when a peer went away."""


def is_collective_failure(err: BaseException) -> bool:
    """torch is not imported here: an exception from torch.distributed means the process
    already imported it, and a process that did not cannot have one."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(s in text for s in PEER_FAILURE_TEXT)
