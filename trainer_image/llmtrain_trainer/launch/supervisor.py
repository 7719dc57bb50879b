"""The launcher's supervisor: hang detection from outside the trainer processes.

It reads every local rank's heartbeat file (``heartbeat.py``) once a second. When a rank
made no progress for its ``hangTimeoutSeconds``, the supervisor looks at the process from
outside, in ``/proc``, and tells the cause from its victims:

| the stale rank is ...                                   | verdict                      |
|---------------------------------------------------------|------------------------------|
| stopped (SIGSTOP, a debugger, ``T``/``t`` in ``/proc``)   | cause: ``frozen``            |
| burning CPU without progress (a loop holding the GIL)   | cause: ``spinning``          |
| idle outside any collective (a sleep, a lock, I/O)      | cause: ``stuck``             |
| idle inside a collective or the train step              | victim: waits for a peer     |

Then it writes one exit record per stale rank (``HANG`` for a cause, ``COLLECTIVE_TIMEOUT``
for a victim, so the blame lands on the cause's pod and victims are never charged), dumps
the stacks of the causes with ``py-spy dump --nonblocking`` (which reads a stopped or
spinning process without pausing it), and SIGKILLs the causes: torchrun then
ends the worker group and restarts it (or exits, and the launcher reports the record).
A victim that offers a rescue checkpoint (its heartbeat's budget: a replicated state,
consistent at its last step while it waits for the peer) is asked for one instead, and
exits by itself once it saved it; it is killed if it is still alive after its budget and
a second. Its peers lost their state with the cause; the victim still holds the last
step, and the next attempt resumes there instead of at the last periodic checkpoint.

The torchrun agent is watched too: an agent stopped for longer than the ranks' timeout
can neither restart nor report its workers, so the supervisor kills it and its workers
and the launcher exits with the hang code.

So are the ranks' exit records: a rank that exits with a permanent code (a config or data
error, ``llmtrain exit-codes``) would fail the same way in every attempt, and torchrun,
whose restart budget is the operator's (practically unlimited), would restart the worker
group forever. The supervisor ends torchrun instead (``permanent``), and the launcher
exits with that code, which fails the job at once.

When every stale rank of the pod is a victim, the cause is in another pod, and if that
pod is frozen whole (launcher included) nothing in it can report. So the supervisor also
serves how long this pod's ranks have been blocked on a peer (``peer_wait``,
``LauncherMetric.PEER_WAIT``), until they train again: the operator replaces a pod its
peers wait on that does not answer and that its kubelet reports not ready
(``planner/policies/frozen_pods.py``).

What no process in the pod can see, a frozen launcher (with or without the rest of the
pod), the kubelet sees as well: the launcher serves ``/healthz`` (``serve_health``) for the pod's
liveness probe, answering while its supervisor keeps checking, and beside it ``/metrics``
with the pod's failed attempts, counted as soon as torchrun starts the next one
(``attempts.py``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from llmtrain_contract.exitcodes import ExitCode, FailureClass, classify_exit
from llmtrain_contract.names import PEER_WAIT_SHOWN_SECONDS, LauncherMetric
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmtrain_trainer.launch import attempts
from llmtrain_trainer.pod import exitrecord, httpserve
from llmtrain_trainer.pod import heartbeat, memcg
from llmtrain_trainer.pod import progress
from llmtrain_trainer.pod.heartbeat import WAITING_STATES, Beat, State

log = logging.getLogger("llmtrain.supervisor")

BUSY_CPU_FRACTION = 0.3
"""CPU seconds per wall second above which a stale rank is spinning, not waiting."""
DUMP_TIMEOUT_SECONDS = 10.0
JOINT_FRACTION = 0.5
"""When one rank is stale, the others idle for this fraction of their timeout are judged
with it."""
PID_REUSE_SLACK_SECONDS = 1.0
"""A heartbeat can't be older than its process: one that is, by more than the clocks'
rounding, was written by an earlier process under the same pid."""
HEALTHY_CHECK_AGE_SECONDS = 30.0
"""``/healthz`` fails when the supervisor's last check is older than this (a dump can
take ``DUMP_TIMEOUT_SECONDS`` per rank)."""
DEFAULT_AGENT_TIMEOUT_SECONDS = 60.0
"""How long the agent may stay stopped when no rank has published its timeout yet."""
RESCUE_SLACK_SECONDS = 1.0
"""How much longer than its own budget a victim asked for a rescue checkpoint may live."""


@dataclass(frozen=True)
class ProcInfo:
    state: str
    """``/proc/<pid>/stat`` state: R running, S sleeping, D disk, T stopped, t traced, Z zombie."""
    cpu_seconds: float
    started: float
    """Seconds after boot (``heartbeat.clock()``)."""


def proc_info(pid: int) -> ProcInfo | None:
    """What the kernel says of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return ProcInfo(state=fields[0], cpu_seconds=(int(fields[11]) + int(fields[12])) / ticks, started=int(fields[19]) / ticks)


