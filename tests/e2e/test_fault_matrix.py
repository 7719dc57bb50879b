"""The end-to-end fault matrix: scenarios no other end-to-end module covers (the list of
all 15 and where each is tested: docs/development.md, "The fault matrix").

Each job trains example 01 paced at 0.4 s a step, so a fault lands mid-run, and each
scenario checks, once the job ended: its phase and final step, the terminal condition,
the restarts per reason in the status and as the real Prometheus scraped them, its
Events, the restores its trainers logged (tier and steps lost) and how many worker pods
were alive at once (matrix.py).

The time bounds are sanity bounds, not targets (bench/recovery.py measures those)."""

from __future__ import annotations

import json
import time

import pytest
from support.waiting import wait_for

from .conftest import OPERATOR_NS
from .jobs import GANG, PVC, create, job_manifest, pods, rank_holder, status, wait_status
from .matrix import Churn, check_outcome, condition, restores

pytestmark = pytest.mark.e2e

STEPS, INTERVAL = 40, 5
PACE = f"slow@step=1,seconds=0.4,steps={STEPS}"


def paced(name: str, faults: str = "", changes: dict | None = None) -> dict:
    return job_manifest(name, {"spec.trainer.builtin.maxSteps": STEPS, "spec.checkpoint.intervalSteps": INTERVAL,
                               "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": ";".join(f for f in (PACE, faults) if f)}],
                               **(changes or {})})


def finished(bed, ns: str, name: str, timeout: float = 600) -> dict:
    return wait_status(bed, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), timeout, "finished")


def jobs_metric(prometheus, counter: str, ns: str, at_least: float) -> float:
    return prometheus.wait_value(f'sum(llmtrain_operator_jobs_{counter}_total{{namespace="{ns}"}})', lambda v: v >= at_least, 60)


# ---------------------------------------------------------------- 12. the restart budget exhausted


def test_12_an_exhausted_restart_budget_fails_the_job_once_and_starts_nothing_after(operator, prometheus):
    bed, ns, name = operator, "e2e-m-budget", "budget"
    crashes = ";".join(f"crash@step={s},rank=1" for s in (4, 8, 12))
    create(bed, ns, paced(name, crashes, {**GANG, "spec.faultTolerance.maxRestarts": 2,
                                          "spec.faultTolerance.backoff": {"initialSeconds": 1, "maxSeconds": 2}}))
    with Churn(bed, ns, name) as churn:
        done = finished(bed, ns, name)
        ended, ended_at = set(churn.uids), time.monotonic()
        check_outcome(bed, ns, name, done, phase="Failed", step=None, by_reason={"RestartedInPlace": 3},
                      reasons={"RestartedInPlace"})
        failed = condition(done, "Failed")
        assert failed["reason"] == "BackoffLimitExceeded" and "maxRestarts=2" in failed["message"], failed
        assert jobs_metric(prometheus, "failed", ns, 1) == 1
        # 15 s in all since the end, the checks above included: a storm would create pods after it.
        time.sleep(max(0.0, 15 - (time.monotonic() - ended_at)))
    assert churn.uids == ended, "pods were created after the job failed"
    assert churn.most_alive <= 2
    assert not [p for p in pods(bed, ns, name) if p["status"].get("phase") in ("Pending", "Running")
                and not p["metadata"].get("deletionTimestamp")], "a worker still runs after the job failed"


# ---------------------------------------------------------------- 11. the API server restarted


def test_11_an_api_server_restart_costs_the_job_nothing(operator, prometheus):
    bed, ns, name = operator, "e2e-m-apiserver", "apiserver"
    create(bed, ns, paced(name))
    wait_status(bed, ns, name, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 8, 300, "running past step 8")
    workers = {p["metadata"]["uid"] for p in pods(bed, ns, name)}
    began = time.time()
    took = bed.restart_apiserver()
    assert took < 60, took
    with Churn(bed, ns, name) as churn:
        done = finished(bed, ns, name)
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={}, reasons={"Completed"})
    assert churn.uids <= workers, "a worker pod was replaced although nothing failed"
    assert restores(bed, ns, name, since=began) == [], "a trainer restored although nothing failed"
    assert jobs_metric(prometheus, "successful", ns, 1) == 1


# ---------------------------------------------------------------- 3. the pod hosting rank 0 deleted


def test_03_the_pod_hosting_rank_0_deleted_saves_its_step_and_is_replaced(operator, prometheus):
    bed, ns, name = operator, "e2e-m-rank0", "rank0"
    create(bed, ns, paced(name))
    wait_status(bed, ns, name, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 12, 300, "running past step 12")
    holder, _ = wait_for(lambda: rank_holder(bed, ns, name, 0), 60, 0.5, "rank 0's heartbeat")
    at, began = status(bed, ns, name).get("step", 0), time.time()
    bed.kubectl("delete", "pod", holder["metadata"]["name"], "-n", ns, "--wait=false")
    with Churn(bed, ns, name) as churn:
        done = finished(bed, ns, name)
    # A pod deleted by a user is not a failure of the job: nothing is charged. (Rank 1's
    # group failed with it: a victim, restarted in place, never charged either.)
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={}, reasons={"Completed"})
    resumed = restores(bed, ns, name, since=began)
    assert resumed, "nobody restored after rank 0's pod was deleted"
    # SIGTERM gave rank 0 its emergency checkpoint: at most the step in flight is lost.
    assert min(r.step for r in resumed) >= at - 1, (at, resumed)
    assert churn.most_alive <= 2


