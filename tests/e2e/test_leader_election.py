"""Two operator replicas: exactly one writes, from the moment both start together, and a
standby takes over when the leader dies.

Who wrote what comes from the API server's audit log (every write a workload's service
account makes, with the replica's identity in its user agent), not from the operator's
own account of itself."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest
from support.waiting import wait_for

from .conftest import OPERATOR_NS
from .jobs import create, job_manifest, status, wait_status

pytestmark = pytest.mark.e2e

NS = "e2e-leader"
SA = f"system:serviceaccount:{OPERATOR_NS}:llmtrain"
LEASE_DURATION, RETRY_PERIOD = 15.0, 2.0
KUBECTL_SLACK = 3.0
"""How late the test itself may notice a change (one kubectl poll takes up to ~1 s here)."""


def operator_pods(bed) -> dict[str, dict]:
    out = bed.kubectl("get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=llmtrain-operator", "-o", "json", check=False)
    return {p["metadata"]["name"]: p for p in json.loads(out.stdout)["items"]} if out.returncode == 0 else {}


def holder(bed) -> str:
    out = bed.kubectl("get", "lease", "llmtrain-operator", "-n", OPERATOR_NS, "-o", "jsonpath={.spec.holderIdentity}", check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def pod_of(identity: str) -> str:
    return identity.rsplit("_", 1)[0]


def stamp(event: dict) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def operator_writes(bed, since: datetime | None = None) -> list[tuple[datetime, str, str]]:
    """(time, replica pod, what) of every write the operator's service account made,
    the leader Lease itself excepted."""
    out = []
    for event in bed.audit():
        if (event.get("user") or {}).get("username") != SA or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "leases":
            continue
        match = re.search(r"\(([^)]+)\)", event.get("userAgent", ""))
        if match is None:
            continue
        when = stamp(event)
        if since is None or when >= since:
            what = (f"{event['verb']} {ref.get('resource')}{'/' + ref['subresource'] if ref.get('subresource') else ''} "
                    f"{ref.get('name', '')}")
            out.append((when, pod_of(match.group(1)), what))
    return sorted(out)


def wait_for_holder(bed, predicate, timeout: float, what: str) -> tuple[str, float]:
    """The Lease's holder once ``predicate`` accepts it, and how long that took."""
    began = time.monotonic()
    current = wait_for(lambda: (lambda h: h if predicate(h) else None)(holder(bed)), timeout, interval=0.2, what=what)
    return current, time.monotonic() - began


def ready_pods(bed, exclude: set[str]) -> list[str]:
    pods = operator_pods(bed)
    return [name for name, p in pods.items() if name not in exclude and not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])]


ELECT = [f"elect-{i}" for i in range(4)]


def _two_replicas_and_a_leader(bed) -> str:
    """A test's starting point: two replicas ready, one of them holding the Lease (where
    the test before passed, at once). The holder's identity."""
    wait_for(lambda: len(ready_pods(bed, set())) >= 2, 180, what="two replicas ready")
    leader, _ = wait_for_holder(bed, lambda h: pod_of(h) in set(ready_pods(bed, set())), 60, "a ready replica leads")
    return leader


@pytest.fixture(scope="module")
def jobs(operator):
    """The namespace; its jobs are deleted at the end, and the operator left with two
    replicas rolled out for the modules after this one."""
    bed = operator
    bed.kubectl("create", "namespace", NS, check=False)
    yield
    for name in [*ELECT, "after-kill"]:
        bed.kubectl("delete", "ltj", name, "-n", NS, "--wait=false", check=False)
    bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=180s", check=False)


def test_two_replicas_started_together_never_both_write(operator, jobs):
    """Both replicas start at the same moment, with jobs waiting for them."""
    bed = operator
    old = set(operator_pods(bed))
    assert len(old) == 2
    bed.kubectl("delete", "pod", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=llmtrain-operator", "--wait=false")
    for name in ELECT:
        create(bed, NS, job_manifest(name, {"spec.suspend": True}))
    wait_for(lambda: len(ready_pods(bed, old)) >= 2, 180, what="two new replicas ready")
    new = set(ready_pods(bed, old))
    assert len(new) == 2, operator_pods(bed).keys()
    for name in ELECT:
        wait_status(bed, NS, name, lambda s: s.get("phase") == "Suspended", 120, f"{name} suspended")
    leader, _ = wait_for_holder(bed, lambda h: pod_of(h) in new, 60, "a new replica leads")
    time.sleep(3)  # let any write a second replica might make reach the audit log

    writes = [w for w in operator_writes(bed) if w[1] in new]
    writers = {w[1] for w in writes}
    assert writers == {pod_of(leader)}, writes[:20]
    old_writes = [w for w in operator_writes(bed) if w[1] in old]
    if old_writes:  # the old leader wrote until it released the Lease, never after
        assert max(w[0] for w in old_writes) < min(w[0] for w in writes), (old_writes[-3:], writes[:3])
    out = bed.kubectl("get", "events", "-n", NS, "-o", "json")
    reasons = [(e["involvedObject"]["name"], e["reason"]) for e in json.loads(out.stdout)["items"]]
    for name in ELECT:
        assert reasons.count((name, "Suspended")) == 1, reasons  # decided once, by one replica


def test_a_lost_leader_is_replaced_by_the_standby_which_alone_writes_and_says_it_leads(operator, prometheus, jobs):
    """The leader is killed outright (no release): the standby takes over once the Lease
    has not changed for its duration, and the two never write at the same time."""
    bed = operator
    leader = _two_replicas_and_a_leader(bed)
    bed.kill_pod(OPERATOR_NS, pod_of(leader))
    killed_at = datetime.now().astimezone()
    successor, took = wait_for_holder(bed, lambda h: h != leader and h != "", LEASE_DURATION + 2 * RETRY_PERIOD + KUBECTL_SLACK + 20,
                                      "a successor after the leader was killed")
    # The killed pod restarts with a new identity and races the standby fairly.
    assert took <= LEASE_DURATION + 2 * RETRY_PERIOD + KUBECTL_SLACK, took
    create(bed, NS, job_manifest("after-kill", {"spec.suspend": True}))
    wait_status(bed, NS, "after-kill", lambda s: s.get("phase") == "Suspended", 60, "a job served by the successor")
    after = operator_writes(bed, since=killed_at)
    assert {w[1] for w in after} == {pod_of(successor)}, after[:20]
    assert status(bed, NS, "after-kill")["phase"] == "Suspended"
    # As the real Prometheus scrapes the replicas: the successor says it leads, and one
    # replica in all does.
    assert prometheus.wait_value(f'max(llmtrain_operator_leader{{pod="{pod_of(successor)}"}})', lambda v: v == 1, 60) == 1
    assert prometheus.wait_value("sum(llmtrain_operator_leader)", lambda v: v == 1, 60) == 1


def test_a_gracefully_stopped_leader_hands_over_at_the_next_retry(operator, jobs):
    """A graceful stop (the pod deleted) releases the Lease: the other replica takes over at
    its next retry, without waiting for the Lease to expire."""
    bed = operator
    current = _two_replicas_and_a_leader(bed)
    bed.kubectl("delete", "pod", pod_of(current), "-n", OPERATOR_NS, "--wait=false")
    _, took = wait_for_holder(bed, lambda h: h not in ("", current), 60, "a successor after a graceful stop")
    assert took <= 2 * RETRY_PERIOD + KUBECTL_SLACK, took
    bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=180s")
