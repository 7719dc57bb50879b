"""The arguments of ``llmtrain run``, apart from its code: building the CLI's parser (also
for ``llmtrain --help`` and ``llmtrain validate``) must not import what only a run needs
(the trainer extra: torch, prometheus-client, tqdm, matplotlib)."""

from __future__ import annotations

import argparse
import sys

EXTRA = "trainer"


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a job locally with torchrun (CPU/gloo or local GPUs), no cluster")
    p.add_argument("file", help="a YAML file holding one LLMTrainJob")
    p.add_argument("--workdir", help="where nodes, checkpoints and logs go (default: runs/<job name>)")
    p.add_argument("--fresh", action="store_true", help="delete the workdir first (otherwise resume from its checkpoints)")
    p.add_argument("--inject", metavar="FAULTS",
                   help="TEST ONLY: trainer faults, e.g. 'crash@step=20,rank=1' (see llmtrain_trainer.train.faults)")
    p.add_argument("--kill-node", metavar="SLOT@STEP", action="append", default=[],
                   help="TEST ONLY: SIGKILL every process of node SLOT once the job reaches STEP (repeatable)")
    p.add_argument("--freeze-node", metavar="SLOT@STEP", action="append", default=[],
                   help="TEST ONLY: SIGSTOP every process of node SLOT once the job reaches STEP (repeatable)")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    p.add_argument("--no-progress", action="store_true",
                   help="plain lines instead of a progress bar: each Event, and the step and state every 10 s")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Loads the runner only now; on an install without the trainer extra, says which
    package is missing and how to get it instead of a traceback."""
    try:
        from . import cli  # noqa: PLC0415 - only a run needs what it imports

        return cli.cmd_run(args)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0].startswith("llmtrain_"):
            raise  # our own module missing is a bug, not an install to complete
        print(f"llmtrain run: needs the '{EXTRA}' extra ({err.name} is not installed): "
              f"pip install 'llmtrain-operator[{EXTRA}]'", file=sys.stderr)
        return 1
