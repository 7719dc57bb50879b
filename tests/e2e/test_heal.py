"""In-process healing (``faultTolerance.inProcessHealing``) under the operator, on either
bed: a rank SIGKILLed mid-run is restarted in its pod by its node's torchrun agent, its
peer keeps its process and its step, the replacement gets the state from that peer (no
trainer restores from any tier), the failure is still charged once (``RestartedInPlace``),
no pod is replaced, and the trainers' heal counters reach the real Prometheus.

The trainer-level checks (losses bit for bit, three nodes, a node lost) are
``tests/trainer/runs/test_heal.py``'s; this is what a user of the operator sees."""

from __future__ import annotations

import re

import pytest
from support.waiting import wait_for

from .jobs import GANG, create, get, rank_holder, wait_event, wait_status
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