# ---------------------------------------------------------------- 4. the rendezvous store killed


def test_04_a_killed_rendezvous_store_restarts_and_the_workers_resume_from_their_sigterm_checkpoint(operator, prometheus):
    """The store's processes SIGKILLed: its container restarts in place (restartPolicy
    Always) with an empty store. Both torchrun agents lose the rendezvous
    (RendezvousConnectionError), SIGTERM their ranks, which save the step in flight, and
    end their pods with the preemption code: an infrastructure disruption, never charged.
    The replacement pods start with an empty node-local tier, so the job has a shared one:
    they resume from it, at most one interval back."""
    bed, ns, name = operator, "e2e-m-store", "store"
    bed.kubectl("create", "namespace", ns, check=False)
    bed.kubectl("apply", "-n", ns, "-f", "-", input=PVC)
    create(bed, ns, paced(name, changes={"spec.checkpoint.shared": {"claimName": "ckpt-shared", "intervalSteps": INTERVAL}}))
    wait_status(bed, ns, name, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 12, 300, "running past step 12")
    store = pods(bed, ns, name, role="rendezvous")[0]
    at, began = status(bed, ns, name).get("step", 0), time.time()

    def restarted() -> bool:
        # Seen while the job runs: a finished job deletes its store pod.
        now = [p for p in pods(bed, ns, name, role="rendezvous") if not p["metadata"].get("deletionTimestamp")]
        return bool(now) and (now[0]["metadata"]["uid"] != store["metadata"]["uid"]
                              or any(c.get("restartCount", 0) >= 1 for c in now[0]["status"].get("containerStatuses", [])))

    bed.kill_pod(ns, store["metadata"]["name"])
    with Churn(bed, ns, name) as churn:
        wait_for(restarted, 120, 0.5, "the store restarted or replaced")
        done = finished(bed, ns, name)
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={}, reasons={"PodDisrupted", "Completed"})
    assert done.get("disruptions", 0) == 2, done.get("disruptions")
    resumed = restores(bed, ns, name, since=began)
    assert resumed and min(r.step for r in resumed) >= at - INTERVAL, (at, resumed)
    assert churn.most_alive <= 2


# ---------------------------------------------------------------- 10. the operator restarted during a node-loss recovery


def test_10_an_operator_restarted_during_a_node_loss_recovers_it_exactly_once(operator, prometheus):
    bed, ns, name = operator, "e2e-m-operator", "opnode"
    grace = 8
    create(bed, ns, paced(name, changes={"spec.faultTolerance.nodeFailureGraceSeconds": grace}))
    wait_status(bed, ns, name, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 8, 300, "running past step 8")
    store_node = pods(bed, ns, name, role="rendezvous")[0]["spec"]["nodeName"]
    victim = next(p for p in pods(bed, ns, name) if p["spec"].get("nodeName") not in (None, store_node))
    node = victim["spec"]["nodeName"]
    with Churn(bed, ns, name) as churn:
        bed.fail_node(node)
        # The node goes NotReady after the node controller's grace; the operator acts
        # `grace` seconds later. Kill the leading operator in between.
        wait_for(lambda: _not_ready(bed, node), 60, 0.5, f"{node} NotReady")
        leader = bed.kubectl("get", "lease", "llmtrain-operator", "-n", OPERATOR_NS,
                             "-o", "jsonpath={.spec.holderIdentity}").stdout.strip().rsplit("_", 1)[0]
        bed.kill_pod(OPERATOR_NS, leader)
        lost = wait_status(bed, ns, name, lambda s: s.get("restartsByReason", {}).get("NodeFailure", 0) >= 1, 240,
                           "the node loss handled by the successor")
        done = finished(bed, ns, name)
    # Leave two replicas for the next tests: the killed one replaced by a fresh pod, which
    # starts while the node heals.
    bed.kubectl("delete", "pod", leader, "-n", OPERATOR_NS, "--wait=false", check=False)
    bed.heal_node(node)
    bed.wait_nodes_ready(180)
    assert lost["lastFailure"]["node"] == node
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={"NodeFailure": 1},
                  reasons={"NodeFailure", "Completed"})
    assert churn.most_alive <= 2, "more live worker pods than replicas.max"
    wait_for(lambda: len(_ready_operators(bed)) >= 2, 240, 1, "two operator replicas ready again")


def _ready_operators(bed) -> list[str]:
    out = bed.kubectl("get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=llmtrain-operator", "-o", "json")
    return [p["metadata"]["name"] for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]