@dataclass(frozen=True)
class Verdict:
    beat: Beat
    cause: bool
    kind: str
    """``frozen``, ``spinning``, ``stuck`` (causes) or ``victim``."""
    stale: float

    def message(self) -> str:
        where = {State.TRAIN_STEP: "in the train step", State.COLLECTIVE: "in a collective",
                 State.RESCUING: "while saving its rescue checkpoint"}.get(self.beat.state, "outside any collective")
        what = {
            "frozen": "is frozen (stopped: SIGSTOP, a debugger or a paused machine)",
            "spinning": "burns CPU without progress (native code holding the GIL, or a loop)",
            "stuck": f"is blocked {where}",
            "victim": f"is blocked {where}, waiting for a peer that stopped participating",
        }[self.kind]
        role = f"cause ({self.kind})" if self.cause else "victim"
        return (f"{role}: rank {self.beat.rank} (local {self.beat.local_rank}, pid {self.beat.pid}) {what}; "
                f"no step progress for {self.stale:.1f}s after step {self.beat.step} "
                f"(limit {self.beat.timeout:g}s: hangTimeoutSeconds, longer for an attempt's first step)")


def judge(beat: Beat, info: ProcInfo, busy_fraction: float, stale: float) -> Verdict:
    """Cause or victim, from the process's state and CPU use while it made no progress."""
    if info.state in ("T", "t"):
        return Verdict(beat, True, "frozen", stale)
    if beat.state == State.RESCUING:
        return Verdict(beat, False, "victim", stale)  # its write may well burn CPU
    if busy_fraction >= BUSY_CPU_FRACTION:
        return Verdict(beat, True, "spinning", stale)
    if beat.state in WAITING_STATES:
        return Verdict(beat, False, "victim", stale)
    return Verdict(beat, True, "stuck", stale)


