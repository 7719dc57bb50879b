"""A job's status and ConfigMap stay far below etcd's object limit at the largest job the
API allows (``replicas.max`` 1,024 workers): the worst case computed from every bound the
operator keeps, and a 1,024-worker job whose every pod reports the most it can.

etcd refuses a write over 1.5 MiB (``--max-request-bytes``), and the whole object (spec,
metadata, managedFields, status) is one value; a status write refused for size would
leave the job's decisions unrecorded."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, get_args, get_origin

from llmtrain_operator.api import parse_job
from llmtrain_operator.api.observed import TrainerProbe, format_time
from llmtrain_operator.api.spec import MAX_NODES, FaultToleranceSpec, LLMTrainJobSpec
from llmtrain_operator.api.status import (CheckpointRecord, attempts_text, Condition, FailureRecord, Internal, LLMTrainJobStatus,
                                          NumericsStatus, QuarantinedNode, RankHolder, SkippedWindow, SlotBackoff, TierHealth)
from llmtrain_operator.api.untrusted import MAX_COUNT
from llmtrain_operator.api.vocabulary import ConditionType, FailureKind, Reason
from llmtrain_operator.planner import plan
from llmtrain_operator.planner.budget import MAX_REASON_LENGTH, MAX_REASONS, reason_key
from llmtrain_operator.planner.backoff import JOB_WIDE, MAX_SLOTS
from llmtrain_operator.planner.accounting import MAX_CHARGED, MAX_FAILURE_MESSAGE, MAX_SEEN
from llmtrain_operator.planner.conditions import MAX_MESSAGE, set_condition
from llmtrain_operator.planner.manifests import config_map
from llmtrain_operator.planner.node_history import MAX_KEPT, MAX_KEYS
from llmtrain_operator.planner.policies import numerics
from llmtrain_operator.planner.policies.checkpoints import MAX_LISTED
from llmtrain_operator.planner.policies.in_place import CHARGED_CAUSES
from llmtrain_operator.planner.quarantine import MAX_QUARANTINED
from support.planning import NOW, job, node, observed, running_status, worker

ETCD_LIMIT = 1.5 * (1 << 20)
STATUS_BUDGET = ETCD_LIMIT / 2
"""The status's share, with the managedFields entries that name its map keys again (the
API server itemizes a map's keys there, ``f:<key>``): the spec (a pod template, a
DeepSpeed config) and the rest of the metadata take the other half."""

NODE = "n" * 253  # a DNS subdomain's longest
POD_TEXT = "<"
"""A character of what a pod said at its costliest: the API server's JSON writes ``<``,
``>`` and ``&`` as six bytes (``\u003c``)."""
POD = "p" * 63
UID = "0" * 36
STAMP = format_time(NOW)
LONGEST_REASON = max((r.value for r in Reason), key=len)
LARGEST_RANK = MAX_NODES * LLMTrainJobSpec.model_fields["procs_per_node"].metadata[1].le - 1
"""A page's rank past the job's largest world is not shown (``policies/progress.py``)."""
KEEP_FAILED_PODS_MAX = FaultToleranceSpec.model_fields["keep_failed_pods"].metadata[1].le
REASONS = [f"{'R' * (MAX_REASON_LENGTH - 2)}{i:02}" for i in range(MAX_REASONS)]
"""``restartsByReason``'s keys at their most (``budget.reason_key``)."""


