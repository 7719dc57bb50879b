"""``llmtrain status``: a job's status as a person reads it — what happened, what it is
doing now, what to do — from the object the operator writes (or a local run's
``status.json``). Pure: the CLI (cli.py) reads the object and prints these lines."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .api.observed import parse_time
from .api.vocabulary import ConditionType, Phase

TROUBLE = (ConditionType.INVALID, ConditionType.UNSCHEDULABLE, ConditionType.REPLICA_FAILURE, ConditionType.CHECKPOINTS_DEGRADED,
           ConditionType.STRAGGLER, ConditionType.NODES_DISRUPTED, ConditionType.DEGRADED)
"""Conditions that, True, the reader must see with their message."""


def _ago(stamp: str | None, now: datetime) -> str:
    when = parse_time(stamp)
    if when is None:
        return ""
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f" {seconds // size}{unit} ago"
    return f" {seconds}s ago"


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    found = [c for c in status.get("conditions") or [] if c.get("type") == type_]
    return found[0] if found and found[0].get("status") == "True" else None


def render(job: dict[str, Any], now: datetime) -> list[str]:
    """The lines to print for ``job`` (``metadata``, ``spec`` when known, ``status``)."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    name = meta.get("name", "?") + (f" ({meta['namespace']})" if meta.get("namespace") else "")
    phase = status.get("phase") or Phase.PENDING
    head = f"{name}: {phase}, step {status.get('progress') or status.get('step', 0)}"
    if status.get("eta"):
        head += f", about {status['eta']} left"
    lines = [head]
    now_line = [f"world size {status.get('worldSize', 0)}", f"workers {status.get('workers', '0/0')} ready"]
    if isinstance(status.get("loss"), (int, float)):
        now_line.append(f"loss {status['loss']:.4f}")
    if isinstance(status.get("tokensPerSecond"), (int, float)):
        now_line.append(f"{status['tokensPerSecond']:,.0f} tokens/s")
    lines.append("  now:          " + ", ".join(now_line))
    budget = ((spec.get("faultTolerance") or {}).get("maxRestarts"))
    reasons = ", ".join(f"{k} {v}" for k, v in sorted((status.get("restartsByReason") or {}).items()))
    lines.append(f"  restarts:     {status.get('restarts', 0)}" + (f" of {budget}" if budget is not None else "")
                 + (f" ({reasons})" if reasons else "") + f"; disruptions {status.get('disruptions', 0)}"
                 + (f"; healed in process {status['heals']}" if status.get("heals") else ""))
    failure = status.get("lastFailure")
    if failure:
        where = ", ".join(f"{k} {failure[k]}" for k in ("pod", "node") if failure.get(k))
        lines.append(f"  last failure: {failure.get('kind')} / {failure.get('reason')}" + (f" ({where})" if where else "")
                     + _ago(failure.get("time"), now) + (f": {failure['message']}" if failure.get("message") else ""))
    kept = [p for p in status.get("keptPods") or [] if isinstance(p, str)]
    if kept:
        lines.append(f"  failed pods:  {', '.join(kept)} (kept with their logs: llmtrain logs JOB --failed [N])")
    ckpt = (status.get("lastCheckpoint") or {}).get("summary")
    tiers = []
    for tier in status.get("checkpointTiers") or []:
        state = "ok" if tier.get("healthy", True) else f"DEGRADED ({tier.get('reason') or 'error'}: {tier.get('message') or ''})"
        tiers.append(f"{tier.get('name')} {state}" + (f", step {tier['lastStep']}" if tier.get("lastStep") is not None else ""))
    lines.append(f"  checkpoints:  newest {ckpt or 'none yet'}" + (f"; tiers: {'; '.join(tiers)}" if tiers else ""))
    if status.get("goodput") is not None and status.get("ettr") is not None:
        lines.append(f"  time:         goodput {status['goodput']:.1%}, ETTR {status['ettr']:.1%} "
                     f"of {status.get('activeSeconds', 0):.0f}s active")
    for type_ in TROUBLE:
        found = _condition(status, type_)
        if found:
            lines.append(f"  {type_}: {found.get('reason')}: {found.get('message')}")
    fits = [c for c in status.get("conditions") or [] if c.get("type") == ConditionType.GPU_MEMORY_FITS and c.get("status") == "False"]
    if fits:
        lines.append(f"  {ConditionType.GPU_MEMORY_FITS} False: {fits[0].get('reason')}: {fits[0].get('message')}")
    lines.append("what to do:   " + advice(status, ckpt))
    return lines


def advice(status: dict[str, Any], checkpoint: str | None) -> str:
    """One sentence: the first thing a person should do, from the phase and conditions."""
    phase = status.get("phase") or Phase.PENDING
    resume = f"it resumes from {checkpoint}" if checkpoint else "no checkpoint was committed: it starts from step 0"
    if phase == Phase.FAILED:
        failed = _condition(status, ConditionType.FAILED) or {}
        return (f"it failed ({failed.get('reason', 'Failed')}: {failed.get('message', '')}); fix the cause "
                f"(docs/runbooks.md#llmtrainjobfailed) and create it again: {resume}")
    if phase == Phase.INVALID or _condition(status, ConditionType.INVALID):
        return "fix the spec as the Invalid condition says (kubectl edit); nothing runs until then"
    if phase == Phase.SUCCEEDED:
        return (f"nothing: it finished. Its weights: llmtrain checkpoints export (newest {checkpoint})" if checkpoint
                else "nothing: it finished")
    if _condition(status, ConditionType.UNSCHEDULABLE):
        return "give its pods somewhere to run (capacity, taints, affinity): the scheduler's words are above"
    if _condition(status, ConditionType.REPLICA_FAILURE):
        return "the API server refuses its pods (quota, admission): the ReplicaFailure condition above names why"
    if _condition(status, ConditionType.CHECKPOINTS_DEGRADED):
        return "a checkpoint tier fails (above); training goes on with the others (docs/runbooks.md#llmtraincheckpointtierdegraded)"
    if phase == Phase.SUSPENDED:
        return "it is suspended: set spec.suspend to false to run it"
    if phase in (Phase.PENDING, Phase.CREATED):
        return "wait: its pods are starting"
    if phase == Phase.RESTARTING:
        return "wait: it is recovering from the failure above"
    return "nothing: it is training"
