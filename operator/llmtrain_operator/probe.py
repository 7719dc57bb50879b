"""Read a trainer's progress from its Prometheus endpoint.

The trainer needs no Kubernetes credentials: the operator (and the local runner)
scrape local rank 0 of each worker for the step, world size, torchrun restarts, the
newest committed checkpoint and the health of each tier, and the checkpoint interval in
force with its inputs. The operator also reads each worker's launcher (on the health port),
which counts a failed attempt as soon as torchrun starts the next one, and serves the
progress a user's script reported (docs/custom-scripts.md).
"""

from __future__ import annotations

import asyncio
import enum
from functools import partial
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from llmtrain_contract.names import FAILED_ATTEMPT_CAUSES, LauncherMetric, Metric
from prometheus_client.parser import text_string_to_metric_families

from .api import untrusted
from .api.observed import ContainerMemory, TrainerProbe

RESTARTS = Metric.total(Metric.WORKER_GROUP_RESTARTS)
FAILED_ATTEMPTS = Metric.total(Metric.FAILED_ATTEMPTS)
LAUNCHER_FAILED_ATTEMPTS = Metric.total(LauncherMetric.FAILED_ATTEMPTS)
LAUNCHER_OOM_KILLS = Metric.total(LauncherMetric.OOM_KILLS)
READ = (Metric.STEP, Metric.WORLD_SIZE, RESTARTS, Metric.LAST_STEP_TIMESTAMP, Metric.CHECKPOINT_INTERVAL_STEPS,
        Metric.CHECKPOINT_COST_SECONDS, Metric.CHECKPOINT_LATENCY_SECONDS, Metric.CHECKPOINT_MTBF_SECONDS,
        Metric.CHECKPOINT_CADENCE_STEP_SECONDS, Metric.NUMERICS_ROLLBACKS, Metric.TOKENS_PER_SECOND, Metric.HEAL_ROUNDS)

WANTED = (*READ, Metric.LOSS, Metric.INFO, Metric.CHECKPOINT_LAST_STEP, Metric.CHECKPOINT_TIER_DEGRADED, FAILED_ATTEMPTS, Metric.STRAGGLER,
          Metric.SKIPPED_SAMPLES)
"""Every sample ``parse`` reads. The trainer's endpoint (prometheus_client's) serves only
these when asked with ``name[]``: a quarter of the page (its histograms are most of it),
and a quarter of the parsing, at every pass of every job."""
_QUERY = urllib.parse.urlencode([("name[]", name) for name in WANTED])


def trainer_url(host: str, port: int) -> str:
    """The URL of a trainer's metrics, restricted to what the operator reads."""
    return f"http://{host}:{port}/metrics?{_QUERY}"


MAX_PAGE_WINDOWS = 200
"""Skipped windows taken from one page at most, the newest by sample (the status keeps as
many: ``planner/policies/numerics.py``)."""
MAX_BODY = 256 * 1024
"""Bytes of a metrics page read at most: the trainer's filtered page is a few KB, and a
pod that serves more is not ours to buffer (every job shares the operator's memory)."""


