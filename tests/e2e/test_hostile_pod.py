"""A hostile pod inside the job's namespace, carrying the job's label (so that the job's
NetworkPolicy admits it, as it would a planted pod): one job, two attacks.

- It writes a forged rendezvous state into the job's store (a pickle naming ``os.system``,
  the issue's attack), then one made of torchrun's own types only (the job's state as it
  read it, with a node added to the wait list, which would restart every worker), and
  sends the store's lease port a forged hello naming a live worker's agent. It has not the
  job's token: the store refuses all three and logs them (it puts back the last good,
  signed state; the hello carries no MAC of the token, so nobody leaves the rendezvous);
  no process runs the forgery; the job trains on without a restart.
- It holds 1,000 idle connections to a worker's health and metrics ports. The pod's
  servers hold a bounded number of threads, so the pod still starts processes: a rank
  crash during the flood is restarted in place by torchrun, and the job trains on, its
  progress read by the operator's probes through the flood."""

from __future__ import annotations

import json

import pytest
from llmtrain_contract.names import HEALTH_PORT, METRICS_PORT, RDZV_LEASE_PORT_OFFSET, RDZV_PORT
from support.waiting import wait_for

from .jobs import create, job_manifest, pods, rank_holder, run_dir, status, wait_status

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-hostile", "hostile"
RAN = "FORGERY-RAN"
CRASH = "crash-now"
FORGER = """
import base64, datetime, json, os, pickle, socket, sys, time
from torch.distributed import TCPStore

host, port, run_id, victim = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


class Forged:
    def __reduce__(self):
        return (os.system, ("echo RAN_MARK >&2",))


store = TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=30))
key = "torch.rendezvous." + run_id
store.set(key, base64.b64encode(pickle.dumps(Forged())))
time.sleep(2)  # the store puts back the job's state
# torchrun's own types: the job's state as read, its signature (whose key it has not) cut
# off, a node added to the wait list.
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc
raw = base64.b64decode(store.get(key))
state = pickle.loads(raw[raw.index(b":") + 1 + 32:] if raw.startswith(b"llmtrain-signed-state-v1:") else raw)
intruder = _NodeDesc("intruder", 4242, 0)
state.wait_list.add(intruder)
state.last_heartbeats[intruder] = datetime.datetime.now(datetime.timezone.utc)
store.set(key, base64.b64encode(pickle.dumps(state)))
for attempt in range(50):  # the store's client above retried; this is a plain socket
    try:
        conn = socket.create_connection((host, port + LEASE_OFFSET), timeout=10)
        break
    except OSError:
        time.sleep(0.2)
with conn:
    conn.sendall((json.dumps({"run_id": run_id, "addr": victim, "pid": 1, "min_nodes": 1}) + "\\n").encode())
print("forged", flush=True)
""".replace("RAN_MARK", RAN).replace("LEASE_OFFSET", str(RDZV_LEASE_PORT_OFFSET))
FLOOD = """
import json, resource, socket, sys, time

targets, count, hold = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for i in range(count):
    host, port = targets[i % len(targets)]
    # A new pod's address reaches a policy plugin's sets a moment after it starts (kube-router:
    # within about a second): an admitted pod may be refused at first.
    deadline = time.monotonic() + 10
    while True:
        try:
            held.append(socket.create_connection((host, port), timeout=5))
            break
        except OSError as err:
            if time.monotonic() > deadline:
                print("refused", i, type(err).__name__, flush=True)
                break
            time.sleep(0.2)
print("holding", len(held), flush=True)
time.sleep(hold)
print("released", flush=True)
"""


def _run(bed, name: str, image: str, command: list[str]) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, "labels": {"llmtrain.io/job": NAME}},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": name, "image": image, "imagePullPolicy": "IfNotPresent", "command": command}]}}
    bed.kubectl("apply", "-f", "-", input=json.dumps(pod))


def _finished(bed, name: str, timeout: float) -> dict:
    return wait_for(lambda: (p := bed.get("pod", name, "-n", NS)).get("status", {}).get("phase") in ("Succeeded", "Failed") and p,
                    timeout, what=f"the pod {name}")