def worst_status() -> LLMTrainJobStatus:
    """Every list and map of the status at the bound the operator keeps, every string at
    its longest."""
    causes = [*CHARGED_CAUSES, "oom"]
    pods = MAX_NODES + KEEP_FAILED_PODS_MAX  # live workers and kept ones
    return LLMTrainJobStatus(
        # The Failed condition quotes what a pod said; the others are the planner's words,
        # names and the scheduler's.
        conditions=[Condition(type=t, status="False", reason=LONGEST_REASON,
                              message=(POD_TEXT if t == ConditionType.FAILED else "m") * MAX_MESSAGE,
                              last_transition_time=STAMP, observed_generation=MAX_COUNT) for t in ConditionType],
        ranks=[RankHolder(pod=POD, first=LARGEST_RANK, last=LARGEST_RANK) for _ in range(MAX_NODES)],
        restarts_by_reason={r: MAX_COUNT for r in REASONS}, heals=MAX_COUNT,
        kept_pods=[POD] * KEEP_FAILED_PODS_MAX,
        checkpoint_tiers=[TierHealth(name=t, healthy=False, reason="PermissionDenied", message="m" * MAX_MESSAGE,
                                     pods=[POD] * MAX_LISTED, since=STAMP, last_step=MAX_COUNT) for t in ("local", "shared", "s3")],
        quarantined_nodes=[QuarantinedNode(node=NODE, until=STAMP)] * MAX_QUARANTINED,
        numerics=NumericsStatus(rollbacks=MAX_COUNT, skipped=[SkippedWindow(first_step=MAX_COUNT, last_step=MAX_COUNT,
                                                                            first_sample=MAX_COUNT, end_sample=MAX_COUNT)]
                                * numerics.MAX_WINDOWS),
        last_failure=FailureRecord(kind=FailureKind.PROCESS_CRASH, reason=LONGEST_REASON, pod=POD, node=NODE,
                                   exit_code=255, message=POD_TEXT * MAX_FAILURE_MESSAGE, time=STAMP, detect_seconds=1e9),
        last_checkpoint=CheckpointRecord(step=MAX_COUNT, tier="shared", time=STAMP, summary=f"{MAX_COUNT}@shared"),
        internal=Internal(
            charged_failures=[f"node:{NODE}@{STAMP}"] * MAX_CHARGED,
            attempts_seen={f"pod:{UID[:-4]}{i:04}": attempts_text({c: MAX_COUNT for c in causes}) for i in range(pods)},
            stragglers_seen=[f"pod:{UID}/{MAX_COUNT}"] * MAX_SEEN,
            unschedulable_seen=[f"pod:{UID}"] * MAX_SEEN,
            values_rejected=[f"pod:{UID}/{'f' * 40}"] * MAX_SEEN,
            node_failures={f"charged:notready:{NODE}{i}": [STAMP] * MAX_KEPT for i in range(MAX_KEYS)},
            backoff={str(MAX_NODES - 1 - i) if i else JOB_WIDE: SlotBackoff(failures=MAX_COUNT, until=STAMP)
                     for i in range(MAX_SLOTS + 1)},
        ),
    )


BOUNDED = {"conditions", "ranks", "restartsByReason", "keptPods", "checkpointTiers", "checkpointTiers.pods",
           "quarantinedNodes", "numerics.skipped", "internal.chargedFailures", "internal.attemptsSeen",
           "internal.stragglersSeen", "internal.unschedulableSeen", "internal.valuesRejected", "internal.nodeFailures",
           "internal.nodeFailures.*", "internal.backoff"}
"""Every list and map of the status, each filled to its bound above."""


def _containers(model: type, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        path = prefix + (info.alias or name)
        out |= _walk(info.annotation, path)
    return out


def _walk(annotation: Any, path: str) -> set[str]:
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_walk(a, path) for a in get_args(annotation)))
    if origin in (list, tuple, set, frozenset):
        return {path} | set().union(*(_walk(a, path) for a in get_args(annotation)))
    if origin is dict:
        return {path} | _walk(get_args(annotation)[1], path + ".*")
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return _containers(annotation, path + ".")
    return set()


def _size(status: dict[str, Any]) -> int:
    """Bytes of the JSON the API server stores (Go's encoder escapes ``<``, ``>``, ``&``)."""
    text = json.dumps(status, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode()) + 5 * sum(text.count(c) for c in "<>&")


def _managed_keys(value: Any, in_map: bool = False) -> int:
    """Bytes the managedFields entry of a status write adds for every key below the top
    level (a map's keys and a nested object's fields, ``f:<key>``); the top-level fields,
    a few hundred bytes, are left out."""
    if isinstance(value, dict):
        return sum(len(f'"f:{k}":{{}},') * in_map + _managed_keys(v, True) for k, v in value.items())
    return 0


def _stored(status: dict[str, Any]) -> int:
    return _size(status) + _managed_keys(status)


def test_every_list_and_map_of_the_status_has_its_bound_here():
    assert _containers(LLMTrainJobStatus) == BOUNDED


def test_the_worst_case_status_is_half_of_etcds_limit_at_most():
    worst = worst_status().model_dump(mode="json", by_alias=True, exclude_none=True)
    size = _stored(worst)
    assert size < STATUS_BUDGET, f"{size} bytes"
    print(f"worst-case status at {MAX_NODES} workers: {size} bytes ({size / ETCD_LIMIT:.1%} of etcd's limit)")


def _hostile_probe(slot: int) -> TrainerProbe:
    """The most a worker's page can claim: thousands of skipped windows, every tier
    degraded, a straggler per rank."""
    return TrainerProbe(step=100, world_size=MAX_NODES, rank=slot, last_checkpoint={"local": 90, "shared": 80},
                        tier_degraded={"local": "NoSpace", "shared": "IOError"}, rollbacks=5,
                        skipped=tuple((slot * 10_000 + i, slot * 10_000 + i, i, i + 1) for i in range(300)),
                        stragglers={slot: 9.0})


