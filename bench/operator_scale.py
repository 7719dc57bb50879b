"""Operator scale: N LLMTrainJobs reconciled by the real operator (kopf) against the real
API server of the local cluster. ``reconcile_p50_s``/``reconcile_p99_s`` cover every pass
of the run (the ramp-up that creates all children included); ``steady_p99_s`` only the
passes after every job was reconciled.

The bed runs without nodes, so pods stay Pending and the measurement is the operator's
own work: every job gets its services, config, rendezvous store and worker pods created
and its status written, then keeps being re-planned every resync. Pass durations come
from the operator's ``llmtrain_operator_reconcile_duration_seconds`` histogram (log
buckets, x1.5 apart, interpolated), memory from /proc. ``queue_p99_s`` is the wait of a
due pass for one of the operator's reconcile slots (controller-runtime reports the same
split: reconcile time apart from work-queue wait).

    python bench/operator_scale.py [--quick] [--jobs N]
    RESULT jobs=500 reconcile_p50_s=... reconcile_p99_s=... queue_p99_s=... rss_mb=... all_created_s=...
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "hack"), str(ROOT / "tests")]
from _common import parser, result  # noqa: E402

NS = "scale"
METRICS_PORT = 18080


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus-style quantile from cumulative (le, count) buckets."""
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            span = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / span if span else 0)
        prev_le, prev_count = le, count
    return prev_le


def histogram(name: str = "llmtrain_operator_reconcile_duration_seconds") -> list[tuple[float, float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return sorted(out)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=None, help="number of jobs (default 500, quick 50)")
    p.add_argument("--steady-seconds", type=float, default=None, help="steady-state window after creation (default 60, quick 20)")
    args = p.parse_args()
    jobs = args.jobs or (50 if args.quick else 500)
    steady = args.steady_seconds or (20 if args.quick else 60)

    from localcluster.cluster import LocalCluster  # noqa: PLC0415
    from support.specs import load_job  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    bed = LocalCluster.default()
    bed.nodes = []  # no nodes: pods stay Pending; the operator's work is what is measured
    bed.up()
    operator = None
    try:
        bed.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "llmtrain.io_llmtrainjobs.yaml"))
        bed.kubectl("create", "namespace", NS)
        env = {**bed.env(), "LLMTRAIN_OPERATOR_LEADER_ELECTION": "false", "LLMTRAIN_OPERATOR_PROBES": "false",
               "LLMTRAIN_OPERATOR_METRICS_PORT": str(METRICS_PORT), "LLMTRAIN_OPERATOR_RESYNC_SECONDS": "10"}
        log = (bed.state / "logs" / "scale-operator.log").open("w")
        operator = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces", "-m", "llmtrain_operator.handlers"],
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(5)
        base = load_job()
        docs = []
        for i in range(jobs):
            doc = json.loads(json.dumps(base))
            doc["metadata"] = {"name": f"job-{i:04d}", "namespace": NS}
            docs.append(doc)
        started = time.monotonic()
        bed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), timeout=600)
        print(f"applied {jobs} jobs in {time.monotonic() - started:.1f}s", flush=True)
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            items = json.loads(bed.kubectl("get", "ltj", "-n", NS, "-o", "json", timeout=300).stdout)["items"]
            created = sum(1 for i in items if (i.get("status") or {}).get("phase") == "Created")
            if created == jobs:
                break
            print(f"  {created}/{jobs} jobs reconciled", flush=True)
            time.sleep(5)
        all_created = time.monotonic() - started
        pods = len(json.loads(bed.kubectl("get", "pods", "-n", NS, "-o", "json", timeout=300).stdout)["items"])
        print(f"all {jobs} jobs Created after {all_created:.1f}s ({pods} pods); steady state for {steady:.0f}s", flush=True)
        ramp = histogram()
        time.sleep(steady)
        final = histogram()
        queue = histogram("llmtrain_operator_reconcile_queue_seconds")
        steady_buckets = [(le, count - before) for (le, count), (_, before) in zip(final, ramp)]
        print(f"ramp-up (creating every job's children): {int(ramp[-1][1])} passes, "
              f"p50 {quantile(ramp, 0.5):.4f}s p99 {quantile(ramp, 0.99):.4f}s", flush=True)
        result(jobs=jobs, reconcile_p50_s=round(quantile(final, 0.5), 4), reconcile_p99_s=round(quantile(final, 0.99), 4),
               steady_p99_s=round(quantile(steady_buckets, 0.99), 4), queue_p99_s=round(quantile(queue, 0.99), 4), rss_mb=round(rss_mb(operator.pid), 1),
               all_created_s=round(all_created, 1), passes=int(final[-1][1]), pods=pods)
    finally:
        if operator is not None:
            operator.terminate()
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
        bed.down()


if __name__ == "__main__":
    main()
