"""In-process healing (``faultTolerance.inProcessHealing``) under the operator, on either
bed: a rank SIGKILLed mid-run is restarted in its pod by its node's torchrun agent, its
peer keeps its process and its step, the replacement gets the state from that peer (no
trainer restores from any tier), the failure is still charged once (``RestartedInPlace``),
no pod is replaced, and the trainers' heal counters reach the real Prometheus.

A node lost whole (every process of it killed, its heartbeats stopped): the operator
replaces its pod after ``nodeFailureGraceSeconds``, the survivor waits in its process,
and the replacement's torchrun agent takes the lost node's seat, its rank getting the
state from the survivor's memory; charged once as ``NodeFailure``.

The trainer-level checks (losses bit for bit, three nodes, nodes of two ranks) are
``tests/trainer/runs/test_heal.py``'s; this is what a user of the operator sees."""

from __future__ import annotations

import re
import time

import pytest
from support.waiting import wait_for

from .jobs import GANG, create, get, pods, rank_holder, wait_event, wait_status
from .matrix import Churn, check_outcome, restores
from .test_fault_matrix import STEPS, finished, paced

pytestmark = pytest.mark.e2e

CRASH_STEP = 17


def test_a_crashed_rank_heals_in_place_charged_once_and_its_peer_keeps_its_process(operator, prometheus):
    bed, ns, name = operator, "e2e-heal", "heal"
    create(bed, ns, paced(name, f"crash@step={CRASH_STEP},rank=1", {**GANG, "spec.faultTolerance.inProcessHealing": True}))
    with Churn(bed, ns, name) as churn:
        wait_status(bed, ns, name, lambda s: s.get("worldSize") == 2, 300, "two workers training")
        survivor, pid = wait_for(lambda: rank_holder(bed, ns, name, 0), 60, 0.5, "rank 0's heartbeat")
        done = finished(bed, ns, name)
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={"RestartedInPlace": 1},
                  reasons={"RestartedInPlace", "Completed"})
    assert done.get("heals") == 1, done.get("heals")
    assert len(churn.uids) == 2, "the rank was restarted in its pod; no pod was replaced"
    # What the user reads says that only that pod's group restarted, for its peer to heal.
    healing_words = "restarted that pod's worker group in place, for the other pods' ranks, if any, to heal in process"
    wait_event(bed, ns, name, "RestartedInPlace", healing_words)
    assert healing_words in get(bed, ns, name)["status"]["lastFailure"]["message"]
    # Nothing restored from storage, ever: a gang starts fresh, and the restarted rank took
    # the state from rank 0's memory.
    assert restores(bed, ns, name) == [], restores(bed, ns, name)
    log = bed.pod_log(ns, survivor["metadata"]["name"])
    healed = re.findall(r"healed in process \(pid (\d+) kept\): round \d+ formed in [\d.]+s, restarted rank\(s\) \[1\], "
                        r"the state from rank 0 at step (\d+)", log)
    assert healed == [(str(pid), str(CRASH_STEP - 1))], (pid, healed, log[-3000:])
    # Each rank's page counted its part (max over the run: the finished pods are no longer scraped).
    for role in ("survivor", "replacement"):
        expr = f'sum(max_over_time(llmtrain_trainer_heals_total{{namespace="{ns}",role="{role}"}}[15m]))'
        assert prometheus.wait_value(expr, lambda v: v >= 1, 60) == 1, role


def test_a_lost_node_s_replacement_takes_its_seat_and_heals_from_the_survivor(operator, prometheus):
    bed, ns, name = operator, "e2e-heal-node", "healnode"
    # The survivor waits for the replacement within the round's deadline (the collective
    # timeout) and the watchdog's hang timeout: both outlast the node's NotReady, the grace
    # and the replacement's start on either bed.
    create(bed, ns, paced(name, changes={**GANG, "spec.faultTolerance.inProcessHealing": True,
                                         "spec.faultTolerance.nodeFailureGraceSeconds": 8,
                                         "spec.faultTolerance.collectiveTimeoutSeconds": 90,
                                         "spec.faultTolerance.hangTimeoutSeconds": 100}))
    wait_status(bed, ns, name, lambda s: s.get("worldSize") == 2 and s.get("step", 0) >= 8, 300, "two workers past step 8")
    store_node = pods(bed, ns, name, role="rendezvous")[0]["spec"]["nodeName"]
    holders = [wait_for(lambda r=r: rank_holder(bed, ns, name, r), 60, 0.5, f"rank {r}'s heartbeat") for r in (0, 1)]
    nodes = [pod["spec"]["nodeName"] for pod, _ in holders]
    assert nodes[0] != nodes[1], f"both workers on {nodes[0]}: a node loss would leave no survivor"
    # The lost node must not take the store (the rounds' keys) with it.
    lost = next(i for i in (1, 0) if nodes[i] != store_node)
    (victim, _), (survivor, pid) = holders[lost], holders[1 - lost]
    began = time.time()
    with Churn(bed, ns, name) as churn:
        bed.fail_node(nodes[lost])
        try:
            done = finished(bed, ns, name, timeout=900)
        finally:
            bed.heal_node(nodes[lost])
    bed.wait_nodes_ready(180)
    check_outcome(bed, ns, name, done, phase="Succeeded", step=STEPS, by_reason={"NodeFailure": 1},
                  reasons={"NodeFailure", "Completed"})
    assert done.get("heals") == 1, done.get("heals")
    assert victim["metadata"]["uid"] in churn.uids and len(churn.uids) == 3, "the lost pod replaced once, the survivor kept"
    wait_event(bed, ns, name, "NodeFailure", "the other pods' ranks keep their processes and wait up to "
               "collectiveTimeoutSeconds (90s) for the replacement to heal from them")
    assert restores(bed, ns, name, since=began) == [], restores(bed, ns, name, since=began)
    log = bed.pod_log(ns, survivor["metadata"]["name"])
    healed = re.findall(rf"healed in process \(pid (\d+) kept\): round \d+ formed in [\d.]+s, restarted rank\(s\) \[{lost}\], "
                        rf"the state from rank {1 - lost} at step (\d+)", log)
    assert [p for p, _ in healed] == [str(pid)], (pid, healed, log[-3000:])
    replacement = next(p for p in pods(bed, ns, name) if p["metadata"]["uid"] not in (victim["metadata"]["uid"],
                                                                                     survivor["metadata"]["uid"]))
    taken = bed.pod_log(ns, replacement["metadata"]["name"])
    assert re.search(rf"took the seat of a lost node \(group rank \d of 2, ranks \[{lost}\]", taken), taken[-3000:]
    assert re.search(rf"restarted in process: step {healed[0][1]} from rank {1 - lost}'s memory", taken), taken[-3000:]