@pytest.fixture(scope="module")
def job(operator):
    bed = operator
    create(bed, NS, job_manifest(NAME, {
        "spec.trainer.builtin.maxSteps": 100000,
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT",
                      "value": f"slow@step=1,seconds=0.3,steps=100000;crash@trigger={CRASH},rank=1"}],
    }))
    wait_status(bed, NS, NAME, lambda s: s.get("worldSize") == 2 and s.get("step", 0) >= 5, 300, "training at world size 2")
    yield bed.get("ltj", NAME, "-n", NS)
    bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)
    bed.kubectl("delete", "pods", "forger", "flood", "-n", NS, "--wait=false", check=False)


def _logs(bed) -> dict[str, str]:
    every = pods(bed, NS, NAME) + pods(bed, NS, NAME, role="rendezvous")
    return {p["metadata"]["name"]: bed.pod_log(NS, p["metadata"]["name"]) for p in every}


def test_a_forged_rendezvous_state_and_lease_line_are_refused_and_the_job_trains_on(operator, job):
    bed = operator
    wait_status(bed, NS, NAME, lambda s: s.get("worldSize") == 2, 300, "training at world size 2")
    store = next(p for p in pods(bed, NS, NAME, role="rendezvous") if p.get("status", {}).get("podIP"))
    victim = next(p for p in pods(bed, NS, NAME) if p.get("status", {}).get("podIP"))
    _run(bed, "forger", victim["spec"]["containers"][0]["image"],
         ["python", "-c", FORGER, store["status"]["podIP"], str(RDZV_PORT), job["metadata"]["uid"], victim["status"]["podIP"]])
    done = _finished(bed, "forger", 120)
    assert done["status"]["phase"] == "Succeeded" and "forged" in bed.pod_log(NS, "forger"), bed.pod_log(NS, "forger")
    at = status(bed, NS, NAME)["step"]

    def store_log() -> str:
        return bed.pod_log(NS, store["metadata"]["name"])

    wait_for(lambda: "refused a forged rendezvous state" in store_log() and "put back" in store_log()
             and "not signed with the job's token" in store_log(), 30, what="the store refusing the forged states")
    wait_for(lambda: "no valid hello" in store_log() and "carries no MAC of the job's token" in store_log(), 30,
             what="the store refusing the forged hello")
    trained = wait_status(bed, NS, NAME, lambda s: s.get("step", 0) >= at + 10, 180, "training on")
    assert trained.get("restarts", 0) == 0 and trained["worldSize"] == 2, trained
    assert "is gone" not in store_log(), "a forged hello took a live agent out of the rendezvous"
    ran = [name for name, log in _logs(bed).items() if RAN in log]
    assert not ran, f"the forged state ran in {ran}"


def test_a_thousand_idle_connections_leave_a_worker_starting_processes_and_the_job_training(operator, job):
    bed = operator
    wait_status(bed, NS, NAME, lambda s: s.get("worldSize") == 2, 300, "training at world size 2")
    victim, _ = wait_for(lambda: rank_holder(bed, NS, NAME, 1), 60, 0.5, "rank 1's heartbeat")
    ip = victim["status"]["podIP"]
    _run(bed, "flood", victim["spec"]["containers"][0]["image"],
         ["python", "-c", FLOOD, json.dumps([[ip, HEALTH_PORT], [ip, METRICS_PORT]]), "1000", "90"])
    wait_for(lambda: "holding" in bed.pod_log(NS, "flood"), 120, what="the flood's connections open")
    holding = bed.pod_log(NS, "flood")
    assert "holding 1000" in holding, holding[-2000:]
    before = status(bed, NS, NAME)
    # A rank of the flooded pod dies: torchrun must start new processes in it.
    (run_dir(bed, victim) / CRASH).write_text("")
    restarted = wait_status(bed, NS, NAME, lambda s: s.get("restartsByReason", {}).get("RestartedInPlace", 0) >= 1, 120,
                            "the crashed rank restarted in place")
    assert restarted["restartsByReason"] == {"RestartedInPlace": 1}, restarted["restartsByReason"]
    # The step reaches the status through the operator's probes of the flooded ports.
    trained = wait_status(bed, NS, NAME, lambda s: s.get("step", 0) >= before["step"] + 10 and s.get("worldSize") == 2, 120,
                          "training on through the flood")
    assert trained["restarts"] == 1 and trained["phase"] == "Running", trained
    flood = bed.get("pod", "flood", "-n", NS)
    assert flood["status"]["phase"] == "Running", "the flood ended before the job was shown training through it"
