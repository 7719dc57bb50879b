"""The local cluster behaves like a cluster: pods run and report, restart policies hold,
Services resolve, failed nodes are handled by the real node-lifecycle controller, and
the CRD's schema and CEL rules are enforced by the real API server."""

from __future__ import annotations

import json
import textwrap
import time

import pytest
import yaml
from support.specs import ROOT, invalid_cases

from .helpers import apply, phase, pod, wait_for

pytestmark = pytest.mark.cluster

NS = "bed"


@pytest.fixture(scope="module")
def bed(local_cluster):
    local_cluster.kubectl("create", "namespace", NS, check=False)
    return local_cluster


def test_a_plain_pod_succeeds_with_its_exit_code_and_env(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: hello}
        spec:
          restartPolicy: Never
          containers:
          - name: main
            image: unused
            command: ["python", "-c", "import os, socket; print(socket.gethostname(), os.environ['MY_IP'], os.environ['MY_NS'])"]
            env:
            - {name: MY_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
            - {name: MY_NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    """), NS)
    wait_for(lambda: phase(bed, "hello", NS) == "Succeeded", 60, what="hello Succeeded")
    status = pod(bed, "hello", NS)["status"]
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert bed.pod_log(NS, "hello").split() == ["hello", status["podIP"], NS]


def test_a_read_only_root_refuses_writes_outside_the_volumes(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: read-only-root}
        spec:
          restartPolicy: Never
          volumes: [{name: tmp, emptyDir: {}}]
          containers:
          - name: main
            image: unused
            securityContext: {readOnlyRootFilesystem: true}
            volumeMounts: [{name: tmp, mountPath: /tmp}]
            command:
            - python
            - -c
            - |
              import errno, pathlib
              pathlib.Path("/tmp/ok").write_text("x")
              try:
                  pathlib.Path("/root/llmtrain-bed-read-only-probe").write_text("x")
              except OSError as err:
                  print("root:", errno.errorcode[err.errno])
              else:
                  print("root: written")
    """), NS)
    wait_for(lambda: phase(bed, "read-only-root", NS) == "Succeeded", 60, what="read-only-root Succeeded")
    assert bed.pod_log(NS, "read-only-root").split() == ["root:", "EROFS"]


def test_a_pod_waits_for_a_missing_config_map_and_starts_once_it_exists(bed):
    # The kubelet keeps retrying a missing ConfigMap; the operator relies on that when it
    # creates a job's pods and ConfigMap in one round.
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: waits-for-config}
        spec:
          restartPolicy: Never
          containers:
          - name: main
            image: unused
            command: ["python", "-c", "print(open('/config/greeting').read())"]
            volumeMounts: [{name: config, mountPath: /config}]
          volumes:
          - {name: config, configMap: {name: late-config}}
    """), NS)

    def waiting():
        statuses = (pod(bed, "waits-for-config", NS).get("status") or {}).get("containerStatuses") or []
        return (statuses[0].get("state") or {}).get("waiting", {}) if statuses else {}

    waited = wait_for(lambda: waiting().get("reason") == "CreateContainerConfigError" and waiting(), 60, what="CreateContainerConfigError")
    assert "late-config" in waited.get("message", "")
    time.sleep(3)  # several retries
    assert phase(bed, "waits-for-config", NS) == "Pending"
    bed.kubectl("create", "configmap", "late-config", "-n", NS, "--from-literal=greeting=hello-late")
    wait_for(lambda: phase(bed, "waits-for-config", NS) == "Succeeded", 60, what="waits-for-config Succeeded")
    assert bed.pod_log(NS, "waits-for-config").strip() == "hello-late"


def test_a_failing_pod_with_on_failure_is_restarted_and_its_restart_count_rises(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: flaky}
        spec:
          restartPolicy: OnFailure
          containers:
          - name: main
            image: unused
            command: ["python", "-c", "raise SystemExit(7)"]
    """), NS)

    def restarts():
        statuses = (pod(bed, "flaky", NS).get("status") or {}).get("containerStatuses") or []
        return statuses and statuses[0]["restartCount"] >= 2 and statuses[0]

    status = wait_for(restarts, 60, what="two restarts")
    assert status["lastState"]["terminated"]["exitCode"] == 7
    assert phase(bed, "flaky", NS) == "Running"  # OnFailure keeps trying


