"""``llmtrain logs JOB [-f] [--pod POD | --failed [N]]``: the job's step log, which is
global rank 0's, through the API server. Rank 0 moves when pods are replaced (the status
says where it is now, ``status.rankZero``); with ``-f`` the command follows it from pod to
pod until the job ends, saying each time it moves. ``--failed N``: the log of the N-th
newest failed pod the job keeps (``status.keptPods``), as it ended."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from .api.vocabulary import TERMINAL_PHASES
from .jobread import Unreadable, connect, read_job
from .planner.names import TRAINER_CONTAINER as TRAINER

POLL_SECONDS = 2.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="a job's step log (global rank 0's pod), following it across replaced pods with -f")
    p.add_argument("job", metavar="JOB", help="the LLMTrainJob's name")
    p.add_argument("-n", "--namespace", default="default", help="the job's namespace (default: default)")
    p.add_argument("-f", "--follow", action="store_true", help="follow rank 0 from pod to pod until the job ends")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--pod", help="this worker pod's log instead of rank 0's (its trainer container)")
    which.add_argument("--failed", type=int, nargs="?", const=1, metavar="N",
                       help="the log of the N-th newest failed pod the job keeps (default 1: the last to fail; status.keptPods, "
                            "after the pod that failed a failed job)")
    p.set_defaults(func=run)


def kept_pod(status: dict[str, Any], nth: int) -> tuple[str | None, str]:
    """The ``nth`` newest failed pod the job keeps (1: the last), or None and why not. A
    job that failed keeps the pod that failed it as it is (not labelled kept): it counts
    first."""
    kept = [p for p in status.get("keptPods") or [] if isinstance(p, str)]
    last = (status.get("lastFailure") or {}).get("pod")
    if status.get("phase") == "Failed" and isinstance(last, str) and last and last not in kept:
        kept.insert(0, last)
    if nth < 1:
        return None, f"--failed counts from 1 (the last pod to fail), not {nth}"
    if len(kept) < nth:
        listed = f": {', '.join(kept)}" if kept else ""
        return None, (f"the job keeps {len(kept)} failed pod(s){listed} (status.keptPods, faultTolerance.keepFailedPods); "
                      f"there is no #{nth}")
    return kept[nth - 1], f"----- failed pod {kept[nth - 1]}: its log as it ended -----"


def follow(read_job: Callable[[], dict[str, Any]], read_log: Callable[[str, str, bool], Iterator[bytes]],
           write: Callable[[bytes], None], say: Callable[[str], None], keep_following: bool, pod: str | None = None,
           sleep: Callable[[float], None] = time.sleep, identify: Callable[[str], str | None] = lambda name: None,
           failed: int | None = None) -> int:
    """Print rank 0's log (or ``pod``'s, or the ``failed``-th newest kept failed pod's,
    ``kept_pod``); with ``keep_following``, on until the job has
    ended: a stream that ends early (the pod replaced, a dropped connection) is opened
    again, on rank 0's new pod if it moved, and what was printed already is skipped (a
    container's log only grows); a transient failure to read the job is retried. The exit
    code: 1 when the job or a log could not be read.

    ``identify``: a pod's uid (None when it cannot be read). A replaced pod keeps its name,
    and the new one's log starts afresh: what was printed is counted per pod *object*, so
    the new attempt's log is printed from its first byte, after a line saying so."""
    printed: dict[tuple[str, str | None], int] = {}
    uids: dict[str, str | None] = {}
    current: str | None = None
    last_said = ""
    while True:
        try:
            job = read_job()
        except Unreadable as err:
            if str(err) != last_said:
                say(str(err))
                last_said = str(err)
            if not (keep_following and err.transient):
                return 1
            sleep(POLL_SECONDS)
            continue
        status = job.get("status") or {}
        if failed is not None:
            # A kept pod has ended: its log is read once, whole, and not followed.
            pod, line = kept_pod(status, failed)
            say(line)
            if pod is None:
                return 1
            failed, keep_following = None, False
        ended = status.get("phase") in TERMINAL_PHASES
        where = {"pod": pod, "container": TRAINER} if pod else status.get("rankZero")
        if not where:
            if not keep_following or ended:
                say("no pod holds global rank 0 (status.rankZero is empty: the job has not trained)"
                    + ("; -f waits for one" if not ended else ""))
                return 1
        else:
            name = where["pod"]
            if current is not None and name != current:
                say(f"----- rank 0 moved: pod {name} (the job restarted) -----")
            current = name
            uid = identify(name) or uids.get(name)
            if uids.get(name) is not None and uid != uids[name]:
                say(f"----- pod {name} was replaced: its new attempt's log -----")
            uids[name] = uid
            failure = _stream(read_log(name, where.get("container", TRAINER), keep_following and not ended), name, (name, uid),
                              printed, write)
            if failure is not None:
                if failure != last_said:
                    say(failure)
                    last_said = failure
                if not keep_following or ended:
                    return 1
        if not keep_following or ended:
            return 0
        sleep(POLL_SECONDS)


def _stream(chunks: Iterator[bytes], pod: str, key: tuple[str, str | None], printed: dict[tuple[str, str | None], int],
            write: Callable[[bytes], None]) -> str | None:
    """Copy a log to ``write`` past the bytes of it printed before (``printed[key]``, key
    naming the pod object); why it failed, or None. Only reading is guarded: a failed
    write (a closed pipe) ends the command."""
    skip = printed.get(key, 0)
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            return None
        except Exception as err:  # noqa: BLE001 - the API's and the network's errors: said, and the read retried
            return f"cannot read the log of pod {pod}: {err}"
        if skip:
            cut = min(skip, len(chunk))
            chunk, skip = chunk[cut:], skip - cut
        if chunk:
            write(chunk)
            printed[key] = printed.get(key, 0) + len(chunk)


def run(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(f"llmtrain logs: {line}", file=sys.stderr, flush=True)

    try:
        k8s = connect()
    except Unreadable as err:
        say(str(err))
        return 1

    def write(chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()

    try:
        return follow(lambda: read_job(k8s, args.namespace, args.job),
                      lambda pod, container, f: k8s.pod_log(args.namespace, pod, container, f), write, say, args.follow, args.pod,
                      identify=lambda pod: k8s.pod_uid(args.namespace, pod), failed=args.failed)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): done, as any filter would be
        return 0
