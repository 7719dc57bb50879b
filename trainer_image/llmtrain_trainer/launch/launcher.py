"""The worker pod's entry point: runs torchrun and reports *why* it stopped.

``python -m llmtrain_trainer.launch.launcher [--run-dir DIR] -- torchrun ...``

torchrun exits 1 for any failed worker group, which would hide the trainer's documented
exit codes (hang, preempted, config error ...). The launcher forwards SIGTERM/SIGINT to
torchrun, and when it exits, picks the most significant exit record the ranks wrote in
the latest attempt, exits with that code and writes it to the termination-message file
(``/dev/termination-log`` in Kubernetes), where the operator reads it. When no rank wrote
one (torchrun itself failed, in its rendezvous say), the message carries torchrun's own
error, from the error file its ``@record`` writes.

``python -m torch.distributed.run`` is run as ``torchrun_agent.py``, the same torchrun
but one whose failure leaves the job's rendezvous open for the other nodes.

While torchrun runs, the launcher's supervisor (``supervisor.py``) watches every local
rank's heartbeat from outside the trainer processes, so that a frozen rank, a rank
holding the GIL or a stopped torchrun agent is detected and blamed on the right rank.
With ``--health-port`` it serves ``/healthz`` for the pod's liveness probe, ``/readyz``
(a user script's readiness: torchrun's workers run) and ``/metrics`` with the pod's failed
attempts (``attempts.py``), which the operator reads seconds before the restarted
trainer's own counter is up, and a user script's progress (``progress.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from llmtrain_trainer.pod import exitrecord, memcg
from llmtrain_trainer.rendezvous import leases
from llmtrain_trainer.launch import preflight, zygote
from llmtrain_trainer.launch.attempts import AttemptTracker
from llmtrain_trainer.launch.supervisor import Supervisor, serve_health
from llmtrain_contract import oom as oom_words
from llmtrain_contract.command import torchrun_flag
from llmtrain_contract.exitcodes import ExitCode, FailureClass, classify_exit
from llmtrain_contract.names import TERMINATION_LOG, Env, Termination


AGENT = Path(__file__).with_name("torchrun_agent.py")
ERROR_FILE = "torchrun-error.json"
"""In the run dir: where torchrun's ``@record`` writes the agent's own exception."""
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.+)$")



WAIT_SLICE_SECONDS = 1.0


def wait_for(child: subprocess.Popen[bytes]) -> int:
    """The child's exit code, waited for in slices (``Popen.wait`` with a timeout polls
    every 50 ms or less), never in one blocking ``waitpid``. The kernel may hand a
    process-directed signal to any of the launcher's threads (the supervisor's, the
    servers'), and Python runs its handler, the forward to torchrun, only in the main
    thread once it runs Python again: a main thread blocked in ``waitpid`` would run it
    when torchrun has ended. Seen once on the local cluster, and what this explains: a
    deleted pod's launcher passed its SIGTERM on 12 s late, after its job had trained to
    the end (``tests/trainer/launch/test_launcher_wait.py`` makes that delivery happen)."""
    while True:
        try:
            return child.wait(timeout=WAIT_SLICE_SECONDS)
        except subprocess.TimeoutExpired:
            continue

def agent_command(command: list[str]) -> list[str]:
    """``command`` with ``python -m torch.distributed.run`` replaced by ``python
    torchrun_agent.py`` (same arguments); any other command as it is."""
    if len(command) > 2 and command[1:3] == ["-m", "torch.distributed.run"]:
        return [command[0], str(AGENT), *command[3:]]
    return command


def agent_error(path: Path) -> str | None:
    """The exception torchrun's agent recorded in ``path`` (its ``@record`` error file),
    each cause first ("DistNetworkError: ... timed out ... <- RendezvousConnectionError:
    ... See inner exception"), or None when there is none or it cannot be read."""
    try:
        message = json.loads(path.read_text())["message"]
        if not isinstance(message, dict):
            return str(message).strip() or None
        text = str(message.get("message") or "").strip()
        stack = str((message.get("extraInfo") or {}).get("py_callstack") or "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    # A chained traceback ends each exception, cause first, with an unindented
    # "module.Name: message" line.
    causes = [f"{m[1].rsplit('.', 1)[-1]}: {m[2]}" for m in map(_EXCEPTION_LINE.match, stack.splitlines()) if m]
    if len(causes) > 1:
        return " <- ".join(causes)
    return text or None


def decide(returncode: int, records: list[dict], agent_hang: str | None = None, torchrun_error: str | None = None,
           oom: tuple[int, memcg.Memory] | None = None) -> tuple[int, dict]:
    """The pod's exit code and termination message from torchrun's code and the records
    (or why the supervisor ended a stopped torchrun agent, or torchrun's own error).

    ``oom``: the container's OOM kills since the launcher started and its memory figures,
    given when a local rank of the last attempt died without a record (a signal). A kill
    then explains the failure better than the survivors' records (a peer's timeout, a
    SIGTERM from torchrun), though not better than a permanent error or a hang."""
    T = Termination  # noqa: N806 - a short alias: the message is built from its keys below
    committed = _checkpoints(records)
    extra: dict[str, Any] = {T.CHECKPOINTS: committed} if committed else {}
    last = _last_step(records)
    if last is not None:
        extra[T.LAST_STEP] = last
    if agent_hang is not None:
        code = int(ExitCode.HANG)
        return code, {T.CODE: code, T.REASON: classify_exit(code).reason, T.MESSAGE: agent_hang, **extra}
    if returncode == 0:
        return 0, {T.CODE: 0, T.REASON: "Completed", **extra}
    best = exitrecord.most_significant(records)
    explained = best is not None and best["code"] != 0 and (
        best["code"] == ExitCode.HANG or classify_exit(int(best["code"])).failure_class == FailureClass.PERMANENT)
    if oom is not None and oom[0] > 0 and not explained:
        kills, memory = oom
        code = 128 + int(signal.SIGKILL)
        extra[T.OOM] = {"kills": kills, "peakBytes": memory.peak_bytes, "limitBytes": memory.limit_bytes}
        said = (f"the kernel's OOM killer ended a rank ({kills} kill{'s' if kills != 1 else ''} in this container): "
                + oom_words.figures(memory.peak_bytes, memory.limit_bytes))
        return code, {T.CODE: code, T.REASON: oom_words.REASON, T.MESSAGE: said, **extra}
    if best is not None and best["code"] != 0:
        code = int(best["code"])
        return code, {T.CODE: code, T.REASON: classify_exit(code).reason, T.RANK: best["rank"],
                      T.STEP: best.get("step"), T.MESSAGE: best.get("message", "")[:2000], **extra}
    code = 128 - returncode if returncode < 0 else returncode
    said = "torchrun exited without an exit record" + (f": {torchrun_error[:1500]}" if torchrun_error else "")
    return code, {T.CODE: code, T.REASON: classify_exit(code).reason, T.MESSAGE: said, **extra}


def _checkpoints(records: list[dict]) -> dict[str, int]:
    """Tier -> the newest committed step any local rank saw (the node leader knows tier
    1, global rank 0 the job-wide tiers)."""
    out: dict[str, int] = {}
    for record in records:
        for tier, step in (record.get("checkpoints") or {}).items():
            if isinstance(step, int):
                out[tier] = max(step, out.get(tier, step))
    return out


def _last_step(records: list[dict]) -> dict[str, Any] | None:
    """The newest step a local rank finished and its agreed loss (every rank agreed the
    same one), or None when no record has one."""
    known = [(r["step"], r["loss"]) for r in records
             if isinstance(r.get("step"), int) and isinstance(r.get("loss"), float) and math.isfinite(r["loss"])]
    if not known:
        return None
    step, loss = max(known, key=lambda pair: pair[0])
    return {"step": step, "loss": loss}


def max_restarts(command: list[str]) -> int | None:
    """torchrun's ``--max-restarts`` (either spelling, ``=`` or a separate value), or None."""
    value = torchrun_flag(command, "--max-restarts")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def local_world_size(command: list[str], tracker: AttemptTracker) -> int:
    """torchrun's ``--nproc-per-node`` when it is a number, else what the tracker saw."""
    value = torchrun_flag(command, "--nproc-per-node")
    return int(value) if value is not None and value.isdigit() else tracker.local_world_size


def check_network(command: list[str], env: dict[str, str]) -> str | None:
    """The pre-flight check (``preflight.py``): why this node may not join, or None."""
    floor = preflight.floor_mbps(env)
    address = leases.lease_port(command) if floor > 0 else None  # the store's echo
    if address is None:
        return None
    result = preflight.measure(address, token=env.get(Env.RDZV_TOKEN), enough=floor * preflight.MB)
    if result.skipped is not None:
        print(f"llmtrain launcher: pre-flight check skipped: {result.skipped}", file=sys.stderr, flush=True)
        return None
    print(f"llmtrain launcher: pre-flight: {result.mbps():.1f} MB/s through the rendezvous store at {result.endpoint} "
          f"(floor {floor:g}; the best of {result.rounds} rounds)", file=sys.stderr, flush=True)
    return preflight.verdict(result, floor)


def refuse(why: str, termination_log: Path) -> int:
    """Exit ``PREFLIGHT_FAILED`` before torchrun starts, saying why."""
    code = int(ExitCode.PREFLIGHT_FAILED)
    message = {Termination.CODE: code, Termination.REASON: classify_exit(code).reason, Termination.MESSAGE: why}
    try:
        termination_log.write_text(json.dumps(message))
    except OSError:
        pass  # outside Kubernetes there may be no termination log; the exit code suffices
    print(f"llmtrain launcher: {why}; pod exit code {code}", file=sys.stderr, flush=True)
    return code


def healing_store(command: list[str]) -> str | None:
    """``host:port/run`` of the job's rendezvous store for a built-in trainer whose config
    asks for in-process healing; None otherwise (or when the config cannot be read: the
    trainer reads it again and says what is wrong)."""
    from llmtrain_trainer.launch.prefetch import config_of  # noqa: PLC0415 - a user script's bundle has no prefetch

    path = config_of(command)
    endpoint, run = torchrun_flag(command, "--rdzv-endpoint"), torchrun_flag(command, "--rdzv-id")
    if path is None or not endpoint or not run:
        return None
    try:
        import yaml  # noqa: PLC0415
        from llmtrain_contract.config import TrainerConfig  # noqa: PLC0415

        with open(path) as fh:
            cfg = TrainerConfig.model_validate(yaml.safe_load(fh) or {})
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    return f"{endpoint}/{run}" if cfg.fault_tolerance.in_process_healing else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m llmtrain_trainer.launch.launcher [--run-dir DIR] [--termination-log PATH] [--health-port N] "
              "[--health-host ADDR] -- torchrun ...",
              file=sys.stderr)
        return 64
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="llmtrain_trainer.launch.launcher")
    parser.add_argument("--run-dir", default=os.environ.get(Env.RUN_DIR, "/tmp/llmtrain"))
    parser.add_argument("--termination-log", default=os.environ.get(Env.TERMINATION_LOG, TERMINATION_LOG))
    parser.add_argument("--health-port", type=int, default=0, help="serve /healthz for a liveness probe here (0: off)")
    parser.add_argument("--health-host", default="", help="the address to serve it on (default: every interface, as a pod needs)")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    run_dir = Path(args.run_dir)
    started = time.time()

    env = dict(os.environ)
    # torch >= 2.4 lets the rank-0 *agent* host the workers' TCPStore and reuses it across
    # restarts, so a restarted worker group can read the previous attempt's gloo
    # addresses and fail with "connectFullMesh ... Connection refused". Without sharing,
    # worker rank 0 hosts a fresh store per attempt. The rendezvous itself stays on the
    # job's external store, so no node is a single point of failure either way.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env[Env.SUPERVISED] = "1"
    # torchrun's agent records its own exception here (workers get files of their own).
    if "TORCHELASTIC_ERROR_FILE" not in env:
        env["TORCHELASTIC_ERROR_FILE"] = str(run_dir / ERROR_FILE)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / ERROR_FILE).unlink(missing_ok=True)  # an earlier container's
        except OSError:
            pass  # then torchrun cannot write it either, and the message says less
    error_file = Path(env["TORCHELASTIC_ERROR_FILE"])
    supervisor = Supervisor(run_dir, started=started)
    tracker = AttemptTracker(run_dir, max_restarts=max_restarts(command))
    memory = memcg.Watch.start()
    try:
        health = serve_health(args.health_port, supervisor, tracker, args.health_host, memory) if args.health_port else None
    except OSError as err:
        print(f"llmtrain launcher: cannot serve /healthz on port {args.health_port}: {err}", file=sys.stderr, flush=True)
        return int(ExitCode.CONFIG_ERROR)
    # One torch import per pod, not one per rank and restart (zygote.py). A user may opt
    # out with LLMTRAIN_ZYGOTE=0; a user's script never gets one.
    builtin = zygote.runs_builtin_trainer(command)
    # A node without the job's newest checkpoint in tier 1 starts pulling it now, while
    # torch imports and the rendezvous forms (prefetch.py). LLMTRAIN_PREFETCH=0 opts out.
    if builtin and env.get(Env.PREFETCH) != "0":
        # Imported here: a user script's bundle (bundle.py) has neither the store nor yaml.
        from llmtrain_trainer.launch import prefetch  # noqa: PLC0415

        prefetch.start(command)
    server = zygote.start() if env.get(Env.ZYGOTE) != "0" and builtin else None
    if builtin:
        # Its ranks stamp their first step into the heartbeat files: a re-formed group
        # admits a waiting node only after one step (torchrun_agent.admit_after_first_step).
        env[Env.ADMIT_AFTER_FIRST_STEP] = str(run_dir)
        heal_store = healing_store(command)
        if heal_store is not None:
            # In-process healing: the ranks form their groups in the job's store, and
            # torchrun's agent restarts a rank that failed on its own in place
            # (torchrun_agent.restart_in_place); a victim's exit restarts as before.
            env[Env.HEAL_STORE] = heal_store
            env[Env.VICTIM_EXIT_CODES] = str(int(ExitCode.COLLECTIVE_TIMEOUT))
    if server is not None:
        env[Env.ZYGOTE] = server.socket
    # torchrun_agent.stop_on_permanent_exit: a permanent exit is never restarted in place.
    env[Env.PERMANENT_EXIT_CODES] = ",".join(str(int(code)) for code in ExitCode
                                             if classify_exit(code).failure_class == FailureClass.PERMANENT)
    supervisor.start()  # before the pre-flight check: /healthz answers while it runs
    refused = check_network(command, env)
    if refused is not None:
        supervisor.stop()
        if server is not None:
            server.stop()
        if health is not None:
            health.shutdown()
        return refuse(refused, Path(args.termination_log))
    child = subprocess.Popen(agent_command(command), env=env)
    def forward(signum: int, _frame) -> None:
        # os.write, not print: a buffered stream is not reentrant inside a handler.
        os.write(2, f"llmtrain launcher: {signal.Signals(signum).name}: passed to torchrun (pid {child.pid})\n".encode())
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    supervisor.agent_pid = tracker.agent_pid = child.pid
    # While this pod lives, the store knows its agent: a pod that dies leaves the
    # rendezvous at once, not when the agent's keep-alive lapses (leases.py).
    lease = leases.hold(command, child.pid, env.get(Env.RDZV_TOKEN))
    returncode = wait_for(child)
    if lease is not None:
        lease.close()
    supervisor.stop()
    if server is not None:
        server.stop()
    if health is not None:
        health.shutdown()

    # Ended for a permanent exit: torchrun may have begun the next attempt meanwhile.
    attempt = supervisor.permanent[0] if supervisor.permanent is not None else exitrecord.latest_attempt(run_dir)
    records = [r for r in exitrecord.read_attempt(run_dir, attempt)] if attempt is not None else []
    records = [r for r in records if r.get("time", 0) >= started]  # ignore an older container's
    # A local rank of the last attempt without a record (or no rank's record at all) died
    # of a signal, and the agent recorded no exception of its own (torch's @record writes
    # none for a child killed by a signal; it does for a failed rendezvous): the OOM
    # killer's, if it killed since the launcher started. A kill in an earlier attempt of
    # this container was a crash in place, counted then; it can only be told apart by
    # time, which the cgroup does not keep.
    torchrun_error = agent_error(error_file) if returncode else None
    silent = len({r.get("local_rank") for r in records}) < local_world_size(command, tracker) and torchrun_error is None
    figures = memory.now() if memory is not None else None  # read once: the message's two uses agree
    oom = figures if returncode != 0 and silent else None
    code, message = decide(returncode, records, supervisor.agent_hang, torchrun_error, oom)
    if code == ExitCode.HANG and attempt is not None and tracker.counted_early(attempt):
        message[Termination.COUNTED_IN_PLACE] = tracker.failed_attempts()["hang"]
    # The in-place restarts and the memory figures, for an operator that had no scrape
    # between the last of them and the pod's end.
    if attempt is not None:
        message[Termination.FAILED_ATTEMPTS] = exitrecord.failed_attempts(run_dir, attempt, local_world_size(command, tracker))
    if figures is not None:
        message[Termination.MEMORY] = {"oomKills": figures[0], "peakBytes": figures[1].peak_bytes,
                                       "limitBytes": figures[1].limit_bytes}
    try:
        Path(args.termination_log).write_text(json.dumps(message))
    except OSError:
        pass  # outside Kubernetes there may be no termination log; the exit code suffices
    print(f"llmtrain launcher: torchrun exited {returncode}; pod exit code {code} ({message[Termination.REASON]})",
          file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