def test_init_containers_run_first_share_volumes_and_a_failed_one_fails_a_never_pod(bed):
    """As the kubelet: init containers one at a time, each to success, before the
    containers; the python-torch image has torch and not this project."""
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: with-init}
        spec:
          restartPolicy: Never
          initContainers:
          - name: first
            image: unused
            command: ["python", "-c", "open('/shared/order', 'a').write('first ')"]
            volumeMounts: [{name: shared, mountPath: /shared}]
          - name: second
            image: unused
            command: ["python", "-c", "import time; time.sleep(1); open('/shared/order', 'a').write('second ')"]
            volumeMounts: [{name: shared, mountPath: /shared}]
          containers:
          - name: main
            image: localcluster.local/python-torch:1
            command: ["python", "-c",
                      "import importlib.util as u, torch; print(open('/shared/order').read() + 'main', u.find_spec('llmtrain_trainer'))"]
            volumeMounts: [{name: shared, mountPath: /shared}]
          volumes:
          - {name: shared, emptyDir: {}}
    """), NS)
    seen = wait_for(lambda: (pod(bed, "with-init", NS).get("status") or {}).get("initContainerStatuses"), 60, what="init statuses")
    assert [c["name"] for c in seen] == ["first", "second"]
    wait_for(lambda: phase(bed, "with-init", NS) == "Succeeded", 120, what="with-init Succeeded")
    status = pod(bed, "with-init", NS)["status"]
    assert [c["state"]["terminated"]["exitCode"] for c in status["initContainerStatuses"]] == [0, 0]
    assert bed.pod_log(NS, "with-init").split() == ["first", "second", "main", "None"], "in order; no project in that image"

    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: init-fails}
        spec:
          restartPolicy: Never
          initContainers:
          - {name: broken, image: unused, command: ["python", "-c", "raise SystemExit(3)"]}
          containers:
          - {name: main, image: unused, command: ["python", "-c", "print('must not run')"]}
    """), NS)
    wait_for(lambda: phase(bed, "init-fails", NS) == "Failed", 60, what="init-fails Failed")
    status = pod(bed, "init-fails", NS)["status"]
    assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"


def test_a_service_name_resolves_in_a_pod_and_one_pod_reaches_another(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Service
        metadata: {name: web}
        spec:
          clusterIP: None
          selector: {app: web}
          ports: [{port: 8080}]
        ---
        apiVersion: v1
        kind: Pod
        metadata: {name: web, labels: {app: web}}
        spec:
          containers:
          - name: main
            image: unused
            command: ["python", "-m", "http.server", "8080"]
            readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {name: client}
        spec:
          restartPolicy: OnFailure
          containers:
          - name: main
            image: unused
            command:
            - python
            - -c
            - |
              import socket, urllib.request
              ip = socket.gethostbyname("web")  # search path -> web.bed.svc.cluster.local
              body = urllib.request.urlopen("http://web.bed.svc:8080/", timeout=5).read()
              print(ip, len(body) > 0)
    """), NS)
    wait_for(lambda: phase(bed, "client", NS) == "Succeeded", 90, what="client Succeeded")
    web_ip = pod(bed, "web", NS)["status"]["podIP"]
    assert bed.pod_log(NS, "client").split()[-2:] == [web_ip, "True"]


def test_a_failed_node_goes_not_ready_is_tainted_unreachable_and_its_pods_are_marked(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: doomed}
        spec:
          nodeName: node-2
          containers:
          - {name: main, image: unused, command: ["sleep", "3600"]}
    """), NS)
    wait_for(lambda: phase(bed, "doomed", NS) == "Running", 60, what="doomed Running")
    bed.fail_node("node-2")

    def unhealthy():
        node = bed.get("node", "node-2")
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        taints = {t["key"] for t in node["spec"].get("taints", [])}
        return ready["status"] == "Unknown" and "node.kubernetes.io/unreachable" in taints and node

    wait_for(unhealthy, 90, what="node-2 NotReady/Unknown and tainted")
    # As in a real cluster, the pod's Ready condition turns False; it stays bound to the
    # node until evicted (tolerationSeconds) or force-deleted.
    wait_for(lambda: next(c for c in pod(bed, "doomed", NS)["status"]["conditions"] if c["type"] == "Ready")["status"] == "False",
             60, what="doomed not Ready")
    bed.kubectl("delete", "pod", "doomed", "-n", NS, "--grace-period=0", "--force", check=False)
    bed.heal_node("node-2")


