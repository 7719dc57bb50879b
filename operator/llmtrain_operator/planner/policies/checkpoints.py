"""Checkpoints from the trainers' metrics: each tier's health (the ``CheckpointsDegraded``
condition; Events when a tier degrades or recovers), the interval in force and, with
``intervalSteps: auto``, the failure history the trainers choose it from (rendered into
the job's ConfigMap by the children policy, which runs after this one)."""

from __future__ import annotations

from collections import Counter

from llmtrain_contract.names import TIER_REASONS, Termination

from ...api.spec import AUTO
from ...api.status import CadenceHistory, CheckpointCadence, TierHealth, TierName
from ...api.vocabulary import ConditionType, Reason
from ..context import Pass, Verdict
from ..decisions import IntervalChanged, TierDegraded, TierRecovered
from ..newest_checkpoint import note


MAX_LISTED = 32
"""Pods a degraded tier names (``pods``, its message); the message counts the rest. A
tier that fails on every node of a 1,024-node job would otherwise write every name twice."""

def handle(ctx: Pass) -> Verdict:
    if not ctx.spec.checkpoint.enabled:
        ctx.status.checkpoint_tiers, ctx.status.checkpoint_cadence = [], None
        return Verdict.CONTINUE
    _tiers(ctx)
    _cadence(ctx)
    return Verdict.CONTINUE


def configured_tiers(ctx: Pass) -> list[TierName]:
    ckpt = ctx.spec.checkpoint
    tiers: list[TierName] = ["local"]
    if ckpt.shared is not None:
        tiers.append("shared")
    if ckpt.s3 is not None:
        tiers.append("s3")
    return tiers


def _tiers(ctx: Pass) -> None:
    status, probes = ctx.status, ctx.observed.probes
    previous = {t.name: t for t in status.checkpoint_tiers}
    # A pod that ended reports its last commits in its termination message (the final
    # checkpoint is committed after the last scrape a probe could see).
    ended = [p.termination.get(Termination.CHECKPOINTS) for p in ctx.observed.workers()]
    tiers = []
    for name in configured_tiers(ctx):
        before = previous.get(name)
        steps = [p.last_checkpoint[name] for p in probes.values() if name in p.last_checkpoint]
        steps += [c[name] for c in ended if isinstance(c, dict) and isinstance(c.get(name), int)]
        last = max(steps + ([before.last_step] if before and before.last_step is not None else []), default=None)
        if not probes:  # nobody reports now (starting, suspended, finished): keep what was known
            tiers.append(before.model_copy(update={"last_step": last}) if before else TierHealth(name=name, last_step=last))
            continue
        degraded = sorted((pod, p.tier_degraded[name]) for pod, p in probes.items() if name in p.tier_degraded)
        if not degraded:
            if before is not None and not before.healthy:
                ctx.decide(TierRecovered(name, last))
            tiers.append(TierHealth(name=name, last_step=last))
            continue
        reason = Counter(r for _, r in degraded).most_common(1)[0][0]
        pods = [pod for pod, _ in degraded][:MAX_LISTED]
        more = f" and {len(degraded) - len(pods)} more" if len(degraded) > len(pods) else ""
        message = (f"{name} tier: {TIER_REASONS.get(reason, TIER_REASONS['Error'])} (reported by {', '.join(pods)}{more}); "
                   "training goes on and the tier catches up once it works")
        same = before is not None and not before.healthy and before.reason == reason
        tiers.append(TierHealth(name=name, healthy=False, reason=reason, message=message, pods=pods,
                                since=before.since if same and before else ctx.stamp, last_step=last))
        if not same:
            ctx.decide(TierDegraded(name, reason, message))
    status.checkpoint_tiers = tiers
    for tier in tiers:
        if tier.last_step is not None:
            note(ctx, tier.last_step, tier.name)
    bad = [t for t in tiers if not t.healthy]
    if bad:
        ctx.condition(ConditionType.CHECKPOINTS_DEGRADED, True, bad[0].name.capitalize() + (bad[0].reason or "Error"),
                      "; ".join(t.message or "" for t in bad))
    else:
        ctx.condition(ConditionType.CHECKPOINTS_DEGRADED, False, Reason.TIERS_HEALTHY, "")


def _cadence(ctx: Pass) -> None:
    ckpt, status = ctx.spec.checkpoint, ctx.status
    auto = ckpt.interval_steps == AUTO
    cadence = status.checkpoint_cadence or CheckpointCadence()
    cadence.mode = "auto" if auto else "fixed"
    probes = list(ctx.observed.probes.values())
    reported = [p.interval_steps for p in probes if p.interval_steps]
    if reported:
        # Global rank 0 proposes the interval and alone reports its inputs: its one scrape
        # gives an interval and the inputs it was chosen from. Without it (rank 0 has not
        # chosen yet), the largest reported: the ranks agree on one, a pod still starting
        # may lag.
        chooser = next((p for p in probes if p.interval_steps and p.cost_seconds is not None
                        and p.mtbf_seconds is not None), None)
        new = chooser.interval_steps if chooser is not None and chooser.interval_steps else max(reported)
        cost, latency, mtbf, step = ((chooser.cost_seconds, chooser.latency_seconds, chooser.mtbf_seconds, chooser.step_seconds)
                                     if chooser is not None else (None, None, None, None))
        if auto and cadence.interval_steps is not None and new != cadence.interval_steps:
            why = f": sqrt(2 x cost {cost:.3g}s x MTBF {mtbf:.0f}s)" if cost is not None and mtbf is not None else ""
            why += f" at {step:.2f}s a step" if why and step is not None else ""
            why += f", a write taking {latency:.2f}s" if why and latency is not None else ""
            ctx.decide(IntervalChanged(cadence.interval_steps, new, why))
        cadence.interval_steps = new
        # As reported now: a trainer that just restarted has not measured a cost yet.
        # Significant digits, not decimals: a checkpoint of a small model can cost well
        # under a millisecond of training, and 0.0 would hide the input of the interval.
        cadence.cost_seconds = float(f"{cost:.4g}") if cost is not None else None
        cadence.latency_seconds = float(f"{latency:.4g}") if latency is not None else None
        cadence.mtbf_seconds = round(mtbf, 1) if mtbf is not None else None
        cadence.step_seconds = round(step, 3) if step is not None else None
    elif cadence.interval_steps is None and not auto:
        cadence.interval_steps = int(ckpt.interval_steps)
    if auto:
        failures = status.restarts + status.disruptions
        if cadence.history is None or cadence.history.failures != failures:
            cadence.history = CadenceHistory(failures=failures, active_seconds=round(status.active_seconds, 1),
                                             time=round(ctx.now.timestamp(), 3))
    else:
        cadence.history = None
    status.checkpoint_cadence = cadence
