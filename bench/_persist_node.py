"""One emulated node of bench/checkpoint.py's balanced persist: the trainer's own
propagator (``llmtrain_trainer.checkpoint.propagate``) storing this node's share of the
replicated state from tier 1 into S3; node 0 then commits. Run inside the node's network
namespace; prints "ready", waits for the go file, exits when done."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    args = json.loads(sys.argv[1])
    os.environ.update(args["env"])
    from llmtrain_store.s3 import S3Tier  # noqa: PLC0415
    from llmtrain_store.directory import DirTier  # noqa: PLC0415
    from llmtrain_trainer.checkpoint.propagate import Layout, Propagator, Saved  # noqa: PLC0415

    class Health:
        def ok(self, tier: str, step: int) -> None: ...

        def failed(self, tier: str, err: BaseException, retry_in: float | None = None) -> None:
            raise err

    local = DirTier("local", Path(args["local"]))
    newest = local.list()[0]
    tier = S3Tier("s3", args["uri"], endpoint=args["endpoint"])
    tier.list()  # connect before the clock starts
    node, nodes = args["node"], args["nodes"]
    layout = Layout(node, nodes, node, nodes, {"state.llmt"}, lambda name: None)
    propagator = Propagator(tier, layout, local, Health(), lambda *a: None, commit_timeout=3600, heartbeat=lambda: None)
    meta = {k: v for k, v in newest.manifest.items() if k not in ("files", "ranks", "format", "step", "hash")}
    saved = Saved(newest.step, {**meta, "world_size": nodes}, {"state.llmt": newest.manifest["files"]["state.llmt"]})
    print("ready", flush=True)
    go = Path(args["go"])
    while not go.exists():
        time.sleep(0.01)
    if not propagator._store(saved):
        raise SystemExit("the tier-1 step disappeared")


if __name__ == "__main__":
    main()
