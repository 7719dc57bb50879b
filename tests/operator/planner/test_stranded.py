"""A deleted job's pods stuck Terminating on a dead node are force-deleted
(``planner/stranded.py``), and only those."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from llmtrain_operator.api.observed import NodeView
from llmtrain_operator.planner.stranded import STRANDED_GRACE_SECONDS, stranded
from support.planning import NOW, worker


def deleting(slot: int, node: str) -> object:
    return dataclasses.replace(worker(slot, node=node), deleting=True)


def test_only_terminating_pods_on_nodes_dead_past_the_grace_or_gone_are_taken():
    nodes = {
        "dead": NodeView("dead", "Unknown", NOW - timedelta(seconds=STRANDED_GRACE_SECONDS + 1)),
        "just-died": NodeView("just-died", "False", NOW - timedelta(seconds=2)),
        "alive": NodeView("alive", "True", NOW - timedelta(hours=1)),
    }
    pods = [deleting(0, "dead"), deleting(1, "just-died"), deleting(2, "alive"), deleting(3, "vanished"),
            worker(4, node="dead")]  # not being deleted: not this sweep's business
    assert [p.slot for p in stranded(pods, nodes, NOW)] == [0, 3]
    later = NOW + timedelta(seconds=STRANDED_GRACE_SECONDS)
    assert [p.slot for p in stranded(pods, nodes, later)] == [0, 1, 3]


def test_a_pod_never_scheduled_is_left_to_the_garbage_collector():
    pod = dataclasses.replace(deleting(0, "x"), node=None)
    assert stranded([pod], {}, NOW) == []
