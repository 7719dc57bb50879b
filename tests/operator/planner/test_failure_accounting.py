"""A failure is charged to the restart budget exactly once, whatever the order and
timing of passes.

Property test: hypothesis draws interleavings of faults (pod crashes, evictions, nodes
going NotReady, healing, failing again, Node objects deleted and re-registered), of
deletions progressing (pods deleting, then gone), and of reconcile passes that observe a
lagging view, whose status write fails or is rejected as stale (the API server refuses a
status patch planned from an older resourceVersion), or whose deletes fail. The planner's
budget must equal what an independent bookkeeper counts from the same observations: one
charge per crashed pod, one per node-failure episode that took a pod not charged yet,
never more; and a node's kills with no launcher report, and its NotReady episodes,
are each charged once per node (the episode rule of ``planner/node_history.py``, with a
window longer than the run).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmtrain_operator.api.observed import NodeView, Observed, PodView
from llmtrain_operator.planner import CreateObject, DeletePod, plan
from llmtrain_operator.planner.node_history import points_at_node
from support.planning import NOW, infrastructure, job, store

GRACE = 10
NODES = ("node-1", "node-2", "node-3")
JOB = job({"spec.faultTolerance.maxRestarts": 100_000, "spec.faultTolerance.nodeFailureGraceSeconds": GRACE,
           "spec.faultTolerance.progressTimeoutSeconds": 0,
           "spec.faultTolerance.backoff": {"initialSeconds": 0, "maxSeconds": 0, "factor": 1},
           "spec.faultTolerance.nodeQuarantineSeconds": 30,
           # A window longer than any run here: a node's first failure of each kind is its
           # episode's charge, every later one merges (planner/node_history.py), whatever
           # the pass that first saw it.
           "spec.faultTolerance.nodeFailureWindowSeconds": 86400})


@dataclass
class Node:
    ready: bool = True
    since: datetime = NOW - timedelta(hours=1)
    exists: bool = True


@dataclass
class Pod:
    uid: str
    slot: int
    node: str
    created: datetime
    phase: str = "Running"
    deleting: bool = False
    disruption: bool = False


@dataclass
class World:
    """The API server's view of the job's pods and the cluster's nodes."""

    now: datetime = NOW
    nodes: dict[str, Node] = field(default_factory=lambda: {n: Node() for n in NODES})
    pods: dict[str, Pod] = field(default_factory=dict)
    uids: itertools.count = field(default_factory=lambda: itertools.count(1))
    history: list[Observed] = field(default_factory=list)

    def observe(self) -> Observed:
        views = tuple(PodView(name=f"tiny-elastic-worker-{p.slot}", role="worker", slot=p.slot, generation=0, phase=p.phase,
                              uid=p.uid, node=p.node, ready=p.phase == "Running", deleting=p.deleting, created=p.created,
                              exit_code=137 if p.phase == "Failed" else None, disruption=p.disruption)
                      for p in self.pods.values())
        nodes = {"node-0": NodeView("node-0", "True", NOW - timedelta(hours=1))}
        nodes.update({name: NodeView(name, "True" if n.ready else "Unknown", n.since) for name, n in self.nodes.items() if n.exists})
        return Observed(pods=views + (store(),), nodes=nodes, **infrastructure(JOB))

    def snapshot(self) -> None:
        self.history.append(self.observe())

    def pod_in_slot(self, slot: int) -> Pod | None:
        return next((p for p in self.pods.values() if p.slot == slot and not p.deleting), None)

    def create(self, manifest: dict) -> None:
        slot = int(manifest["metadata"]["labels"]["llmtrain.io/slot"])
        if any(p.slot == slot for p in self.pods.values()):
            return  # 409: the stable name is still taken
        avoid: set[str] = set()
        for term in (manifest["spec"].get("affinity", {}).get("nodeAffinity", {})
                     .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])):
            for expr in term.get("matchExpressions", []):
                avoid |= set(expr.get("values", []))
        healthy = [n for n in NODES if self.nodes[n].exists and self.nodes[n].ready and n not in avoid]
        uid = f"uid-{next(self.uids)}"
        self.pods[uid] = Pod(uid, slot, healthy[slot % len(healthy)] if healthy else NODES[slot % len(NODES)], self.now)

    def delete(self, action: DeletePod) -> None:
        name = action.name
        for pod in [p for p in self.pods.values() if f"tiny-elastic-worker-{p.slot}" == name]:
            if action.force:
                del self.pods[pod.uid]
            else:
                pod.deleting = True