def test_the_crd_applies_and_the_examples_are_accepted(bed):
    bed.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "llmtrain.io_llmtrainjobs.yaml"))
    wait_for(lambda: bed.kubectl("get", "crd", "llmtrainjobs.llmtrain.io", "-o",
                                 "jsonpath={.status.conditions[?(@.type=='Established')].status}").stdout == "True",
             30, what="CRD established")
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(example.read_text()) if d and d["kind"] == "LLMTrainJob"]
        for doc in docs:
            out = bed.kubectl("apply", "--dry-run=server", "-n", NS, "-f", "-", input=yaml.safe_dump(doc), check=False)
            assert out.returncode == 0, out.stderr
    assert "ltj" in bed.kubectl("api-resources", "--api-group=llmtrain.io").stdout


@pytest.mark.parametrize("case", [c for c in invalid_cases() if c.server], ids=lambda c: c.name)
def test_invalid_specs_are_rejected_by_the_api_servers_schema_and_cel(bed, case):
    bed.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "llmtrain.io_llmtrainjobs.yaml"))
    out = bed.kubectl("apply", "--dry-run=server", "-n", NS, "-f", "-", input=yaml.safe_dump(case.job), check=False)
    assert out.returncode != 0, f"{case.name} was accepted"
    assert case.server in out.stderr, out.stderr


def test_operator_only_rules_are_accepted_by_the_server_and_left_to_the_operator(bed):
    cases = [c for c in invalid_cases() if c.server is None]
    assert cases
    for case in cases:
        out = bed.kubectl("apply", "--dry-run=server", "-n", NS, "-f", "-", input=yaml.safe_dump(case.job), check=False)
        assert out.returncode == 0, f"{case.name}: {out.stderr}"


def test_immutable_fields_are_enforced_on_update(bed):
    job = yaml.safe_load(json.dumps(next(d for d in yaml.safe_load_all((ROOT / "examples" / "01-tiny-elastic-cpu.yaml").read_text()) if d)))
    job["metadata"]["name"] = "immutable"
    job["spec"]["suspend"] = True
    bed.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job))
    job["spec"]["procsPerNode"] = 2
    job["spec"]["trainer"]["builtin"]["globalBatchSize"] = 16
    out = bed.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job), check=False)
    assert out.returncode != 0
    assert "procsPerNode is immutable" in out.stderr and "trainer is immutable" in out.stderr
    bed.kubectl("delete", "ltj", "immutable", "-n", NS)


def test_a_container_over_its_memory_limit_is_reported_oom_killed(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: hog}
        spec:
          restartPolicy: Never
          containers:
          - name: main
            image: unused
            command: ["python", "-c", "blocks = [bytearray(16 << 20) for _ in range(64)]"]
            resources: {limits: {memory: 200Mi}}
    """), NS)
    wait_for(lambda: phase(bed, "hog", NS) == "Failed", 60, what="hog Failed")
    terminated = pod(bed, "hog", NS)["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


def test_deletion_sends_sigterm_then_sigkill_after_the_grace_period(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: stubborn}
        spec:
          terminationGracePeriodSeconds: 3
          containers:
          - name: main
            image: unused
            command:
            - python
            - -c
            - |
              import signal, sys, time
              signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM, ignoring it", flush=True))
              print("ready", flush=True)
              while True:
                  time.sleep(0.1)
    """), NS)
    wait_for(lambda: "ready" in bed.pod_log(NS, "stubborn"), 60, what="stubborn ready")
    uid = pod(bed, "stubborn", NS)["metadata"]["uid"]
    log = bed.state / "pods" / uid / "main.log"
    began = time.monotonic()
    bed.kubectl("delete", "pod", "stubborn", "-n", NS, "--wait=true", "--timeout=60s")
    took = time.monotonic() - began
    assert "got SIGTERM, ignoring it" in log.read_text()
    assert 3 <= took <= 20, took  # killed after the grace period, then removed


