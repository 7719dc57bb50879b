"""Training progress from the trainers' metrics: step, world size, the newest
checkpoint, and the end of a recovery (the first step finished after a failure); and from
an ended pod's termination message, its last step and loss (the last scrape may predate
them)."""

from __future__ import annotations

from llmtrain_contract.names import Termination

from ...api.observed import TrainerProbe, parse_time
from ...api.status import RankHolder, RankZero
from ...api.vocabulary import Phase
from ..context import Pass, Verdict
from ..decisions import RecoveryMeasured
from ..names import TRAINER_CONTAINER
from ..newest_checkpoint import TIER_DURABILITY, note



def handle(ctx: Pass) -> Verdict:
    status = ctx.status
    probes = ctx.observed.worker_probes()
    steps = [p.step for p in probes if p.step is not None]
    if steps and max(steps) > status.step:
        status.step = max(steps)
        status.last_progress_time = ctx.stamp
    # A step finished since the last progress is progress too: after a restore from an
    # older checkpoint the steps up to the old high-water mark are redone, and the
    # backstop must not take that for a wedge.
    finished = [p.last_step_time for p in probes if p.last_step_time]
    since = parse_time(status.last_progress_time)
    if finished and (since is None or max(finished) > since.timestamp()):
        status.last_progress_time = ctx.stamp
    _recovery(ctx, [p.last_step_time for p in probes if p.last_step_time])
    worlds = [p.world_size for p in probes if p.world_size]
    if worlds:
        status.world_size = max(worlds)
    _throughput(ctx, probes)
    # Every rank says the same heal count; a page from before a heal, or a trainer restored
    # from an older checkpoint, says less: the status never goes back.
    status.heals = max([status.heals, *(p.heals for p in probes if p.heals is not None)])
    _last_step(ctx)
    for probe in probes:
        # Only the tiers a job can have: the labels are scraped, and the status's
        # model refuses any other name (the pass would fail on it).
        for tier in TIER_DURABILITY:
            step = probe.last_checkpoint.get(tier)
            if step is not None:
                note(ctx, step, tier)
    return Verdict.CONTINUE


def _throughput(ctx: Pass, probes: list[TrainerProbe]) -> None:
    """The loss and tokens/s of the trainer furthest along, and the pod of global rank 0."""
    status = ctx.status
    workers = {p.name for p in ctx.observed.workers()}
    holders = sorted(name for name in workers if getattr(ctx.observed.probes.get(name), "rank", None) == 0)
    if holders:
        status.rank_zero = RankZero(pod=holders[0], container=TRAINER_CONTAINER)
    elif status.rank_zero is not None and status.rank_zero.pod not in workers:
        status.rank_zero = None  # its pod is gone; the next to hold rank 0 will say so
    # As with rank 0: when no page says anything (the pods have ended, the pages are gone),
    # the last word stands for the pods still there, so a finished job's logs stay findable.
    status.ranks = _rank_holders(ctx, workers) or [h for h in status.ranks if h.pod in workers]
    # Only a trainer past its first step: a fresh process serves step 0 and a loss of 0.
    newest = max((p for p in probes if p.step), key=lambda p: p.step or 0, default=None)
    if newest is not None and newest.loss is not None:
        status.loss = round(newest.loss, 4)
    if newest is not None and newest.tokens_per_second:
        status.tokens_per_second = round(newest.tokens_per_second, 1)


def _rank_holders(ctx: Pass, workers: set[str]) -> list[RankHolder]:
    """Each worker's ranks, by its page's rank (its local rank 0's): torchrun gives a
    pod ``procsPerNode`` consecutive ranks. A pod whose page is not read yet, or names a
    rank past the world size it reports (a page from before a re-rendezvous), past the
    largest world the job can have or not a multiple of ``procsPerNode`` (a page's word,
    not a rank torchrun gave), is left out rather than guessed."""
    per_pod = ctx.spec.procs_per_node
    largest = ctx.spec.replicas.max * per_pod
    held = []
    for name in workers:
        probe = ctx.observed.probes.get(name)
        first = getattr(probe, "rank", None)
        world = getattr(probe, "world_size", None)
        if first is None or first % per_pod or first + per_pod > largest or (world and first >= world):
            continue
        held.append(RankHolder(pod=name, first=first, last=first + per_pod - 1))
    # One holder a rank (two pages naming one: a pod on its way out and its successor,
    # briefly), so that the list stays within replicas.max entries.
    unique = {h.first: h for h in sorted(held, key=lambda h: (h.first, h.pod), reverse=True)}
    return sorted(unique.values(), key=lambda h: h.first)


def _last_step(ctx: Pass) -> None:
    """The newest step an ended pod's ranks finished, and its loss: a job that ends
    between two scrapes (every ten seconds) would otherwise show an earlier step's loss
    for good. Not past a built-in job's ``maxSteps`` (the message is the pod's word)."""
    status = ctx.status
    builtin = ctx.spec.trainer.builtin
    reported = [p.termination.get(Termination.LAST_STEP) for p in ctx.observed.workers()]
    usable = [r for r in reported if r is not None and (builtin is None or r["step"] <= builtin.max_steps)]
    newest = max(usable, key=lambda r: r["step"], default=None)
    if newest is None or newest["step"] < status.step:
        return
    status.step = newest["step"]
    status.loss = round(newest["loss"], 4)


def show(ctx: Pass) -> None:
    """``step/maxSteps`` and the time left to ``maxSteps`` at the newest step's pace (a
    built-in job: its length is known). Run at the end of every pass, after whatever
    policy moved the step (completion sets it to ``maxSteps``) or ended the job."""
    status = ctx.status
    builtin = ctx.spec.trainer.builtin
    max_steps = builtin.max_steps if builtin is not None else None
    status.progress = f"{status.step}/{max_steps}" if max_steps else str(status.step)
    status.eta = None  # only while training: a job restarting or suspended has no pace
    if status.phase == Phase.RUNNING and builtin is not None and max_steps and status.tokens_per_second and status.step < max_steps:
        step_seconds = builtin.global_batch_size * builtin.data.seq_len / status.tokens_per_second
        status.eta = duration((max_steps - status.step) * step_seconds)


def duration(seconds: float) -> str | None:
    """``45s``, ``12m30s``, ``3h5m``, ``2d4h``: a person's reading of a wait; None beyond a
    year (a pace that slow says nothing about when the job ends)."""
    if seconds > 366 * 86400:
        return None
    s = int(round(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{s}s"
    return f"{s}s"


def _recovery(ctx: Pass, step_times: list[float]) -> None:
    """Recovery ends with the first training step finished after the failure was
    detected (failure -> first new step), as timed by the trainer itself."""
    status = ctx.status
    if status.last_failure is None or status.last_recovery_seconds is not None or not step_times:
        return
    detected = parse_time(status.last_failure.time)
    newest = max(step_times)
    if detected is not None and newest > detected.timestamp():
        status.last_recovery_seconds = round(newest - detected.timestamp(), 3)
        ctx.decide(RecoveryMeasured(status.last_recovery_seconds))