@dataclass
class Bookkeeper:
    """The rule written plainly: a crashed pod is one failure, an evicted pod one
    disruption, a node-failure episode one failure if it took a pod that no failure took
    before; a pod is taken by the first failure that counts it. A pod on a Node that does
    not exist is lost once it is older than the grace (a new pod's Node may not have
    reached the watch yet). While most nodes are NotReady at once (the node lifecycle
    controller's unhealthy-zone rule: all of them, or more than 2 and at least 55 %; the
    nodes here share one zone), the pods on NotReady nodes are kept, not lost."""

    taken: set[str] = field(default_factory=set)
    episodes: set[tuple[str, str]] = field(default_factory=set)
    restarts: int = 0
    disruptions: int = 0
    killed_on: set[str] = field(default_factory=set)
    """Nodes whose episode of kills was charged (the window outlasts the run)."""
    down_on: set[str] = field(default_factory=set)
    """Nodes whose NotReady episode was charged."""

    def saw(self, obs: Observed, now: datetime) -> None:
        for name, view in obs.nodes.items():
            if view.ready == "True":
                self.episodes = {e for e in self.episodes if e[0] != name}
        workers = obs.workers()
        for pod in workers:
            if pod.deleting and pod.disruption and pod.uid not in self.taken:
                self.taken.add(pod.uid)
                self.disruptions += 1
            elif pod.phase == "Failed" and not pod.deleting and pod.uid not in self.taken:
                self.taken.add(pod.uid)
                if not (pod.node and points_at_node(pod)):
                    self.restarts += 1
                elif pod.node not in self.killed_on:
                    self.killed_on.add(pod.node)
                    self.restarts += 1
        bad = sum(view.ready != "True" for view in obs.nodes.values())
        disrupted = bad > 0 and (bad == len(obs.nodes) or (bad > 2 and bad / len(obs.nodes) >= 0.55))
        lost: dict[str, list[PodView]] = {}
        for pod in workers:
            view = obs.nodes.get(pod.node)
            if pod.terminated or (view is not None and view.ready == "True"):
                continue
            if view is not None and disrupted:
                continue
            if view is not None and (now - view.since).total_seconds() < GRACE:
                continue
            if view is None and pod.created is not None and (now - pod.created).total_seconds() < GRACE:
                continue  # a pod younger than the grace on a missing Node: the watch may lag its Node
            lost.setdefault(pod.node, []).append(pod)
        for name, pods in lost.items():
            view = obs.nodes.get(name)
            episode = (name, view.since.isoformat() if view is not None else "gone")
            if episode not in self.episodes and any(p.uid not in self.taken for p in pods) and name not in self.down_on:
                self.down_on.add(name)
                self.restarts += 1
            self.episodes.add(episode)
            self.taken |= {p.uid for p in pods}


PASS_OUTCOMES = ("applied", "applied", "applied", "write-failed", "stale", "deletes-failed")
OPS = st.one_of(
    st.tuples(st.just("pass"), st.integers(0, 3), st.sampled_from(PASS_OUTCOMES)),
    st.tuples(st.just("crash"), st.integers(0, 1)),
    st.tuples(st.just("evict"), st.integers(0, 1)),
    st.tuples(st.just("node-down"), st.sampled_from(NODES)),
    st.tuples(st.just("node-up"), st.sampled_from(NODES)),
    st.tuples(st.just("node-delete"), st.sampled_from(NODES)),
    st.tuples(st.just("node-readd"), st.sampled_from(NODES)),
    st.tuples(st.just("deletions-progress")),
    st.tuples(st.just("pod-gc")),
    st.tuples(st.just("tick"), st.integers(1, 25)),
)


def run_ops(ops: list[tuple]) -> tuple[dict, Bookkeeper]:
    world = World()
    for slot in (0, 1):
        uid = f"uid-{next(world.uids)}"
        world.pods[uid] = Pod(uid, slot, NODES[slot], NOW - timedelta(minutes=5))
    status = {"phase": "Running", "startTime": "2026-11-21T11:50:00Z", "lastReconcileTime": "2026-11-21T11:59:55Z",
              "lastProgressTime": "2026-11-21T11:59:55Z", "step": 20}
    statuses = [status]
    keeper = Bookkeeper()
    world.snapshot()

    def do_pass(lag: int, outcome: str) -> None:
        nonlocal status
        obs = world.history[max(0, len(world.history) - 1 - lag)]
        based_on = statuses[-2] if outcome == "stale" and len(statuses) > 1 else status
        result = plan({**copy.deepcopy(JOB), "status": copy.deepcopy(based_on)}, obs, world.now)
        if outcome in ("write-failed", "stale"):
            return  # nothing was recorded, so nothing is deleted (the status goes out first)
        status = result.status
        statuses.append(status)
        keeper.saw(obs, world.now)
        for action in result.actions:
            if isinstance(action, CreateObject) and action.kind == "Pod" \
                    and action.manifest["metadata"]["labels"].get("llmtrain.io/role") == "worker":
                world.create(action.manifest)
            elif isinstance(action, DeletePod) and outcome != "deletes-failed" and action.name.startswith("tiny-elastic-worker"):
                world.delete(action)

    for op in ops:
        kind = op[0]
        if kind == "pass":
            do_pass(op[1], op[2])
        elif kind in ("crash", "evict"):
            pod = world.pod_in_slot(op[1])
            if pod is not None and pod.phase == "Running":
                if kind == "crash":
                    pod.phase = "Failed"
                else:
                    pod.deleting = pod.disruption = True
        elif kind == "node-down" and world.nodes[op[1]].exists and world.nodes[op[1]].ready:
            world.nodes[op[1]] = Node(ready=False, since=world.now)
        elif kind == "node-up" and world.nodes[op[1]].exists and not world.nodes[op[1]].ready:
            world.nodes[op[1]] = Node(ready=True, since=world.now)
        elif kind == "node-delete":
            world.nodes[op[1]].exists = False
        elif kind == "node-readd" and not world.nodes[op[1]].exists:
            world.nodes[op[1]] = Node(ready=True, since=world.now)
        elif kind == "deletions-progress":
            world.pods = {u: p for u, p in world.pods.items() if not p.deleting}
        elif kind == "pod-gc":  # the pod GC force-deletes pods bound to a deleted Node
            world.pods = {u: p for u, p in world.pods.items() if world.nodes[p.node].exists}
        elif kind == "tick":
            world.now += timedelta(seconds=op[1])
        world.snapshot()
    # Settle: every fault still visible is eventually seen by an up-to-date pass.
    for _ in range(4):
        world.now += timedelta(seconds=GRACE + 1)
        world.snapshot()
        do_pass(0, "applied")
        world.pods = {u: p for u, p in world.pods.items() if not p.deleting}
        world.snapshot()
    return status, keeper


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=5, max_size=40))
def test_each_distinct_failure_is_charged_exactly_once_whatever_the_interleaving(ops):
    status, keeper = run_ops(ops)
    assert status["restarts"] == keeper.restarts, (status.get("restartsByReason"), keeper)
    assert status["disruptions"] == keeper.disruptions
    assert sum(status.get("restartsByReason", {}).values()) == status["restarts"]


