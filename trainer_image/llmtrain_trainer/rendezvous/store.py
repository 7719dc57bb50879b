"""The per-job rendezvous store: ``python -m llmtrain_trainer.rendezvous.store --port 29400``.

A c10d TCPStore that lives in its own pod (or process), apart from every worker.
torchrun agents join it with ``--rdzv-backend c10d --rdzv-conf is_host=false``, so no
worker hosts the rendezvous and losing any worker, rank 0 included, is survivable.
(Kubeflow's PyTorchJob hosts it in worker 0: a single point of failure.)

Beside it, on the next port, it holds the launchers' rendezvous leases
(``leases.py``): a worker pod that dies leaves the rendezvous at once instead of
when its keep-alive lapses. With the job's token in its environment
(``LLMTRAIN_RDZV_TOKEN``) it accepts only signed states and signed lease lines.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading

from llmtrain_contract.names import RDZV_PORT, Env

from llmtrain_trainer.rendezvous import leases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmtrain_trainer.rendezvous.store")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=RDZV_PORT)
    parser.add_argument("--run-id", default=None, help="the only rendezvous whose leases are accepted (the job's)")
    args = parser.parse_args(argv)

    from torch.distributed import TCPStore  # noqa: PLC0415 - a bad flag fails before torch loads

    store = TCPStore(
        args.host, args.port, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(hours=24), use_libuv=True,
    )
    print(f"rendezvous store listening on {args.host}:{store.port}", flush=True)
    token = os.environ.get(Env.RDZV_TOKEN) or None
    print("rendezvous store: " + ("states and leases signed with the job's token" if token else
                                  "no job token: states and leases are not signed"), flush=True)
    lease_server = leases.serve(args.host, store.port, store, args.run_id, token)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    if lease_server is not None:
        lease_server.close()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
