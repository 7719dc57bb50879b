"""``llmtrain logs JOB [-f] [--pod POD]``: the job's step log, which is global rank 0's,
through the API server. Rank 0 moves when pods are replaced (the status says where it is
now, ``status.rankZero``); with ``-f`` the command follows it from pod to pod until the
job ends, saying each time it moves."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from .api.job import GROUP, PLURAL, VERSION
from .api.vocabulary import TERMINAL_PHASES

POLL_SECONDS = 2.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="a job's step log (global rank 0's pod), following it across replaced pods with -f")
    p.add_argument("job", metavar="JOB", help="the LLMTrainJob's name")
    p.add_argument("-n", "--namespace", default="default", help="the job's namespace (default: default)")
    p.add_argument("-f", "--follow", action="store_true", help="follow rank 0 from pod to pod until the job ends")
    p.add_argument("--pod", help="this worker pod's log instead of rank 0's (its trainer container)")
    p.set_defaults(func=run)


def follow(read_job: Callable[[], dict[str, Any] | None], read_log: Callable[[str, str, bool], Iterator[bytes]],
           write: Callable[[bytes], None], say: Callable[[str], None], keep_following: bool, pod: str | None = None,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """Print rank 0's log (or ``pod``'s); with ``keep_following``, rank 0's next pod's too
    whenever it moves, until the job is finished. The exit code."""
    shown: str | None = None
    last_said = ""
    while True:
        job = read_job()
        if job is None:
            return 1
        status = job.get("status") or {}
        where = {"pod": pod, "container": "trainer"} if pod else status.get("rankZero")
        if not where:
            if not keep_following:
                say("no pod holds global rank 0 yet (status.rankZero is empty: the job has not trained); -f waits for one")
                return 1
        elif where["pod"] != shown:
            if shown is not None:
                say(f"----- rank 0 moved: pod {where['pod']} (the job restarted) -----")
            shown = where["pod"]
            try:
                for chunk in read_log(where["pod"], where.get("container", "trainer"), keep_following):
                    write(chunk)
            except Exception as err:  # noqa: BLE001 - a pod gone meanwhile: the next read says where rank 0 is
                why = f"cannot read the log of pod {where['pod']}: {err}"
                if why != last_said:
                    say(why)
                    last_said = why
                if not keep_following or status.get("phase") in TERMINAL_PHASES:
                    return 1
                shown = None  # try it (or its successor) again
        if not keep_following or pod or status.get("phase") in TERMINAL_PHASES:
            return 0
        sleep(POLL_SECONDS)


def run(args: argparse.Namespace) -> int:
    try:
        from .k8s.client import K8s  # noqa: PLC0415 - the operator extra
    except ModuleNotFoundError as err:
        print(f"llmtrain logs: {err.name} is not installed (pip install 'llmtrain-operator[operator]')", file=sys.stderr)
        return 1
    try:
        k8s = K8s.from_environment()
    except Exception as err:  # noqa: BLE001 - no kubeconfig: said in words, no traceback
        print(f"llmtrain logs: cannot reach the API server: {type(err).__name__}: {err}", file=sys.stderr)
        return 1

    def read_job() -> dict[str, Any] | None:
        try:
            served, job = k8s.read_object(f"{GROUP}/{VERSION}", PLURAL, args.namespace, args.job)
        except Exception as err:  # noqa: BLE001 - said by its reason
            print(f"llmtrain logs: cannot read LLMTrainJob {args.namespace}/{args.job}: {err}", file=sys.stderr)
            return None
        if not served or job is None:
            print(f"llmtrain logs: no LLMTrainJob {args.job} in namespace {args.namespace}", file=sys.stderr)
            return None
        return job

    def write(chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()

    def say(line: str) -> None:
        print(f"llmtrain logs: {line}", file=sys.stderr, flush=True)

    try:
        return follow(read_job, lambda pod, container, f: k8s.pod_log(args.namespace, pod, container, f), write, say,
                      args.follow, args.pod)
    except KeyboardInterrupt:
        return 130