def test_a_partitioned_node_goes_unknown_while_its_processes_keep_running(bed):
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: islander}
        spec:
          nodeName: node-1
          containers:
          - {name: main, image: unused,
             command: ["python", "-c", "import time\\nwhile True:\\n    print('alive', flush=True); time.sleep(1)"]}
    """), NS)
    wait_for(lambda: phase(bed, "islander", NS) == "Running", 60, what="islander Running")
    uid = pod(bed, "islander", NS)["metadata"]["uid"]
    bed.partition_node("node-1")
    try:
        wait_for(lambda: next(c for c in bed.get("node", "node-1")["status"]["conditions"] if c["type"] == "Ready")["status"] == "Unknown",
                 90, what="node-1 Unknown")
        log = bed.state / "pods" / uid / "main.log"
        before = log.read_text().count("alive")
        time.sleep(3)
        assert log.read_text().count("alive") > before, "the processes keep running behind the partition"
        wait_for(lambda: _ready(pod(bed, "islander", NS)) == "False", 60, what="islander marked not Ready by the node controller")
    finally:
        bed.heal_node("node-1")
    wait_for(lambda: next(c for c in bed.get("node", "node-1")["status"]["conditions"] if c["type"] == "Ready")["status"] == "True",
             60, what="node-1 Ready again")
    # The kubelet writes its own view back over the controller's mark, as a real one does
    # (an operator Deployment would otherwise never be ready again after an outage).
    wait_for(lambda: _ready(pod(bed, "islander", NS)) == "True", 30, what="islander Ready again")
    bed.kubectl("delete", "pod", "islander", "-n", NS, "--grace-period=0", "--force", check=False)


def _ready(obj: dict) -> str | None:
    return next((c["status"] for c in obj["status"].get("conditions", []) if c["type"] == "Ready"), None)


def test_the_api_server_restarts_and_the_agent_carries_on(bed):
    took = bed.restart_apiserver()
    assert took < 60
    apply(bed, textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: after-restart}
        spec:
          restartPolicy: Never
          containers:
          - {name: main, image: unused, command: ["python", "-c", "print('ok')"]}
    """), NS)
    wait_for(lambda: phase(bed, "after-restart", NS) == "Succeeded", 90, what="a pod runs after the restart")
    bed.wait_nodes_ready(60)


def test_a_claim_deleted_and_made_again_under_its_name_gets_a_fresh_volume(bed):
    """The bed's provisioner reclaims a deleted claim's volume and folder (hostPath has no
    deleter, so the PV controller marks it Failed): before, the name stayed taken and the
    claim made again stayed Pending for good."""
    claim = textwrap.dedent("""
        apiVersion: v1
        kind: PersistentVolumeClaim
        metadata: {name: again}
        spec: {accessModes: [ReadWriteMany], resources: {requests: {storage: 1Gi}}}
    """)
    status = lambda: json.loads(bed.kubectl("get", "pvc", "again", "-n", NS, "-o", "json").stdout)["status"]  # noqa: E731
    apply(bed, claim, NS)
    wait_for(lambda: status().get("phase") == "Bound", 60, what="the first claim Bound")
    folder = bed.state / "pvs" / f"pv-{NS}-again"
    (folder / "left-behind").write_text("x")
    bed.kubectl("delete", "pvc", "again", "-n", NS, "--wait=true")
    wait_for(lambda: not folder.exists(), 60, what="the first volume's folder reclaimed")
    apply(bed, claim, NS)
    wait_for(lambda: status().get("phase") == "Bound", 60, what="the claim made again Bound")
    assert not (folder / "left-behind").exists()
