"""``python -m localcluster up|down|status`` (run with PYTHONPATH=hack; see Makefile)."""

from __future__ import annotations

import argparse
import json
import sys

from .cluster import LocalCluster


def main() -> int:
    parser = argparse.ArgumentParser(prog="localcluster")
    parser.add_argument("command", choices=["up", "down", "status"])
    args = parser.parse_args()
    bed = LocalCluster.default()
    if args.command == "up":
        bed.up()
        print(f"local cluster up in {bed.timings['start_seconds']:.1f}s (tools {bed.timings['tools_seconds']:.1f}s)")
        print(f"export KUBECONFIG={bed.kubeconfig}")
        print(f"export PATH={bed.bin}:$PATH")
    elif args.command == "down":
        bed.down()
        print("local cluster stopped")
    else:
        bed.bin = bed.bin or __import__("localcluster.cluster", fromlist=["build_tools"]).build_tools()
        print(json.dumps(bed._control("GET", "/healthz"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