def parse(text: str) -> TrainerProbe:
    """A trainer's page, every value checked (``api.untrusted``): a bad one is left out and
    named in ``rejected``. Raises ValueError only for text that is not Prometheus' format."""
    values: dict[str, float] = {}
    checkpoints: dict[str, int] = {}
    failed: dict[str, int] = {}
    degraded: dict[str, str] = {}
    skipped: list[tuple[int, int, int, int]] = []
    stragglers: dict[int, float] = {}
    rejected: list[str] = []
    loss: float | None = None
    own_rank: int | None = None

    bad = partial(_reject, rejected)

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == Metric.INFO:
                own_rank = untrusted.count(sample.labels.get("rank", ""))
                if own_rank is None:
                    bad(sample, "labels")
            elif sample.name == Metric.LOSS:
                # Shown, never acted on. A non-finite loss is bad numerics, which the
                # trainers handle themselves (a rollback): it is left out, not reported.
                if (sample_loss := untrusted.loss(sample.value)) is not None:
                    loss = sample_loss
            elif sample.name == Metric.CHECKPOINT_LAST_STEP:
                tier, step = sample.labels.get("tier", "local"), untrusted.count(sample.value)
                if tier not in untrusted.TIERS or step is None:
                    bad(sample, "value" if step is None else "labels")
                else:
                    checkpoints[tier] = step
            elif sample.name == Metric.CHECKPOINT_TIER_DEGRADED and untrusted.seconds(sample.value) and sample.value >= 1:
                tier, reason = sample.labels.get("tier", "local"), untrusted.tier_reason(sample.labels.get("reason", "Error"))
                if tier not in untrusted.TIERS or reason is None:
                    bad(sample, "labels")
                degraded[tier if tier in untrusted.TIERS else "local"] = reason or "Error"
            elif sample.name == FAILED_ATTEMPTS:
                _failed(sample, failed, bad)
            elif sample.name == Metric.STRAGGLER:
                rank, value = untrusted.count(sample.labels.get("rank", "")), untrusted.seconds(sample.value)
                if rank is None or value is None:
                    bad(sample, "value" if rank is not None else "labels")
                else:
                    stragglers[rank] = value
            elif sample.name == Metric.SKIPPED_SAMPLES and untrusted.seconds(sample.value) and sample.value >= 1:
                window = tuple(untrusted.count(sample.labels.get(k, "")) for k in ("first_step", "last_step", "first_sample", "end_sample"))
                if any(v is None for v in window):
                    bad(sample, "labels")
                else:
                    skipped.append(window)  # type: ignore[arg-type]
            elif sample.name in READ:
                if untrusted.seconds(sample.value) is None:
                    bad(sample)
                else:
                    values[sample.name] = sample.value
    as_int = lambda key: untrusted.count(values[key]) if key in values else None  # noqa: E731
    return TrainerProbe(
        step=as_int(Metric.STEP),
        world_size=as_int(Metric.WORLD_SIZE),
        restarts=as_int(RESTARTS),
        failed_attempts=failed,
        last_step_time=values.get(Metric.LAST_STEP_TIMESTAMP) or None,
        last_checkpoint=checkpoints,
        tier_degraded=degraded,
        interval_steps=as_int(Metric.CHECKPOINT_INTERVAL_STEPS) or None,
        # Unset gauges read 0: only global rank 0, once it has chosen, reports these.
        cost_seconds=values.get(Metric.CHECKPOINT_COST_SECONDS) or None,
        latency_seconds=values.get(Metric.CHECKPOINT_LATENCY_SECONDS) or None,
        mtbf_seconds=values.get(Metric.CHECKPOINT_MTBF_SECONDS) or None,
        step_seconds=values.get(Metric.CHECKPOINT_CADENCE_STEP_SECONDS) or None,
        loss=loss,
        rank=own_rank,
        tokens_per_second=values.get(Metric.TOKENS_PER_SECOND) or None,
        rollbacks=as_int(Metric.NUMERICS_ROLLBACKS),
        heals=as_int(Metric.HEAL_ROUNDS),
        skipped=tuple(sorted(sorted(set(skipped), key=lambda w: (w[2], w[0]))[-MAX_PAGE_WINDOWS:])),
        stragglers=stragglers,
        rejected=tuple(rejected),
    )


def _reject(rejected: list[str], sample: Any, what: str = "value") -> None:
    """Name a sample's unusable value (or labels) in ``rejected``."""
    rejected.append(f"metric {sample.name} {what} ({untrusted.shown(sample.value if what == 'value' else sample.labels)})")


def _failed(sample: Any, failed: dict[str, int], bad: Any) -> None:
    cause, n = sample.labels.get("cause", "crash"), untrusted.count(sample.value)
    if cause not in FAILED_ATTEMPT_CAUSES or n is None:
        bad(sample, "value" if n is None else "labels")
    else:
        failed[cause] = n


@dataclass(frozen=True)
class LauncherReport:
    """What one worker's launcher serves on ``/metrics``."""

    failed: dict[str, int]
    """cause -> failed attempts."""
    workers_running: bool = False
    step: int | None = None
    """The step a user's script reported (``LLMTRAIN_PROGRESS_FILE``), if it did."""
    last_step_time: float | None = None
    memory: ContainerMemory | None = None
    """The container's OOM kills, memory peak and limit; None when the page has none."""
    peer_wait: float | None = None
    """Seconds the pod's ranks have been blocked on a peer in another pod; None when not."""
    attempt: int | None = None
    """The attempt its worker group runs: one more at every restart of the group, a peer's
    failure or a membership change included (``handlers/probing.py`` reads every worker
    when it moves)."""
    rejected: tuple[str, ...] = ()
    """Values on the page that were unusable and ignored, each named."""

    def progress(self) -> TrainerProbe | None:
        """A script's reported progress, in the form the planner reads a trainer's."""
        if self.step is None:
            return None
        return TrainerProbe(step=self.step, last_step_time=self.last_step_time)


