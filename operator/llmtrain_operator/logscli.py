"""``llmtrain logs JOB [-f] [--rank R | --pod POD | --failed [N]] [--attempt N]``: the
job's step log, which is global rank 0's, through the API server. A rank moves when pods
are replaced (the status says where each is now, ``status.rankZero`` and
``status.ranks``); with ``-f`` the command follows it from pod to pod until the job ends,
saying each time it moves. ``--rank R``: the log of the pod holding global rank R.
``--failed N``: the log of the N-th newest failed pod the job keeps (``status.keptPods``),
as it ended. ``--attempt N``: the N-th pod of the worker slot that holds the rank (or
``--pod``): each replacement of a slot's pod is a new attempt with a name of its own
(``<job>-worker-<slot>-<N>``; attempt 0 is ``<job>-worker-<slot>``), and a failed one is
kept with its log."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from .api.observed import LABEL_INCARNATION, LABEL_JOB, LABEL_KEPT, LABEL_ROLE, LABEL_SLOT, ROLE_WORKER
from .api.vocabulary import TERMINAL_PHASES
from .jobread import Unreadable, connect, read_job
from .planner.names import TRAINER_CONTAINER as TRAINER

POLL_SECONDS = 2.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="a job's step log (global rank 0's pod), following it across replaced pods with -f")
    p.add_argument("job", metavar="JOB", help="the LLMTrainJob's name")
    p.add_argument("-n", "--namespace", default="default", help="the job's namespace (default: default)")
    p.add_argument("-f", "--follow", action="store_true", help="follow the rank (0 unless --rank) from pod to pod until the job ends")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, metavar="R",
                       help="the log of the pod holding global rank R now (default 0; status.ranks), followed across replacements with -f")
    which.add_argument("--pod", help="this worker pod's log instead of rank 0's (its trainer container)")
    which.add_argument("--failed", type=int, nargs="?", const=1, metavar="N",
                       help="the log of the N-th newest failed pod the job keeps (default 1: the last to fail; status.keptPods, "
                            "after the pod that failed a failed job)")
    p.add_argument("--attempt", type=int, metavar="N",
                   help="the N-th pod of the worker slot holding the rank (or --pod), counting from 0: each replaced pod "
                        "is an attempt (named <job>-worker-<slot>-<N>); a failed one is kept with its log")
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


def rank_holder(status: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """Where global ``rank`` runs now: ``{"pod", "container"}`` from the status (rank 0's
    own field first), or None."""
    if rank == 0 and isinstance(status.get("rankZero"), dict) and isinstance(status["rankZero"].get("pod"), str):
        return status["rankZero"]
    for held in status.get("ranks") or []:
        if not isinstance(held, dict) or not isinstance(held.get("pod"), str):
            continue
        first, last = held.get("first"), held.get("last")
        if isinstance(first, int) and isinstance(last, int) and first <= rank <= last:
            return {"pod": held["pod"], "container": TRAINER}
    return None


def no_holder(status: dict[str, Any], rank: int) -> str:
    """Why no pod can be named for ``rank``, in words."""
    if rank == 0 and not status.get("ranks"):
        return "no pod holds global rank 0 (status.rankZero is empty: the job has not trained)"
    world = status.get("worldSize")
    return (f"no pod holds global rank {rank} now (status.ranks"
            + (f"; world size {world}, ranks 0-{world - 1}" if isinstance(world, int) and world > 0 else ": empty")
            + ")")


def attempt_pod(status: dict[str, Any], pods: list[dict[str, Any]], attempt: int, rank: int,
                pod: str | None) -> tuple[str | None, str, bool]:
    """The pod of ``attempt`` of the worker slot that ``pod`` (or, without it, the holder
    of global ``rank``) belongs to, a line saying which, and whether it has ended (its log
    is whole); or None and why not. ``pods``: the job's worker pods as the API server
    lists them (the slot and attempt from their labels; a label that is not a number is
    not believed)."""
    if attempt < 0:
        return None, f"--attempt counts from 0 (a slot's first pod), not {attempt}", True
    anchor = pod
    if anchor is None:
        holder = rank_holder(status, rank)
        if holder is None:
            return None, no_holder(status, rank), True
        anchor = holder["pod"]
    named = [p for p in pods if isinstance((p.get("metadata") or {}).get("name"), str)]
    labels = {p["metadata"]["name"]: p["metadata"].get("labels") or {} for p in named}
    phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in named}
    slot = labels.get(anchor, {}).get(LABEL_SLOT)
    if slot is None:
        return None, f"pod {anchor} is not one of the job's worker pods", True
    attempts: dict[int, str] = {}
    for name, own in labels.items():
        number = own.get(LABEL_INCARNATION, "0")
        if own.get(LABEL_SLOT) == slot and number.isascii() and number.isdigit():
            attempts[int(number)] = name
    if attempt not in attempts:
        left = ", ".join(f"{n} ({attempts[n]})" for n in sorted(attempts)) or "none"
        return None, (f"worker slot {slot} has no attempt {attempt} left: it has {left}. A failed pod is kept up to "
                      f"faultTolerance.keepFailedPods; one lost with its node, deleted or replaced for another reason "
                      f"went with its log"), True
    chosen = attempts[attempt]
    phase = phases.get(chosen) or "Unknown"
    state = f"{phase}, kept" if labels[chosen].get(LABEL_KEPT) == "true" else phase
    return chosen, f"----- pod {chosen}: attempt {attempt} of worker slot {slot} ({state}) -----", phase in ("Succeeded", "Failed")


def follow(read_job: Callable[[], dict[str, Any]], read_log: Callable[[str, str, bool], Iterator[bytes]],
           write: Callable[[bytes], None], say: Callable[[str], None], keep_following: bool, pod: str | None = None,
           sleep: Callable[[float], None] = time.sleep, identify: Callable[[str], str | None] = lambda name: None,
           failed: int | None = None, rank: int = 0) -> int:
    """Print global ``rank``'s log (or ``pod``'s, or the ``failed``-th newest kept failed
    pod's, ``kept_pod``); with ``keep_following``, on until the job has
    ended: a stream that ends early (the pod replaced, a dropped connection) is opened
    again, on the rank's new pod if it moved, and what was printed already is skipped (a
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
        where = {"pod": pod, "container": TRAINER} if pod else rank_holder(status, rank)
        if not where:
            if not keep_following or ended:
                say(no_holder(status, rank) + ("; -f waits for one" if not ended else ""))
                return 1
        else:
            name = where["pod"]
            if current is not None and name != current:
                say(f"----- rank {rank} moved: pod {name} (the job restarted) -----")
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

    if args.rank < 0:
        say(f"--rank counts from 0 (global rank 0 writes the step log), not {args.rank}")
        return 2
    if args.attempt is not None and args.failed is not None:
        say("--attempt picks a pod of a worker slot, --failed one of the kept failed pods: give one of them")
        return 2
    try:
        k8s = connect()
    except Unreadable as err:
        say(str(err))
        return 1

    def write(chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()

    pod, keep_following = args.pod, args.follow
    try:
        if args.attempt is not None:
            status = read_job(k8s, args.namespace, args.job).get("status") or {}
            try:
                pods = k8s.list_pods(args.namespace, f"{LABEL_JOB}={args.job},{LABEL_ROLE}={ROLE_WORKER}")
            except Exception as err:  # noqa: BLE001 - the API's and the network's errors, said in words
                say(f"cannot list the pods of job {args.namespace}/{args.job}: {err}")
                return 1
            pod, line, ended = attempt_pod(status, pods, args.attempt, args.rank, args.pod)
            say(line)
            if pod is None:
                return 1
            keep_following = keep_following and not ended  # an ended pod's log is whole
        return follow(lambda: read_job(k8s, args.namespace, args.job),
                      lambda pod, container, f: k8s.pod_log(args.namespace, pod, container, f), write, say, keep_following, pod,
                      identify=lambda pod: k8s.pod_uid(args.namespace, pod), failed=args.failed, rank=args.rank)
    except Unreadable as err:
        say(str(err))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): done, as any filter would be
        return 0