def test_most_nodes_notready_at_once_is_a_disruption_and_a_node_still_down_after_it_a_failure():
    # Hypothesis's find in CI (the model lacked the unhealthy-zone rule): three of the four
    # nodes NotReady at once keep their pods; the crash is the only charge.
    ops = [("crash", 0), ("crash", 0), ("node-down", "node-1"), ("node-down", "node-2"), ("node-down", "node-3")]
    status, keeper = run_ops(ops)
    assert status["restartsByReason"] == {"Signal9": 1} and keeper.restarts == 1
    assert any(c["type"] == "NodesDisrupted" and c["status"] == "True" for c in status["conditions"]), status["conditions"]
    # One node back: two of four NotReady is no disruption, and the node holding the
    # other pod is a node failure (the crashed pod was charged already).
    status, keeper = run_ops([*ops, ("tick", 5), ("node-up", "node-3")])
    assert status["restartsByReason"] == {"Signal9": 1, "NodeFailure": 1} and keeper.restarts == 2, status["restartsByReason"]


def test_a_node_failure_seen_again_while_its_pods_are_deleting_is_charged_once():
    # The sequence from the CI failure: the first pass charges the node failure before the
    # force-deletes are observed, a second pass sees the pods deleting, a third sees them
    # gone and the replacement elsewhere.
    ops = [("tick", 5), ("node-down", "node-2"), ("tick", GRACE + 1), ("pass", 0, "applied"),
           ("pass", 1, "applied"), ("pass", 1, "deletes-failed"), ("pass", 0, "applied"), ("deletions-progress",),
           ("pass", 0, "applied")]
    status, keeper = run_ops(ops)
    assert status["restartsByReason"] == {"NodeFailure": 1} and keeper.restarts == 1


def test_a_deleted_node_object_is_one_node_failure():
    # `kubectl delete node` under a worker: the pod points at a Node that no longer exists.
    ops = [("node-delete", "node-2"), ("pass", 0, "applied"), ("pass", 0, "applied"), ("pod-gc",),
           ("pass", 1, "applied"), ("pass", 0, "applied")]
    status, _ = run_ops(ops)
    assert status["restartsByReason"] == {"NodeFailure": 1}


def test_a_node_that_heals_and_fails_again_with_new_pods_is_a_second_failure():
    ops = [("node-down", "node-2"), ("tick", GRACE + 1), ("pass", 0, "applied"), ("deletions-progress",),
           ("node-up", "node-2"), ("pass", 0, "applied"), ("tick", 40), ("pass", 0, "applied"),
           ("node-down", "node-1"), ("node-down", "node-3"), ("tick", GRACE + 1), ("pass", 0, "applied")]
    status, keeper = run_ops(ops)
    assert status["restartsByReason"]["NodeFailure"] == keeper.restarts >= 2


def test_the_bookkeeper_is_not_vacuous():
    # A stale pass must not double count: replanning from the status before the charge
    # would charge again if its write were accepted.
    ops = [("crash", 0), ("pass", 0, "applied"), ("pass", 0, "stale"), ("pass", 0, "applied")]
    status, keeper = run_ops(ops)
    assert status["restarts"] == keeper.restarts == 1
    replay = plan({**copy.deepcopy(JOB), "status": {"phase": "Running"}},
                  replace(World().observe(), pods=(PodView(name="tiny-elastic-worker-0", role="worker", slot=0, generation=0,
                                                           phase="Failed", uid="uid-1", node="node-1", exit_code=137),)), NOW)
    assert replay.status["restarts"] == 1  # the same pod seen by a status without its key is charged
