"""Bad numerics, as the trainers report them: each new window of samples skipped after a
rollback (a non-finite or spiking loss) is recorded in ``status.numerics``, with an Event
and as the job's ``lastFailure``. The trainers roll back by themselves (every rank judges
the same global loss); the operator's part is the record. Rollbacks are bounded by
``faultTolerance.numerics.maxRollbacks`` in the trainer, which fails the job with
``BadNumerics`` (exit 85) past it; they are not charged to the restart budget."""

from __future__ import annotations

from ...api.status import NumericsStatus, SkippedWindow
from ...api.vocabulary import FailureKind, Reason
from ..accounting import record_failure
from ..context import Pass, Verdict

MAX_WINDOWS = 200
"""Skipped windows kept in the status, the newest by sample; ``rollbacks`` counts them all.
An honest job has one a rollback; a pod's page can claim thousands. Once the list is full,
a window older than every kept one is taken as one seen before (not recorded again)."""
MAX_EVENTS = 5
"""Rollback Events a pass sends at most (one a window); more windows new at once are
summed up in one more Event."""


def _by_sample(window: tuple[int, int, int, int]) -> tuple[int, int]:
    return window[2], window[0]


def handle(ctx: Pass) -> Verdict:
    probes = ctx.observed.worker_probes()
    reported = {w for probe in probes for w in probe.skipped}
    rollbacks = max((p.rollbacks for p in probes if p.rollbacks is not None), default=0)
    current = ctx.status.numerics or NumericsStatus()
    known = {(w.first_step, w.last_step, w.first_sample, w.end_sample) for w in current.skipped}
    if len(known) >= MAX_WINDOWS:
        floor = min(_by_sample(w) for w in known)
        reported = {w for w in reported if _by_sample(w) > floor}
    new = sorted(reported - known)
    if not new and rollbacks <= current.rollbacks:
        return Verdict.CONTINUE
    windows = sorted(known | reported, key=_by_sample)[-MAX_WINDOWS:]
    kept = set(windows)
    new = [w for w in new if w in kept]
    ctx.status.numerics = NumericsStatus(
        rollbacks=max(rollbacks, current.rollbacks),
        skipped=[SkippedWindow(first_step=a, last_step=b, first_sample=c, end_sample=d) for a, b, c, d in windows],
    )
    for i, (first, last, start, end) in enumerate(new):
        what = (f"bad numerics at step {last}: rolled back to step {first - 1}; samples {start}..{end - 1} "
                f"(the data of steps {first}..{last}) are skipped")
        record_failure(ctx, FailureKind.BAD_NUMERICS, Reason.ROLLED_BACK, message=what)
        if i < MAX_EVENTS:
            ctx.event(Reason.ROLLED_BACK, what, warning=True)
    if len(new) > MAX_EVENTS:
        ctx.event(Reason.ROLLED_BACK, f"and {len(new) - MAX_EVENTS} more skipped windows, the newest {what}", warning=True)
    return Verdict.CONTINUE
