"""Runs a user's training script as one rank and records why it exited.

``torchrun <flags> -m llmtrain_trainer.train.script /app/train.py args...`` (or ``-m
mypkg.train args...``): the script runs in this very process, as ``python
/app/train.py`` or ``python -m mypkg.train`` would run it (``__main__``, its own
``sys.argv`` and ``sys.path[0]``), so nothing changes for the script: no import from this
project, no wrapper around its signals, its pid is the rank's.

What it adds is the rank's exit record (``exitrecord.py``), which torchrun's own exit
code 1 would otherwise hide: the script's exit code (``sys.exit(64)`` is a permanent
config error, exactly as for the built-in trainer: ``llmtrain exit-codes``), and for an
uncaught exception its type, text and where it was raised, which the launcher puts into
the pod's termination message and the operator into the job's status and Events. An
exception that says a peer failed (a broken collective, ``peers.py``) makes the rank a
victim (exit 83), as in the built-in trainer, so that one lost rank is charged once, not
once more per survivor; one that says CUDA's allocator ran out of GPU memory exits 88 with
the GPU's figures (``gpumem.py``). It also gives each local rank its own ``LLMTRAIN_PROGRESS_FILE``
(``progress.py``).

A rank killed by a signal or ended with ``os._exit`` writes no record; the launcher then
reports the signal or torchrun's code, as for any process.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from llmtrain_contract.exitcodes import ExitCode
from llmtrain_contract.names import Env

from llmtrain_trainer.pod import exitrecord
from llmtrain_trainer.pod import progress
from llmtrain_trainer.train import gpumem
from llmtrain_trainer.train.peers import is_collective_failure

USAGE = "usage: python -m llmtrain_trainer.train.script (SCRIPT | -m MODULE) [ARGS...]"


def _identity() -> tuple[int, int, int]:
    """(attempt, rank, local rank), from torchrun's environment."""
    env = os.environ
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0")), int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))


def exit_code(err: SystemExit) -> tuple[int, str]:
    """What ``sys.exit(x)`` means to the interpreter: None is 0, an int is itself, anything
    else is printed and is 1."""
    if err.code is None:
        return 0, ""
    if isinstance(err.code, int):
        code = err.code & 0xFF  # what the process's parent sees
        return code, f"the script exited with code {code}" if code else ""
    return 1, str(err.code)


def describe(err: BaseException) -> str:
    """``ValueError: bad shape at /app/train.py:42 in step()``: the innermost frame of the
    script's traceback, which is where a user looks first."""
    return f"{type(err).__name__}: {err}".strip().rstrip(":") + where(err)


def where(err: BaseException) -> str:
    """`` (at /app/train.py:42 in step)``, or nothing without a traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""


def _last_step(run_dir: Path, local_rank: int) -> int | None:
    try:
        line = progress.rank_file(run_dir, local_rank).read_text().strip().splitlines()[-1].strip()
    except (OSError, IndexError):
        return None
    return int(line) if line.isdigit() else None


def run(argv: list[str]) -> int:
    """Run the script; returns its exit code (the caller exits with it)."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        return 64
    attempt, rank, local_rank = _identity()
    run_dir = Path(os.environ[Env.RUN_DIR]) if os.environ.get(Env.RUN_DIR) else None
    if run_dir is not None:
        exitrecord.mark_started(run_dir, attempt, local_rank)
        own = progress.rank_file(run_dir, local_rank)
        own.parent.mkdir(parents=True, exist_ok=True)
        os.environ[Env.PROGRESS_FILE] = str(own)
    code, message = 0, ""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0]
            sys.path[0] = os.getcwd()  # as `python -m` does
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)  # as `python script.py` does
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as err:
        code, message = exit_code(err)
        if code and message and not isinstance(err.code, int):
            print(message, file=sys.stderr)
    except BaseException as err:  # noqa: BLE001 - whatever ends the script is reported, then exits nonzero as Python would
        traceback.print_exc()
        if is_collective_failure(err):
            # A peer died or froze: this rank is a victim, and the failure is charged
            # where it happened, not once more per survivor (exitrecord.attempt_cause).
            # First: a collective that broke while the script handled an OOM has it as context.
            code, message = int(ExitCode.COLLECTIVE_TIMEOUT), f"victim: a peer failed: {describe(err)}"
        elif (oom := gpumem.out_of_memory(err)) is not None:
            # Named apart from a crash (docs/exit-codes.md); where the script raised it, as for any exception.
            code = int(ExitCode.GPU_OUT_OF_MEMORY)
            message = gpumem.message(rank, oom, gpumem.figures(oom)) + where(err)
        else:
            code, message = 1, describe(err)
    if run_dir is not None:
        try:
            exitrecord.write(run_dir, attempt, rank, local_rank, code, message, _last_step(run_dir, local_rank))
        except OSError as err:
            print(f"llmtrain script runner: cannot write the exit record: {err}", file=sys.stderr)
    return code


def main() -> None:
    code = run(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
