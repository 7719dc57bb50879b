"""torchrun, except that an agent that fails leaves the job's rendezvous open.

torchrun's ``launch_agent`` shuts the rendezvous handler down whenever its agent ends for
any reason but a signal, and for the c10d rendezvous that marks the run's state *closed*
for good: every agent that joins later, a survivor re-forming its group or a replacement
pod, fails at once with ``RendezvousClosedError``. One agent that dies of an exception (a
store read that times out on a loaded machine, a rendezvous error) would so turn every
later replacement into a crash until the job's restart budget is spent. The job's pods
are the operator's to end, so here the rendezvous is closed only as torchrun closes it
after its workers *succeeded* (then all ranks are done and a node still waiting should
stop); an agent that failed leaves it open, and the launcher's lease takes the agent out
of it at once (``rdzv_leases.py``).

The launcher runs this file by its path in place of ``python -m torch.distributed.run``,
with the same arguments. It imports only torch and the standard library, so it runs from a
bundle in a user's image too; should that torch lack what is patched here, torchrun runs
unpatched.
"""

from __future__ import annotations

import os
import sys

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    # Run by path, Python put this package's folder first: its modules (data.py, dist.py,
    # ...) must not shadow top-level ones for torch.
    sys.path.pop(0)


def keep_open_on_failure() -> bool:
    """Patch torch so that the rendezvous is closed only after a successful run; False
    (nothing patched) when this torch has not the classes relied on."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    except ImportError:
        return False
    run, shutdown = getattr(SimpleElasticAgent, "run", None), getattr(DynamicRendezvousHandler, "shutdown", None)
    if run is None or shutdown is None:
        return False
    succeeded = [False]

    def run_noting_success(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        succeeded[0] = not result.is_failed()
        return result

    def shutdown_after_success(self):
        if succeeded[0]:
            return shutdown(self)
        print("llmtrain torchrun agent: the agent failed; the rendezvous stays open for the job's other and "
              "replacement nodes", file=sys.stderr, flush=True)
        return False

    SimpleElasticAgent.run = run_noting_success
    DynamicRendezvousHandler.shutdown = shutdown_after_success
    return True


def main() -> None:
    keep_open_on_failure()
    from torch.distributed.run import main as torchrun  # noqa: PLC0415 - after the patch

    torchrun()


if __name__ == "__main__":
    main()