def _not_ready(bed, node: str) -> bool:
    out = bed.kubectl("get", "node", node, "-o", "json", check=False)
    if out.returncode != 0:
        return False
    conds = {c["type"]: c["status"] for c in json.loads(out.stdout)["status"].get("conditions", [])}
    return conds.get("Ready") != "True"


# ---------------------------------------------------------------- 1. one rank SIGKILLed


def test_01_one_rank_sigkilled_restarts_in_place_from_its_node_local_checkpoint(operator, prometheus):
    bed, ns, name = operator, "e2e-m-rank", "rank"
    create(bed, ns, paced(name, "crash@step=17,rank=1", GANG))
    with Churn(bed, ns, name) as churn:
        # Both workers training (a gang: the crash needs a rank 1 at step 17).
        wait_status(bed, ns, name, lambda s: s.get("worldSize") == 2, 300, "two workers training")
        began = time.time()
        done = finished(bed, ns, name)
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={"RestartedInPlace": 1},
                  reasons={"RestartedInPlace", "Completed"})
    resumed = restores(bed, ns, name, since=began)
    assert resumed and {r.tier for r in resumed} == {"local"}, resumed
    assert all(17 - INTERVAL <= r.step < 17 for r in resumed), resumed  # lost at most one interval
    assert len(churn.uids) == 2, "torchrun restarted the rank in place; no pod was replaced"
    assert jobs_metric(prometheus, "restarted", ns, 1) >= 1


# ---------------------------------------------------------------- 8. the newest checkpoint corrupted


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_08_a_corrupted_newest_checkpoint_is_skipped_with_the_reason_and_the_previous_one_used(operator, prometheus):
    bed, ns, name = operator, "e2e-m-corrupt", "corrupt"
    # Step 14 pauses every rank until the test says go (60 s at most): the newest checkpoint
    # is step 10 meanwhile, and the crash fires as the pause ends, in step 14, before step
    # 15's checkpoint. Every rank crashes: a survivor would save the step it holds (a
    # rescue checkpoint), newer than both.
    create(bed, ns, paced(name, "slow@step=14,seconds=60,until=go;crash@trigger=go"))
    wait_status(bed, ns, name, lambda s: s.get("step", 0) >= 13, 300, "at the paused step 14")
    workers = pods(bed, ns, name)
    tier1 = [bed.state / "pods" / p["metadata"]["uid"] / "volumes" / "ckpt-local" for p in workers]
    newest = wait_for(lambda: all(list(t.glob("**/step-00000010/COMMITTED")) for t in tier1) and
                      [next(t.glob("**/step-00000010/COMMITTED")).parent for t in tier1], 30, 0.5, "step 10 committed on both nodes")
    for folder in newest:
        _flip_a_byte(folder / "state.llmt")
    began = time.time()
    for pod in workers:
        (bed.state / "pods" / pod["metadata"]["uid"] / "volumes" / "run" / "go").write_text("")
    done = finished(bed, ns, name)
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={"RestartedInPlace": 2},
                  reasons={"RestartedInPlace", "Completed"})
    resumed = restores(bed, ns, name, since=began)
    assert [r.step for r in resumed] == [5] and resumed[0].tier == "local", resumed
    logs = "".join(p.read_text(errors="replace") for p in (bed.state / "pods").glob("*/trainer.log")
                   if p.parent.name in {w["metadata"]["uid"] for w in workers})
    assert "step 10: not using the local tier's copy: state.llmt fails its xxh3-128 check" in logs


# ---------------------------------------------------------------- 14. many jobs, room for few


def test_14_jobs_beyond_the_clusters_room_wait_without_restarts_or_pod_churn(operator, prometheus):
    """Three jobs of two 2-GPU workers each on three 2-GPU nodes: one runs at a time, the
    others wait for room, never charged, their pods never recreated."""
    bed, ns = operator, "e2e-m-room"
    names = ["room-a", "room-b", "room-c"]
    gpu = {"spec.replicas": {"min": 2, "max": 2},
           "spec.resources": {"requests": {"cpu": "100m", "memory": "256Mi", "nvidia.com/gpu": 2},
                              "limits": {"memory": "4Gi", "nvidia.com/gpu": 2}},
           "spec.trainer.builtin.maxSteps": 20}
    churns = [Churn(bed, ns, n).__enter__() for n in names]
    try:
        for n in names:
            create(bed, ns, job_manifest(n, gpu))
        waited = wait_for(lambda: [n for n in names if any(p["status"].get("phase") == "Pending" for p in pods(bed, ns, n))],
                          120, 1, "a job waiting for room")
        done = {n: finished(bed, ns, n, timeout=900) for n in names}
    finally:
        for churn in churns:
            churn.__exit__()
    assert waited, "every job found room at once: the scenario needs fewer GPUs than it asks for"
    for n in names:
        check_outcome(bed, ns, n, done[n], phase="Succeeded", step=20, by_reason={}, reasons={"Completed"})
    for churn in churns:
        assert len(churn.uids) == 2, (churn.job, churn.uids)
