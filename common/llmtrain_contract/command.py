"""Command lines for the rendezvous store, torchrun and the launcher.

Pure functions, import-light: the operator renders pod commands with them, the local
runner and the tests start processes with them, so all three agree on the flags.
"""

from __future__ import annotations

from .names import RDZV_PORT
KEEP_ALIVE_SECONDS = 1
KEEP_ALIVE_MAX_MISSED = 3
"""A node that stops renewing its rendezvous keep-alive for ~3 s is dropped from the
round. torch's defaults (5 s x 3) make every survivor of a dead node wait 15 s before it
can re-rendezvous."""
MONITOR_INTERVAL_SECONDS = 0.25
"""How often each torchrun agent polls its ranks and asks the store whether a node waits to
join: a failed rank or a replacement node costs up to this much before the group restarts.
torch's 0.1 s would put ten rendezvous-state reads a second per node on the job's store."""


STORE = ("-m", "llmtrain_trainer.rendezvous.store")
LAUNCHER = ("-m", "llmtrain_trainer.launch.launcher")
SCRIPT_RUNNER = ("-m", "llmtrain_trainer.train.script")
"""How Python runs each from an image that has this project installed. For an image
without it, the operator passes the paths of the copies an init container made
(``llmtrain_trainer.launch.bundle``)."""


def store_command(python: str, port: int = RDZV_PORT, host: str = "0.0.0.0", entry: tuple[str, ...] = STORE,
                  run_id: str | None = None) -> list[str]:
    """The rendezvous store's command; ``run_id``: the only rendezvous whose leases it
    accepts (the job's ``--rdzv-id``)."""
    return [python, *entry, "--host", host, "--port", str(port), *(["--run-id", run_id] if run_id else [])]


def torchrun_args(
    *,
    nnodes_min: int,
    nnodes_max: int,
    nproc_per_node: int,
    rdzv_endpoint: str,
    rdzv_id: str,
    max_restarts: int,
    join_timeout_seconds: int = 600,
    last_call_seconds: int = 1,
    monitor_interval_seconds: float = MONITOR_INTERVAL_SECONDS,
) -> list[str]:
    """torchrun's flags for an elastic c10d rendezvous on an *external* store.

    ``is_host=false``: no agent hosts the store, so any node, rank 0's included, can die
    without taking the rendezvous down. ``last_call`` is short so that a shrunken group
    restarts in seconds instead of waiting for stragglers, and a short keep-alive drops a
    dead node from the rendezvous within seconds.
    """
    nnodes = f"{nnodes_min}:{nnodes_max}" if nnodes_min != nnodes_max else str(nnodes_max)
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host=false,join_timeout={join_timeout_seconds},last_call_timeout={last_call_seconds},"
        f"keep_alive_interval={KEEP_ALIVE_SECONDS},keep_alive_max_attempt={KEEP_ALIVE_MAX_MISSED}",
        f"--max-restarts={max_restarts}",
        f"--monitor-interval={monitor_interval_seconds}",
    ]


def torchrun_flag(command: list[str], name: str) -> str | None:
    """The value of torchrun's flag ``name`` (``--a-b``) in ``command``: ``--a-b=value``
    or ``--a-b value``, either spelling (``--a_b``); None when absent."""
    spellings = {name, "--" + name[2:].replace("-", "_")}
    for i, arg in enumerate(command):
        key, eq, value = arg.partition("=")
        if key in spellings:
            return value if eq else (command[i + 1] if i + 1 < len(command) else None)
    return None


def trainer_program(config_path: str) -> list[str]:
    return ["-m", "llmtrain_trainer", "--config", config_path]


def script_program(command: list[str], args: list[str] | None = None, runner: tuple[str, ...] = SCRIPT_RUNNER) -> list[str]:
    """torchrun's program for a user's script: the script runner (``script.py``: the
    script's exit code and exception reach the job's status) in front of ``command``.
    A command that starts with a torchrun flag other than ``-m`` (``--no-python``: not a
    Python script) is passed on as it is."""
    program = [*command, *(args or [])]
    if program and program[0].startswith("-") and program[0] != "-m":
        return program
    return [*runner, *program]


def worker_command(python: str, run_dir: str, torchrun: list[str], program: list[str], termination_log: str | None = None,
                   health_port: int | None = None, health_host: str | None = None,
                   entry: tuple[str, ...] = LAUNCHER) -> list[str]:
    """The full worker command: launcher -> torchrun -> program."""
    launcher = [python, *entry, "--run-dir", run_dir]
    if termination_log:
        launcher += ["--termination-log", termination_log]
    if health_port:
        launcher += ["--health-port", str(health_port)]
        if health_host:
            launcher += ["--health-host", health_host]
    return [*launcher, "--", python, "-m", "torch.distributed.run", *torchrun, *program]
