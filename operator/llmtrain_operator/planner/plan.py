"""``plan(job, observed, now) -> Plan``: the operator's every decision, as a pure
function. Table-tested in tests/operator/planner/test_planner.py; used by the kopf handlers and by the
local runner alike.

A pass runs the policies in order; each returns a ``Verdict``, and anything but
CONTINUE ends the pass (the job finished, is suspended, or waits on a missing object).
Two policies decide something later ones act on, and hand it on as a value: the queue's
``Admission`` (suspension and the pods' placement) and the gang's ``GangGate`` (whether
worker pods may be created now).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..api.job import Received, receive
from ..api.observed import Observed
from ..api.vocabulary import Reason
from .context import Action, DeletePod, Ledger, Pass, Plan, Verdict
from ..settings import DEFAULT_NODE_FAILURE_CONDITIONS, DEFAULT_RUNTIME_IMAGE
from .policies import (
    checkpoints,
    children,
    completion,
    deadline,
    frozen_pods,
    gang,
    in_place,
    kept,
    memory,
    node_health,
    node_failures,
    numerics,
    pod_failures,
    pod_values,
    progress,
    queueing,
    scheduling,
    stragglers,
    summary,
    suspension,
    terminal,
    validity,
    wedge,
)
from .isolation import Isolation
from .podpolicy import STRICT, PodPolicy
from .names import worker_selector
from .timekeeping import account_time

Policy = Callable[[Pass], Verdict]

FIRST: tuple[Policy, ...] = (
    kept.handle,           # failed pods kept for their logs: listed; the oldest beyond the limit deleted
    terminal.handle,       # a finished job: only stragglers and the TTL
    validity.handle,       # a missing Secret/PVC blocks; a fixed spec clears Invalid
)
FAILURES: tuple[Policy, ...] = (
    deadline.handle,
    pod_values.handle,     # values from pods that were ignored: reported once each
    progress.handle,       # step, world size, newest checkpoint, end of a recovery
    numerics.handle,       # rollbacks for bad numerics and the samples they skipped
    checkpoints.handle,    # tier health, the interval in force, the failure history for auto
                           # (before completion: a finished job's final commits count too)
    in_place.handle,       # before completion: a restart in place learnt only from the
                           # pods' ends (their termination messages) still counts
    completion.handle,
    pod_failures.handle,
    frozen_pods.handle,    # a pod its peers' ranks wait on that answers nothing: replaced as a hang
    node_health.handle,    # a node a health agent reports sick: drained before a rank fails there
    node_failures.handle,
    stragglers.handle,     # report (or replace) a rank that stays slower than the others
    scheduling.handle,     # pods the scheduler cannot place: its words on the job, not charged
    memory.handle,         # the memory plan against the largest GPU the job can land on (advice)
)
LAST: tuple[Policy, ...] = (
    summary.handle,        # counts, phase, conditions
    wedge.handle,          # the backstop: no progress for progressTimeoutSeconds
)


def _policies(ctx: Pass) -> None:
    """Every policy in order, until one ends the pass."""
    if not _each(ctx, FIRST):
        return
    admission = queueing.handle(ctx)  # a Kueue-queued job runs while its Workload is admitted
    if suspension.handle(ctx, admission) is not Verdict.CONTINUE or not _each(ctx, FAILURES):
        return
    gate = gang.handle(ctx)  # the PodGroup a gang's worker pods wait for
    # Create what is missing, after the failures were handled.
    if children.handle(ctx, admission, gate) is not Verdict.CONTINUE:
        return
    _each(ctx, LAST)


def _each(ctx: Pass, policies: tuple[Policy, ...]) -> bool:
    """Whether the pass goes on after ``policies``."""
    return all(policy(ctx) is Verdict.CONTINUE for policy in policies)


def plan(raw: dict[str, Any], observed: Observed, now: datetime, runtime_image: str = DEFAULT_RUNTIME_IMAGE,
         pod_policy: PodPolicy = STRICT, node_failure_conditions: frozenset[str] = DEFAULT_NODE_FAILURE_CONDITIONS,
         isolation: Isolation | None = None, token_key: bytes | None = None) -> Plan:
    """A raw job object (a file, a test) read with ``receive``, then ``plan_received``."""
    return plan_received(receive(raw), observed, now, runtime_image, pod_policy, node_failure_conditions, isolation, token_key)


def plan_received(received: Received, observed: Observed, now: datetime, runtime_image: str = DEFAULT_RUNTIME_IMAGE,
                  pod_policy: PodPolicy = STRICT,
                  node_failure_conditions: frozenset[str] = DEFAULT_NODE_FAILURE_CONDITIONS,
                  isolation: Isolation | None = None, token_key: bytes | None = None) -> Plan:
    """``runtime_image``: the operator's setting of that name (``manifests.runtime_bundle``);
    ``pod_policy``: what a ``podTemplate`` may ask (``podpolicy.py``);
    ``node_failure_conditions``: node condition types that mean a failure
    (``policies/node_health.py``); ``isolation``: the peers of the job's NetworkPolicy
    (``isolation.py``), None for none; ``token_key``: the operator's key for the jobs'
    tokens (``tokens.py``), None for none. ``received`` is left as it is: the new status is
    built from a copy of its status."""
    status = received.status.model_copy(deep=True)
    if received.deleting:
        return Plan([], [], status.to_wire(), None)
    if received.job is None:
        ledger = Ledger(now=now, status=status)
        ledger.status.observed_generation = received.generation
        errors = received.invalid.errors if received.invalid is not None else []
        validity.mark_invalid(ledger, Reason.INVALID_SPEC, "; ".join(str(e) for e in errors), received.generation)
        return _done(ledger)
    ctx = Pass(job=received.job, observed=observed, now=now, status=status, runtime_image=runtime_image, pod_policy=pod_policy,
               node_failure_conditions=node_failure_conditions, isolation=isolation, token_key=token_key)
    account_time(ctx)
    _policies(ctx)
    progress.show(ctx)  # after every policy that moves the step or ends the job
    ctx.status.selector = worker_selector(ctx.job.metadata.name)
    return _done(ctx)


def _done(ctx: Ledger) -> Plan:
    requeue = min(ctx.timers) if ctx.timers else None
    urgent = min(ctx.urgent_timers) if ctx.urgent_timers else None
    return Plan(_dedupe(ctx.actions), ctx.decisions, ctx.status.to_wire(), requeue, urgent)


def _dedupe(actions: list[Action]) -> list[Action]:
    """Several concerns may ask to delete the same pod; one request each (a forced one
    wins, since it is what a dead node needs)."""
    out: list[Action] = []
    deletes: dict[str, int] = {}
    for action in actions:
        if isinstance(action, DeletePod):
            if action.name in deletes:
                if action.force:
                    out[deletes[action.name]] = action
                continue
            deletes[action.name] = len(out)
        out.append(action)
    return out