def parse_launcher(text: str) -> LauncherReport:
    failed: dict[str, int] = {}
    values: dict[str, float] = {}
    rejected: list[str] = []

    bad = partial(_reject, rejected)

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LAUNCHER_FAILED_ATTEMPTS:
                _failed(sample, failed, bad)
            elif sample.name in (LauncherMetric.WORKERS_RUNNING, LauncherMetric.STEP, LauncherMetric.LAST_STEP_TIMESTAMP,
                                 LauncherMetric.PEER_WAIT):
                if untrusted.seconds(sample.value) is None:
                    bad(sample)
                else:
                    values[sample.name] = sample.value
            elif sample.name in (LAUNCHER_OOM_KILLS, LauncherMetric.MEMORY_PEAK, LauncherMetric.MEMORY_LIMIT,
                                 LauncherMetric.ATTEMPT):
                if untrusted.count(sample.value) is None:
                    bad(sample)
                else:
                    values[sample.name] = sample.value
    step, attempt = values.get(LauncherMetric.STEP), values.get(LauncherMetric.ATTEMPT)
    kills = values.get(LAUNCHER_OOM_KILLS)
    peak, limit = values.get(LauncherMetric.MEMORY_PEAK), values.get(LauncherMetric.MEMORY_LIMIT)
    memory = ContainerMemory(int(kills), int(peak) if peak is not None else None,
                             int(limit) if limit is not None else None) if kills is not None else None
    return LauncherReport(failed, workers_running=values.get(LauncherMetric.WORKERS_RUNNING, 0) >= 1,
                          step=untrusted.count(step) if step is not None else None,
                          last_step_time=values.get(LauncherMetric.LAST_STEP_TIMESTAMP) or None,
                          memory=memory, peer_wait=values.get(LauncherMetric.PEER_WAIT),
                          attempt=int(attempt) if attempt is not None else None, rejected=tuple(rejected))


def combine(trainers: dict[str, TrainerProbe], launchers: dict[str, LauncherReport]
            ) -> tuple[dict[str, TrainerProbe], dict[str, dict[str, int]], dict[str, tuple[str, ...]]]:
    """(progress by pod, failed attempts by pod, unusable values by pod). A user's script
    has no trainer endpoint of ours; the progress it reported through its launcher stands
    in for one."""
    probes = dict(trainers)
    for pod, report in launchers.items():
        progress = report.progress()
        if pod not in probes and progress is not None:
            probes[pod] = progress
    rejected = {pod: probe.rejected for pod, probe in trainers.items() if probe.rejected}
    for pod, report in launchers.items():
        if report.rejected:
            rejected[pod] = rejected.get(pod, ()) + report.rejected
    return probes, {pod: report.failed for pod, report in launchers.items()}, rejected


def peer_waits_of(launchers: dict[str, LauncherReport]) -> dict[str, float]:
    """Pod -> how long its ranks have been blocked on a peer, for the pods whose are."""
    return {pod: report.peer_wait for pod, report in launchers.items() if report.peer_wait is not None}


def memory_of(launchers: dict[str, LauncherReport]) -> dict[str, ContainerMemory]:
    """Pod -> its container's memory figures, for the pods whose launcher served them."""
    return {pod: report.memory for pod, report in launchers.items() if report.memory is not None}


def scrape(url: str, timeout: float = 2.0) -> TrainerProbe | None:
    """None when the endpoint is not up (yet) or serves no metrics page: a probe never raises."""
    text = _get(url, timeout)
    return _parsed(parse, text) if text is not None else None


def scrape_launcher(url: str, timeout: float = 2.0) -> LauncherReport | None:
    """The launcher's report (``LauncherMetric``); None when it does not answer."""
    text = _get(url, timeout)
    return _parsed(parse_launcher, text) if text is not None else None


