"""Node loss with and without the prefetch at pod start: the time from killing a node to
the job's first new step, measured from outside.

A real two-node job (``tests/support/elastic.py``: launcher -> torchrun -> trainer per
node, the ``small`` preset, about 200 MB of state) checkpoints every 20 steps into tier 1
and into S3 (MinIO on this machine behind ``_links.PacedProxy``: each connection paced
like S3's). Each round waits until S3 holds the newest checkpoint (the step node 0 holds
in tier 1), then SIGKILLs node 1's whole process tree (``--whole-job``: every node's, the
job moved to new nodes), wipes its tier 1 (a replacement node's empty disk) and starts
its launcher again at once. Timed by this script's clock from the kill to the first step
of the new attempt appearing in rank 0's step log (with ``--whole-job``: the first step
line in a restarted node's output), polled every 20 ms. Rounds alternate between the
prefetch on (the default) and off (``LLMTRAIN_PREFETCH=0``); each round also says, from
the nodes' output, whether the restore read tier 1, pulled on demand or broadcast.

    python bench/prefetch.py [--quick] [--rounds N] [--rate MBPS] [--whole-job]

The last line is ``RESULT prefetch_speedup=<off median / on median> ...``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "hack"), str(ROOT / "tests"), str(ROOT / "operator"), str(ROOT / "trainer_image"),
                str(ROOT / "common")]
from _common import parser, result  # noqa: E402


def say(text: str) -> None:
    print(text, flush=True)


def attempt_of(job) -> int:
    try:
        steps = job.steps()
    except ValueError:  # a step line being written: not yet
        return -1
    return max((r.get("attempt", 0) for r in steps), default=-1)


def newest_s3_step(server) -> int:
    """The newest step whose COMMITTED is in the bucket (one listing; no manifest read)."""
    keys = server.keys("bench", "job/step-")
    return max((int(k.split("/")[1][5:]) for k in keys if k.endswith("/COMMITTED")), default=0)


def newest_local_step(job, node: int) -> int:
    steps = [int(p.name[5:]) for p in (job.node_dir(node) / "ckpt").glob("step-*") if (p / "COMMITTED").exists()]
    return max(steps, default=0)


def one_round(job, server, prefetching: bool, whole: bool, timeout: float = 300) -> dict[str, object]:
    """Once S3 holds the newest checkpoint (a newer one than the last round's, the same
    step node 0 holds in tier 1), kill node 1 (``whole``: every node) and start it again
    with an empty tier 1; the seconds to the first step of the new attempt, and where
    node 1 read its state from."""
    from support.waiting import wait_for  # noqa: PLC0415

    floor = newest_s3_step(server)
    wait_for(lambda: floor < newest_s3_step(server) == newest_local_step(job, 0), timeout=timeout, interval=0.05,
             what="S3 holding the newest checkpoint")
    before = attempt_of(job)
    lost = list(range(len(job.running))) if whole else [1]
    marks = {n.index: n.log.stat().st_size for n in job.running}
    for n in lost:
        job.node_env[n] = {} if prefetching else {"LLMTRAIN_PREFETCH": "0"}
    killed = time.perf_counter()
    for n in lost:
        job.kill_node(n)
        shutil.rmtree(job.node_dir(n) / "ckpt", ignore_errors=True)
    for n in lost:
        job.replace_node(n)
    while attempt_of(job) <= before if not whole else not new_steps(job, {n: marks[n] for n in lost}):
        if time.perf_counter() - killed > timeout:
            raise RuntimeError(f"no new step {timeout:.0f}s after the kill:\n{job.logs(tail=4000)}")
        time.sleep(0.02)
    seconds = time.perf_counter() - killed
    time.sleep(1)  # the lines logged with the first step
    log = ""
    for node, mark in marks.items():
        with open(job.running[node].log, errors="replace") as fh:
            fh.seek(mark)
            log += fh.read()
    pulled = "pulled step" in log
    return {"prefetch": prefetching, "seconds": seconds, "prefetched": "llmtrain launcher: prefetched step" in log,
            # The agreement chose tier 1's copy, or a rank found the prefetched one there.
            "read_from_tier1": not pulled and ("(local tier" in log or "was prefetched into tier 1" in log),
            "pulled_on_demand": pulled, "broadcast": "broadcast from rank" in log}


def new_steps(job, marks: dict[int, int]) -> bool:
    """A step line in a restarted node's log (every node restarted: the step log's
    attempt numbers start over)."""
    for node, mark in marks.items():
        with open(job.running[node].log, errors="replace") as fh:
            fh.seek(mark)
            if "\nstep " in fh.read():
                return True
    return False


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="rounds per mode (default 4, quick 2)")
    p.add_argument("--rate", type=float, default=25.0, help="MB/s per S3 connection (PacedProxy)")
    p.add_argument("--dir", default="/var/tmp", help="where the job's folders go")
    p.add_argument("--whole-job", action="store_true", help="lose every node at once (the job moved to new nodes)")
    args = p.parse_args()
    rounds = args.rounds or (2 if args.quick else 4)

    from _links import PacedProxy  # noqa: PLC0415
    from s3server import MinioServer  # noqa: PLC0415
    from support.elastic import ElasticJob, base_config  # noqa: PLC0415

    root = Path(tempfile.mkdtemp(prefix="llmtrain-bench-prefetch-", dir=args.dir))
    rows: list[dict[str, object]] = []
    try:
        with MinioServer(root / "s3") as server:
            server.make_bucket("bench")
            os.environ.update(server.env())  # this script lists the tier too
            proxy = PacedProxy("127.0.0.1", server.port, args.rate * 1e6).start()
            endpoint = f"http://127.0.0.1:{proxy.port}"
            cfg = base_config(maxSteps=10**6, model={"preset": "small"}, data={"seqLen": 32, "vocabSize": 256},
                              checkpoint={"intervalSteps": 20},
                              faultTolerance={"hangTimeoutSeconds": 120, "collectiveTimeoutSeconds": 60})
            s3 = {"name": "s3", "uri": "s3://bench/job", "endpoint": endpoint, "keep": 2}
            job = ElasticJob(root / "job", cfg, nodes=2, max_restarts=100, extra_tiers=[s3], env=server.env()).start()
            try:
                for index in range(2 * rounds):
                    row = one_round(job, server, prefetching=index % 2 == 0, whole=args.whole_job)
                    rows.append(row)
                    say(f"  round {index + 1}: prefetch {'on ' if row['prefetch'] else 'off'} {row['seconds']:.2f}s "
                        f"(read from tier 1: {row['read_from_tier1']}, prefetched: {row['prefetched']}, "
                        f"pulled on demand: {row['pulled_on_demand']}, broadcast: {row['broadcast']})")
            finally:
                job.kill()
                proxy.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    on = [r["seconds"] for r in rows if r["prefetch"]]
    off = [r["seconds"] for r in rows if not r["prefetch"]]
    say("JSON " + json.dumps({"rate_mb_s": args.rate, "whole_job": args.whole_job, "rounds": rows}))
    result(prefetch_speedup=round(statistics.median(off) / statistics.median(on), 2),
           first_step_on_median_s=round(statistics.median(on), 2), first_step_on_worst_s=round(max(on), 2),
           first_step_off_median_s=round(statistics.median(off), 2), first_step_off_worst_s=round(max(off), 2),
           prefetched_rounds=sum(1 for r in rows if r["prefetch"] and r["read_from_tier1"]), rounds_per_mode=rounds)


if __name__ == "__main__":
    main()