def dump_stack(pid: int) -> str:
    """The Python stacks of every thread of ``pid``, read from outside."""
    tool = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(tool).exists():
        return "(py-spy is not installed: no stack dump)"
    try:
        done = subprocess.run([tool, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=DUMP_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"(py-spy dump failed: {err})"
    return (done.stdout + done.stderr).strip() or f"(py-spy dump printed nothing, exit {done.returncode})"


@dataclass
class _Seen:
    beat: float
    since: float
    cpu: float


@dataclass
class Supervisor:
    run_dir: Path
    agent_pid: int | None = None
    poll_seconds: float = 1.0
    last_check: float = field(default_factory=time.monotonic)
    agent_hang: str | None = None
    """Set when the supervisor ended a stopped torchrun agent: why."""
    started: float = field(default_factory=time.time)
    """Exit records older than this were written by an earlier container of the pod."""
    permanent: tuple[int, dict] | None = None
    """(attempt, record) of a rank's permanent exit, once the supervisor ended torchrun for it."""
    peer_wait_since: float | None = None
    """``clock()`` of the verdict that found this pod's ranks all victims (blocked on a peer
    elsewhere); None once they train again (``peer_wait``)."""
    _seen: dict[int, _Seen] = field(default_factory=dict)
    _ended: set[int] = field(default_factory=set)
    _rescuing: dict[int, float] = field(default_factory=dict)
    """pid -> the ``clock()`` deadline of a victim asked for a rescue checkpoint."""
    _agent_stopped_since: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Supervisor:
        self._thread = threading.Thread(target=self._run, name="rank-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=DUMP_TIMEOUT_SECONDS + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.check()
            except Exception:  # the supervisor must outlive its own bugs
                log.exception("supervisor check failed")

    def check(self, now: float | None = None) -> list[Verdict]:
        """One look at every rank (and the agent); acts on what is stale. Returns the
        verdicts it acted on."""
        now = heartbeat.clock() if now is None else now
        self.last_check = time.monotonic()
        self._check_permanent()
        live: list[tuple[Beat, ProcInfo]] = []
        for beat in heartbeat.read_all(self.run_dir):
            info = proc_info(beat.pid)
            if info is None or info.state == "Z" or beat.pid in self._ended:
                continue
            if info.started > beat.beat + PID_REUSE_SLACK_SECONDS:
                continue  # a file left by an earlier container, its pid reused by a newer process
            live.append((beat, info))
        self._check_agent(now, [b.timeout for b, _ in live])
        self._check_peer_wait(now, live)
        self._end_overdue_rescues(now)
        armed: list[tuple[Beat, ProcInfo, _Seen]] = []
        for beat, info in live:
            seen = self._seen.get(beat.pid)
            if seen is None or seen.beat != beat.beat:
                seen = self._seen[beat.pid] = _Seen(beat.beat, now, info.cpu_seconds)
            if beat.state not in (State.STARTING, State.DONE):
                armed.append((beat, info, seen))
        if not any(beat.stale_for(now) > beat.timeout for beat, _, _ in armed):
            return []
        # Ending one rank ends the pod's worker group, so every rank that has been idle
        # for a while is judged now, together: local ranks stall within moments of each
        # other, and a cause judged a poll later would already be gone without a record.
        stale = [
            judge(beat, info, (info.cpu_seconds - seen.cpu) / max(now - seen.since, 1e-3), beat.stale_for(now))
            for beat, info, seen in armed
            if beat.stale_for(now) > beat.timeout * JOINT_FRACTION
        ]
        self._act(stale, now)
        return stale

    def peer_wait(self, now: float | None = None) -> float | None:
        """Seconds this pod's ranks have been blocked on a peer, None when they are not."""
        since = self.peer_wait_since
        return None if since is None else max(0.0, (heartbeat.clock() if now is None else now) - since)

    def _check_peer_wait(self, now: float, live: list[tuple[Beat, ProcInfo]]) -> None:
        """The wait ends when a rank of a later process (the victims are ended) is in the
        training loop again with a beat after the verdict: its group formed, so the peer is
        back or replaced. Shown for ``PEER_WAIT_SHOWN_SECONDS`` at least, so the operator's
        next probe sees it even when an elastic job re-forms without the peer at once."""
        since = self.peer_wait_since
        if since is None or now - since < PEER_WAIT_SHOWN_SECONDS:
            return
        if any(beat.beat > since and beat.state not in (State.STARTING, State.DONE) for beat, _ in live):
            self.peer_wait_since = None

    def _end_overdue_rescues(self, now: float) -> None:
        for pid, deadline in list(self._rescuing.items()):
            info = proc_info(pid)
            if info is None or info.state == "Z":
                del self._rescuing[pid]
            elif now > deadline:
                del self._rescuing[pid]
                _write_stderr(f"llmtrain supervisor: the victim pid {pid} did not finish its rescue checkpoint in time; killing it\n")
                _kill(pid)

    def _act(self, verdicts: list[Verdict], now: float) -> None:
        if verdicts and not any(v.cause for v in verdicts) and self.peer_wait_since is None:
            self.peer_wait_since = now  # the cause is another pod's: served for the operator
        # The records first: with them the launcher counts the hang (attempts.py) while
        # py-spy still reads the stacks, which takes a second or two on a busy node.
        for verdict in verdicts:
            beat = verdict.beat
            exitrecord.write(self.run_dir, beat.attempt, beat.rank, beat.local_rank,
                             ExitCode.HANG if verdict.cause else ExitCode.COLLECTIVE_TIMEOUT, verdict.message(), beat.step)
        for verdict in verdicts:
            text = f"llmtrain supervisor: HANG: {verdict.message()}\n"
            if verdict.cause:
                text += f"stacks of rank {verdict.beat.rank} (py-spy, read from outside):\n{dump_stack(verdict.beat.pid)}\n"
            _write_stderr(text)
        for verdict in verdicts:
            beat = verdict.beat
            self._ended.add(beat.pid)
            if not verdict.cause and beat.rescue_budget > 0 and heartbeat.request_rescue(self.run_dir, beat):
                # From the request, not from the check: the cause's stack dump above may
                # have taken seconds, and they are not the victim's to lose.
                self._rescuing[beat.pid] = heartbeat.clock() + beat.rescue_budget + RESCUE_SLACK_SECONDS
                _write_stderr(f"llmtrain supervisor: asked rank {beat.rank} (pid {beat.pid}) for a rescue checkpoint (its last "
                              f"finished step: {beat.step}; budget {beat.rescue_budget:g}s)\n")
                continue
            _kill(beat.pid)

    def _check_permanent(self) -> None:
        if self.agent_pid is None or self.permanent is not None or self.agent_hang is not None:
            return
        latest = exitrecord.latest_attempt(self.run_dir)
        if latest is None:
            return
        for attempt in range(max(0, latest - 1), latest + 1):  # torchrun may have started the next already
            for record in exitrecord.read_attempt(self.run_dir, attempt):
                code = int(record["code"])
                if record.get("time", 0) < self.started or classify_exit(code).failure_class != FailureClass.PERMANENT:
                    continue
                self.permanent = (attempt, record)
                _write_stderr(f"llmtrain supervisor: rank {record.get('rank')} exited with the permanent code {code} "
                              f"({classify_exit(code).reason}); ending torchrun instead of restarting the workers in place\n")
                for pid in [self.agent_pid, *attempts.children(self.agent_pid)]:
                    _kill(pid)
                return

    def _check_agent(self, now: float, timeouts: list[float]) -> None:
        if self.agent_pid is None or self.agent_hang is not None:
            return
        info = proc_info(self.agent_pid)
        if info is None or info.state not in ("T", "t"):
            self._agent_stopped_since = None
            return
        if self._agent_stopped_since is None:
            self._agent_stopped_since = now
        limit = max(timeouts) if timeouts else DEFAULT_AGENT_TIMEOUT_SECONDS
        stopped = now - self._agent_stopped_since
        if stopped <= limit:
            return
        self.agent_hang = (f"cause: the torchrun agent (pid {self.agent_pid}) is frozen (stopped) for {stopped:.1f}s: "
                           "it can neither restart nor report its workers")
        _write_stderr(f"llmtrain supervisor: HANG: {self.agent_hang}\n")
        for pid in [self.agent_pid, *attempts.children(self.agent_pid)]:
            _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # works on a stopped process too
    except ProcessLookupError:
        pass


def _write_stderr(text: str) -> None:
    """One write, so that the dump does not interleave with the ranks' output."""
    sys.stderr.flush()
    view = memoryview(text.encode())
    while view:
        view = view[os.write(sys.stderr.fileno(), view):]


def serve_health(port: int, supervisor: Supervisor, tracker: attempts.AttemptTracker | None = None,
                 host: str = "", memory: memcg.Watch | None = None) -> httpserve.BoundedHTTPServer:
    """``GET /healthz`` for the pod's liveness probe: 200 while the supervisor checks.
    ``GET /readyz`` for a user script's readiness probe: 200 while torchrun's workers run
    (the built-in trainer's pods are ready once its own metrics answer instead).
    ``GET /metrics``: the pod's failed attempts (``attempts.py``), a script's reported
    progress (``progress.py``), the container's OOM kills, memory peak and limit
    (``memcg.py``) and how long the ranks have waited on a peer, for the operator."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics" and tracker is not None:
                self._answer(200, render_metrics(tracker, memory, supervisor.peer_wait()), CONTENT_TYPE_LATEST)
                return
            if self.path == "/readyz" and tracker is not None:
                running = tracker.workers_running()
                self._answer(200 if running else 503, b"workers running\n" if running else b"no workers running\n",
                             "text/plain; charset=utf-8")
                return
            age = time.monotonic() - supervisor.last_check
            healthy = self.path == "/healthz" and age < HEALTHY_CHECK_AGE_SECONDS
            body = (f"ok: last check {age:.1f}s ago\n" if healthy else f"supervisor's last check {age:.1f}s ago\n").encode()
            self._answer(200 if healthy else (503 if self.path == "/healthz" else 404), body, "text/plain; charset=utf-8")

        def _answer(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass  # a probe every few seconds would flood the pod's log

    return httpserve.serve(host, port, Handler, "launcher-health")


def render_metrics(tracker: attempts.AttemptTracker, memory: memcg.Watch | None = None,
                   peer_wait: float | None = None) -> bytes:
    failed = tracker.failed_attempts()
    counter = CounterMetricFamily(LauncherMetric.FAILED_ATTEMPTS, "Failed attempts in this pod, by cause, counted when "
                                  "torchrun starts the next attempt", labels=["cause"])
    for cause, count in failed.items():
        counter.add_metric([cause], count)
    attempt = GaugeMetricFamily(LauncherMetric.ATTEMPT, "The attempt the local worker group runs (torchrun's restart count)",
                                value=tracker.attempt)
    running = GaugeMetricFamily(LauncherMetric.WORKERS_RUNNING, "1 while torchrun's worker processes run",
                                value=int(tracker.workers_running()))
    families: list[Metric] = [counter, attempt, running]
    if peer_wait is not None:
        families.append(GaugeMetricFamily(LauncherMetric.PEER_WAIT, "Seconds this pod's ranks have been blocked in a "
                                          "collective on a peer in another pod", value=round(peer_wait, 3)))
    seen = memory.now() if memory is not None else None
    if seen is not None:
        kills, figures = seen
        families.append(CounterMetricFamily(LauncherMetric.OOM_KILLS, "Processes the kernel's OOM killer ended in this "
                                            "container since the launcher started", value=kills))
        if figures.peak_bytes is not None:
            families.append(GaugeMetricFamily(LauncherMetric.MEMORY_PEAK, "The container's memory peak (its cgroup's)",
                                              value=figures.peak_bytes))
        if figures.limit_bytes is not None:
            families.append(GaugeMetricFamily(LauncherMetric.MEMORY_LIMIT, "The container's memory limit",
                                              value=figures.limit_bytes))
    reported = progress.read(tracker.run_dir)
    if reported is not None:
        families.append(GaugeMetricFamily(LauncherMetric.STEP, "The largest step the script reported in LLMTRAIN_PROGRESS_FILE",
                                          value=reported.step))
        families.append(GaugeMetricFamily(LauncherMetric.LAST_STEP_TIMESTAMP, "When the script last reported a step",
                                          value=reported.updated))
    return generate_latest(_Families(families))


@dataclass(frozen=True)
class _Families:
    """Metric families computed per request (no process-wide registry to keep in step)."""

    families: list[Metric]

    def collect(self) -> list[Metric]:
        return self.families
