"""The restart budget: charging it, starting the backoff before replacements, and RestartAll."""

from __future__ import annotations

from collections.abc import Iterable

from ..api.vocabulary import Reason
from . import backoff
from .context import Pass
from .decisions import RestartCharged
from .outcome import finish, retire


MAX_REASONS = 64
"""Reasons ``restartsByReason`` (and the operator's restart counter's ``reason`` label)
names apart; more are counted as ``OTHER``. The classifier's own are fewer; a pod's
status can name any reason of the kubelet's (``OutOfcpu``, ``NodeShutdown`` ...)."""
MAX_REASON_LENGTH = 64
OTHER = "Other"


def reason_key(counts: dict[str, int], reason: str) -> str:
    """The key a restart of ``reason`` is counted under."""
    reason = reason[:MAX_REASON_LENGTH]
    return reason if reason in counts or len(counts) < MAX_REASONS - 1 else OTHER


def charge_budget(ctx: Pass, reason: str, enforce: bool = True) -> bool:
    """Add one restart to the never-reset counters; on exceeding the budget, fail the job
    with BackoffLimitExceeded and return False. ``enforce=False``: a restart learnt only
    once its pod had succeeded is counted, but cannot fail what has finished."""
    status = ctx.status
    status.restarts += 1
    key = reason_key(status.restarts_by_reason, reason)
    status.restarts_by_reason[key] = status.restarts_by_reason.get(key, 0) + 1
    budget = ctx.spec.fault_tolerance.max_restarts
    ctx.decide(RestartCharged(key, status.restarts, budget))
    if status.restarts > budget and enforce:
        finish(ctx, False, Reason.BACKOFF_LIMIT_EXCEEDED,
               f"{status.restarts} restarts exceed faultTolerance.maxRestarts={budget}; last: {reason}")
        return False
    return True


def count_restart(ctx: Pass, reason: str, slots: Iterable[int | None] = (None,)) -> bool:
    """Charge one restart and start the backoff before the replacements of ``slots`` (the
    failed pods'; None, or a job restarting every pod: all of them, ``backoff.py``).
    Returns False (the job failed) when the budget is exhausted."""
    if not charge_budget(ctx, reason):
        return False
    every = ctx.spec.fault_tolerance.restart_policy == "RestartAll"
    backoff.start(ctx, [backoff.JOB_WIDE if every else backoff.key(s) for s in slots])
    return True


def restart_all(ctx: Pass, message: str) -> None:
    """RestartAll: bump the generation; pods of older generations are replaced."""
    ctx.status.restart_generation += 1
    ctx.event(Reason.RESTART_ALL, f"{message}; restarting every worker (generation {ctx.status.restart_generation})", warning=True)
    for pod in ctx.observed.workers():
        if not pod.deleting:
            retire(ctx, pod)  # the failed one kept for its log, the others deleted