def _parsed(parser: Any, text: str) -> Any:
    """``parser(text)``, or None for a page that is not in Prometheus' format (the parser
    raises ValueError, and for some malformed input other errors)."""
    try:
        return parser(text)
    except (ValueError, TypeError, IndexError, KeyError, OverflowError):
        return None


def _get(url: str, timeout: float) -> str | None:
    """The page, or None when the endpoint does not answer or serves over ``MAX_BODY``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - cluster-internal URL
            body = response.read(MAX_BODY + 1)
            return body.decode("utf-8", errors="replace") if len(body) <= MAX_BODY else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


class Unasked(enum.Enum):
    """A probe that could not start within its bound (``QUEUE_TIMEOUTS``): the pod was
    not asked, which says nothing about it (no silence, no answer)."""

    UNASKED = "unasked"


UNASKED = Unasked.UNASKED

QUEUE_TIMEOUTS = 2.0
"""A request waits for one of the prober's connections at most this many probe timeouts;
one that could not start by then is no answer (a pass stays bounded when many pods hang)."""


class AsyncProber:
    """The operator's probes: HTTP on the event loop (aiohttp, which kopf runs on), not a
    thread per request. Hundreds of jobs' trainers are scraped at every resync, and threads
    would make every Kubernetes API call queue behind them. At most ``concurrency``
    requests are in flight at once, half of them trainers' pages and half launchers' (so
    that a pass's trainer requests, queued first, never leave the launchers' pages, which
    carry silences and failure counts, waiting behind them); each is one connection (pods
    come and go, so nothing is kept alive).

    A request's timeout runs from the moment it holds one of those: counted from the call,
    as aiohttp's own total timeout is, it included the wait behind the other requests, and
    a pass of 2,048 pages through 64 connections lost about half of them to their own
    queue (docs/benchmarks.md, "Operator scale"). The wait is bounded apart
    (``QUEUE_TIMEOUTS``)."""

    def __init__(self, concurrency: int = 64):
        self.concurrency = concurrency
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pools: dict[str, asyncio.Semaphore] = {}

    def _client(self) -> Any:
        import aiohttp  # noqa: PLC0415 - the operator's dependency (kopf's); `llmtrain run` scrapes without it

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.concurrency, force_close=True))
            share = max(1, self.concurrency // 2)
            self._pools = {"trainer": asyncio.Semaphore(share), "launcher": asyncio.Semaphore(share)}
            self._loop = loop
        return self._session

    async def text(self, url: str, timeout: float, pool: str = "trainer") -> str | Unasked | None:
        """The page, or None when the endpoint does not answer 200 within ``timeout`` of
        the request's start or serves over ``MAX_BODY`` (read no further); ``UNASKED``
        when the request could not start within ``QUEUE_TIMEOUTS`` x ``timeout``. A probe
        never raises."""
        import aiohttp  # noqa: PLC0415

        session = self._client()
        slots = self._pools[pool]  # this loop's: released to the one it was taken from
        try:
            async with asyncio.timeout(timeout * QUEUE_TIMEOUTS):
                await slots.acquire()
        except TimeoutError:
            return UNASKED
        try:
            async with asyncio.timeout(timeout):
                async with session.get(url) as response:
                    if response.status != 200 or (response.content_length or 0) > MAX_BODY:
                        return None
                    body = bytearray()
                    async for chunk in response.content.iter_chunked(64 * 1024):
                        body += chunk
                        if len(body) > MAX_BODY:
                            return None
                    return body.decode("utf-8", errors="replace")
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None
        finally:
            slots.release()

    async def trainer(self, url: str, timeout: float) -> TrainerProbe | Unasked | None:
        text = await self.text(url, timeout)
        if text is None or text is UNASKED:
            return text
        # Parsed on a thread: a page of up to MAX_BODY must not hold the event loop that
        # every job's passes and the Lease renewals share.
        return await asyncio.to_thread(_parsed, parse, text)

    async def launcher(self, url: str, timeout: float) -> LauncherReport | Unasked | None:
        text = await self.text(url, timeout, pool="launcher")
        if text is None or text is UNASKED:
            return text
        return await asyncio.to_thread(_parsed, parse_launcher, text)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