def test_a_1024_worker_job_whose_every_pod_reports_the_most_it_can_keeps_a_bounded_status():
    spec = {"spec.replicas": {"min": MAX_NODES, "max": MAX_NODES}, "spec.trainer.builtin.globalBatchSize": 2 * MAX_NODES,
            "spec.checkpoint": {"enabled": True, "shared": {"claimName": "ckpt"}}}
    raw = job(spec, status=running_status())
    workers = [worker(i, node=f"{NODE[:240]}-{i}", uid=f"{UID}-{i}") for i in range(MAX_NODES)]
    nodes = [node(w.node or "") for w in workers]
    probes = {w.name: _hostile_probe(i) for i, w in enumerate(workers)}
    probes[workers[-1].name] = dataclasses.replace(probes[workers[-1].name], rank=MAX_COUNT - 1, world_size=MAX_COUNT)
    result = plan(raw, observed(raw, workers, nodes=nodes, probes=probes), NOW)
    status = result.status
    assert _stored(status) < STATUS_BUDGET, _stored(status)
    assert len(status["numerics"]["skipped"]) == numerics.MAX_WINDOWS
    tiers = {t["name"]: t for t in status["checkpointTiers"]}
    assert len(tiers["local"]["pods"]) == MAX_LISTED and f"and {MAX_NODES - MAX_LISTED} more" in tiers["local"]["message"]
    assert all(len(c["message"]) <= MAX_MESSAGE for c in status["conditions"])
    assert len(status["ranks"]) == MAX_NODES - 1  # the page claiming a rank past the job's largest world is not shown
    assert max(r["last"] for r in status["ranks"]) < MAX_NODES
    rolled_back = [e for e in result.events if e.reason == Reason.ROLLED_BACK]
    assert len(rolled_back) == numerics.MAX_EVENTS + 1 and "more skipped windows" in rolled_back[-1].message


def test_the_configmap_does_not_grow_with_the_workers():
    def size(replicas: int) -> int:
        raw = job({"spec.replicas": {"min": replicas, "max": replicas}, "spec.trainer.builtin.globalBatchSize": 2 * MAX_NODES})
        return _size(config_map(parse_job(raw)) or {})

    assert size(MAX_NODES) - size(1) < 16
    assert size(MAX_NODES) < 64 * 1024


def test_a_long_condition_message_is_cut_saying_how_much():
    conditions: list[Condition] = []
    set_condition(conditions, ConditionType.FAILED, True, "Crash", "x" * 100_000, STAMP, 1)
    message = conditions[0].message
    kept = message.index(" ... (")
    assert len(message) <= MAX_MESSAGE and message[:kept] == "x" * kept and kept > MAX_MESSAGE - 40
    assert message.endswith(f" ... ({100_000 - kept} more characters)")
    set_condition(conditions, ConditionType.FAILED, True, "Crash", "y" * MAX_MESSAGE, STAMP, 1)
    assert conditions[0].message == "y" * MAX_MESSAGE


def test_restart_reasons_beyond_the_bound_are_counted_together():
    counts: dict[str, int] = {}
    for i in range(3 * MAX_REASONS):
        key = reason_key(counts, f"KubeletReason{i}" + "x" * 100)
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == MAX_REASONS and counts["Other"] == 3 * MAX_REASONS - (MAX_REASONS - 1)
    assert all(len(k) <= MAX_REASON_LENGTH for k in counts)
    assert reason_key(counts, "KubeletReason0" + "x" * 100) in counts  # a known one keeps its own count


def test_once_the_skipped_windows_are_full_an_older_one_is_taken_as_seen():
    full = [{"firstStep": i, "lastStep": i, "firstSample": 100 + i, "endSample": 101 + i} for i in range(numerics.MAX_WINDOWS)]
    raw = job(status=running_status(numerics={"rollbacks": numerics.MAX_WINDOWS, "skipped": full}))
    older = TrainerProbe(step=20, rollbacks=numerics.MAX_WINDOWS, skipped=((1, 1, 5, 6),))
    result = plan(raw, observed(raw, [worker(0), worker(1)], probes={"tiny-elastic-worker-0": older}), NOW)
    assert result.status["numerics"]["skipped"] == full
    assert "RolledBack" not in [e.reason for e in result.events]
    newer = TrainerProbe(step=20, rollbacks=numerics.MAX_WINDOWS + 1, skipped=((900, 900, 9000, 9001),))
    result = plan(raw, observed(raw, [worker(0), worker(1)], probes={"tiny-elastic-worker-0": newer}), NOW)
    skipped = result.status["numerics"]["skipped"]
    assert skipped[-1]["firstSample"] == 9000 and len(skipped) == numerics.MAX_WINDOWS
    assert [e.reason for e in result.events].count("RolledBack") == 1
