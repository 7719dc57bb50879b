"""Detection and recovery times on the local cluster, against the targets in docs/design.md.

The operator is installed with helm; each round runs one job per failure kind and injects
it mid-training:

- crash: every process of a worker pod is SIGKILLed (target: detected <= 2 s, first new
  training step <= 15 s after the kill);
- node loss: a node's heartbeats stop and its processes die (target: detected <= grace +
  5 s after the node is marked NotReady; first new step <= 60 s after the loss);
- hang: a rank blocks forever at a given step, as in a stuck collective (target: detected
  <= hangTimeoutSeconds + 5 s after the hang starts).

"First new step" is timed by the trainers themselves (``last_step_timestamp_seconds``,
scraped from the pods), so it includes everything: detection, rescheduling, start-up,
rendezvous, restore. Each time is also printed as a ratio to its target (< 1 is good).

    python bench/recovery.py [--quick] [--rounds N]
    RESULT crash_detect_s=... crash_recovery_s=... node_detect_s=... node_recovery_s=... hang_detect_s=... worst_target_ratio=...
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "hack"), str(ROOT / "tests"), str(ROOT / "operator")]
from _common import parser, result  # noqa: E402

GRACE = 10
HANG_TIMEOUT = 20


def newest_step_time(bed, ns: str, name: str, pods_fn) -> float:
    from llmtrain_operator.probe import scrape  # noqa: PLC0415

    times = []
    for pod in pods_fn(bed, ns, name):
        ip = (pod.get("status") or {}).get("podIP")
        if ip:
            probe = scrape(f"http://{ip}:9400/metrics", timeout=1.0)
            if probe and probe.last_step_time:
                times.append(probe.last_step_time)
    return max(times, default=0.0)


def wait_first_step_after(bed, ns, name, pods_fn, since: float, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newest = newest_step_time(bed, ns, name, pods_fn)
        if newest > since:
            return newest - since
        time.sleep(0.25)
    raise TimeoutError(f"{ns}/{name}: no training step within {timeout}s after the failure")


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="rounds per failure kind (default 3, quick 1)")
    args = p.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)

    from e2e.jobs import PVC, create, job_manifest, pods, wait_status  # noqa: PLC0415
    from localcluster.cluster import LocalCluster  # noqa: PLC0415

    bed = LocalCluster.default().up()
    samples: dict[str, list[float]] = {k: [] for k in ("crash_detect", "crash_recovery", "node_detect", "node_recovery", "hang_detect")}
    try:
        bed.helm("upgrade", "--install", "llmtrain", str(ROOT / "charts" / "llmtrain-operator"), "--namespace", "llmtrain-system",
                 "--create-namespace", "--wait", "--timeout", "180s", "--set", "replicaCount=1", "--set", "operator.resyncSeconds=5",
                 "--set", "nodeSelector.llmtrain\\.io/pool=system")
        for r in range(rounds):
            ns = f"recovery-{r}"
            bed.kubectl("create", "namespace", ns)
            bed.kubectl("apply", "-n", ns, "-f", "-", input=PVC)
            common = {"spec.trainer.builtin.maxSteps": 100000, "spec.checkpoint.intervalSteps": 10,
                      "spec.checkpoint.shared": {"claimName": "ckpt-shared"},
                      "spec.faultTolerance.nodeFailureGraceSeconds": GRACE, "spec.faultTolerance.maxRestarts": 20}

            # crash
            create(bed, ns, job_manifest("crash", common))
            wait_status(bed, ns, "crash", lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 15, 300, "crash job running")
            killed = time.time()
            bed.kill_pod(ns, "crash-worker-1")
            st = wait_status(bed, ns, "crash", lambda s: s.get("restarts", 0) >= 1, 60, "crash detected")
            samples["crash_detect"].append(st["lastFailure"]["detectSeconds"])
            samples["crash_recovery"].append(wait_first_step_after(bed, ns, "crash", pods, killed))
            bed.kubectl("delete", "ltj", "crash", "-n", ns, "--wait=false")

            # node loss
            create(bed, ns, job_manifest("node", common))
            wait_status(bed, ns, "node", lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 15, 300, "node job running")
            store_node = pods(bed, ns, "node", role="rendezvous")[0]["spec"]["nodeName"]
            victim = next(p["spec"]["nodeName"] for p in pods(bed, ns, "node") if p["spec"].get("nodeName") not in (None, store_node))
            lost = time.time()
            bed.fail_node(victim)
            samples["node_recovery"].append(wait_first_step_after(bed, ns, "node", pods, lost))
            st = wait_status(bed, ns, "node", lambda s: s.get("restartsByReason", {}).get("NodeFailure", 0) >= 1, 180, "node loss detected")
            samples["node_detect"].append(st["lastFailure"]["detectSeconds"])
            bed.heal_node(victim)
            bed.kubectl("delete", "ltj", "node", "-n", ns, "--wait=false")
            bed.wait_nodes_ready(120)

            # hang (rank 1 blocks at step 30, as in a stuck collective)
            hang = dict(common, **{"spec.faultTolerance.hangTimeoutSeconds": HANG_TIMEOUT, "spec.faultTolerance.progressTimeoutSeconds": 600,
                                   "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": "hang@step=30,rank=1"}]})
            create(bed, ns, job_manifest("hang", hang))
            st = wait_status(bed, ns, "hang", lambda s: s.get("restartsByReason", {}).get("Hang", 0) >= 1, 400, "hang detected")
            # torchrun restarts the hung group in place; the pod's run volume still holds
            # when the hang started (fault marker) and when the watchdog exited (record).
            # Rank 1 runs in whichever pod torchrun gave group rank 1.
            runs = [bed.state / "pods" / p["metadata"]["uid"] / "volumes" / "run" for p in pods(bed, ns, "hang")]
            run = next(r for r in runs if (r / "faults" / "fault-0-rank-1.fired").exists())
            fired = float((run / "faults" / "fault-0-rank-1.fired").read_text())
            record = json.loads((run / "exit" / "attempt-0" / "local-0.json").read_text())
            assert record["code"] == 80, record
            samples["hang_detect"].append(record["time"] - fired)
            bed.kubectl("delete", "ltj", "hang", "-n", ns, "--wait=false")
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in samples.items()), flush=True)
    finally:
        bed.down()
    med = {k: statistics.median(v) for k, v in samples.items()}
    targets = {"crash_detect": 2.0, "crash_recovery": 15.0, "node_detect": GRACE + 5.0, "node_recovery": 60.0,
               "hang_detect": HANG_TIMEOUT + 5.0}
    for key, target in targets.items():
        print(f"{key:<15} median {med[key]:7.2f}s  target {target:5.1f}s  ratio {med[key] / target:.2f}")
    result(**{f"{k}_s": round(v, 2) for k, v in med.items()}, worst_target_ratio=round(max(med[k] / targets[k] for k in targets), 3),
           rounds=rounds)


if __name__ == "__main__":
    main()
