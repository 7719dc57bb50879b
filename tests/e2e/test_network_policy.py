"""Each job's NetworkPolicy, enforced by a real network plugin (kube-router's policy
controller on the kind bed): a pod of another namespace cannot connect to the job's
rendezvous store, its lease port, a worker's health port or its metrics port (nor the
operator's metrics port: the chart's policy for the operator); a pod of the job's
namespace without the job's label cannot either; the job's own pods train (the store
and the collectives through the policy) and the operator reads them (the step reaches the
status only through its probes). The same connections succeed once the policy is gone (the
operator stopped meanwhile, so that nothing puts it back), so the test can fail; started
again, the operator puts it back and they are refused again.

Only real nodes enforce a policy (the process bed has no network plugin), so the module is
marked ``kind``."""

from __future__ import annotations

import json
import time

import pytest
from llmtrain_contract.names import HEALTH_PORT, METRICS_PORT, RDZV_LEASE_PORT_OFFSET, RDZV_PORT
from support.waiting import wait_for

from .conftest import OPERATOR_NS
from .jobs import GANG, create, job_manifest, pods, status, wait_status

pytestmark = pytest.mark.kind

NS, NAME, OUTSIDE = "e2e-netpol", "isolated", "e2e-netpol-outside"
POLICY = f"{NAME}-isolation"
PROBE = """
import json, socket, sys, time
# A new pod's address reaches the plugin's sets within a second or so: an allowed peer may
# be refused at first, so each target gets SECONDS to connect.
targets, seconds = json.loads(sys.argv[1]), float(sys.argv[2])
out = {}
for host, port in targets:
    deadline, why = time.monotonic() + seconds, ""
    while True:
        s = socket.socket(); s.settimeout(1.0)
        try:
            s.connect((host, port)); why = "connected"
        except OSError as err:
            why = type(err).__name__
        finally:
            s.close()
        if why == "connected" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out[f"{host}:{port}"] = why
print(json.dumps(out))
"""


def _probe(bed, namespace: str, name: str, labels: dict[str, str], targets: list[tuple[str, int]], seconds: float = 6.0) -> dict[str, str]:
    """From a new pod in ``namespace`` with ``labels``: each target's outcome, ``connected``
    or the error (``ConnectionRefusedError``: the plugin rejects; ``TimeoutError``: drops)."""
    image = bed.get("deployment", "llmtrain", "-n", OPERATOR_NS)["spec"]["template"]["spec"]["containers"][0]["image"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "probe", "image": image, "imagePullPolicy": "Never",
               "command": ["python", "-c", PROBE, json.dumps(targets), str(seconds)]}]}}
    bed.kubectl("create", "namespace", namespace, check=False)
    bed.kubectl("delete", "pod", name, "-n", namespace, "--wait=true", check=False)
    bed.kubectl("apply", "-f", "-", input=json.dumps(pod))
    wait_for(lambda: bed.get("pod", name, "-n", namespace).get("status", {}).get("phase") in ("Succeeded", "Failed"),
             60 + seconds * len(targets), what=f"the probe {namespace}/{name}")
    log = bed.pod_log(namespace, name, "probe").strip().splitlines()
    assert log, f"the probe {namespace}/{name} printed nothing"
    return json.loads(log[-1])


def _targets(bed) -> list[tuple[str, int]]:
    store = next(p for p in pods(bed, NS, NAME, role="rendezvous") if p.get("status", {}).get("podIP"))
    worker = next(p for p in pods(bed, NS, NAME) if p.get("status", {}).get("podIP"))
    store_ip, worker_ip = store["status"]["podIP"], worker["status"]["podIP"]
    return [(store_ip, RDZV_PORT), (store_ip, RDZV_PORT + RDZV_LEASE_PORT_OFFSET), (worker_ip, HEALTH_PORT),
            (worker_ip, METRICS_PORT)]


def _operator_replicas(bed, count: int) -> None:
    bed.kubectl("scale", "deployment/llmtrain", "-n", OPERATOR_NS, f"--replicas={count}")
    if count:
        bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=180s")
    else:
        wait_for(lambda: not bed.get("pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=llmtrain-operator")["items"], 120,
                 what="the operator's pods gone")


def test_only_the_jobs_own_pods_and_the_operator_reach_it_and_without_the_policy_anyone_does(real_nodes):
    bed = real_nodes
    replicas = bed.get("deployment", "llmtrain", "-n", OPERATOR_NS)["spec"]["replicas"]
    create(bed, NS, job_manifest(NAME, {
        **GANG, "spec.trainer.builtin.maxSteps": 400,
        # Paced (every step >= 0.5 s): the job trains through the whole test.
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": "slow@step=1,seconds=0.5,steps=400"}],
    }))
    try:
        policy = wait_for(lambda: bed.get("networkpolicy", POLICY, "-n", NS), 60, what="the job's NetworkPolicy")
        assert policy["metadata"]["ownerReferences"][0]["name"] == NAME, policy["metadata"]
        # The job's pods reach each other (rendezvous, collectives) and the operator reads
        # them: the step in the status comes from its probes of the workers.
        wait_status(bed, NS, NAME, lambda s: s.get("step", 0) >= 5 and s.get("worldSize") == 2, 300, "training past step 5")
        targets = _targets(bed)
        every = {f"{h}:{p}" for h, p in targets}

        # The operator's own metrics port is closed to both too (its chart policy admits
        # networkPolicy.metricsFrom alone: here this machine, where the suite's Prometheus runs).
        operator_pod = bed.get("pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=llmtrain-operator")["items"][0]
        port = next(p["containerPort"] for c in operator_pod["spec"]["containers"] for p in c.get("ports", [])
                    if p["name"] == "metrics")
        operator_metrics = (operator_pod["status"]["podIP"], port)
        outside = _probe(bed, OUTSIDE, "probe-outside", {"llmtrain.io/job": NAME}, [*targets, operator_metrics])
        assert set(outside) == every | {f"{operator_metrics[0]}:{operator_metrics[1]}"} and "connected" not in outside.values(), outside
        stranger = _probe(bed, NS, "probe-stranger", {"app": "stranger"}, [*targets, operator_metrics])
        assert "connected" not in stranger.values(), stranger
        # The same ports are open to a pod the policy admits (the job's label in its
        # namespace, as a planted pod would have: the namespace is the trust boundary).
        member = _probe(bed, NS, "probe-member", {"llmtrain.io/job": NAME}, targets)
        assert set(member.values()) == {"connected"}, member

        # Without the policy (and no operator to put it back), the outsider connects.
        _operator_replicas(bed, 0)
        bed.kubectl("delete", "networkpolicy", POLICY, "-n", NS)
        opened = _probe(bed, OUTSIDE, "probe-open", {"app": "outsider"}, targets)
        assert set(opened.values()) == {"connected"}, opened
        _operator_replicas(bed, replicas)
        wait_for(lambda: bed.kubectl("get", "networkpolicy", POLICY, "-n", NS, check=False).returncode == 0, 60,
                 what="the operator putting the policy back")
        time.sleep(2)  # the plugin applies it on its own watch event
        closed = _probe(bed, OUTSIDE, "probe-closed", {"app": "outsider"}, targets)
        assert "connected" not in closed.values(), closed

        before = status(bed, NS, NAME)["step"]
        wait_status(bed, NS, NAME, lambda s: s.get("step", 0) > before, 120, "training on under the policy")
        assert status(bed, NS, NAME).get("restarts", 0) == 0
    finally:
        _operator_replicas(bed, replicas)
        bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)
        bed.kubectl("delete", "namespace", OUTSIDE, "--wait=false", check=False)
