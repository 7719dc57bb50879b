"""In-process healing against restarting, side by side: the time from a rank's crash, or
from a node's loss, to the job's next step, timed from outside.

One job per mode (``heal``: ``faultTolerance.inProcessHealing``; ``restart``: without it),
each under the real launcher, torchrun and rendezvous store on this machine (the
``ElasticJob`` harness of the trainer tests), its steps paced to ``--step-seconds``. Every
round the benchmark SIGKILLs one rank's process (its pid from the rank's heartbeat file,
never one on rank 0's node: rank 0 writes the step log), by its own clock, then polls
rank 0's step log every 20 ms:

- ``recover``: the first step logged whose number is past the last step the killed rank
  finished (its heartbeat, read right after the kill, while the file is still the dead
  process's): a step that completed before the kill may be logged just after it, a later
  one needs the rank's successor. The group redoes the step in flight at the kill, so the
  figure includes one step time;
- survivors: with healing, the pid (from its heartbeat) of every rank on another node
  than the killed one must be the same after the round as before (torchrun restarts a
  node's ranks together);
- ``--fault node``: each round SIGKILLs a whole node instead (its launcher, torchrun and
  ranks, as when its pod dies) and starts its replacement ``--replace-after`` seconds
  later, the same in both modes (a stand-in for the operator's replacement pod, whose
  start a cluster adds to both), with an empty tier 1 and run dir, as a new node's pod
  has. With healing, the survivors offer the lost node's seat and
  the replacement's agent takes it (``torchrun_agent.take_offered_seats``); without, the
  survivors end and torchrun re-forms the job with the replacement. The figure includes
  the replacement's start-up (a new launcher, its fork server's torch import, a new rank);
- the step time the targets add: by the same clock and poll, from a step's line to 8
  more before the first round and to 4 more after each round, the median of these.

Each rank runs ``OMP_NUM_THREADS`` = the cores over the ranks (``ElasticJob``), as the
operator gives ranks that share a node: with torch's default the ranks here spun against
each other and a step took anything from 0.8 to 3.2 s.

Medians and worst cases over the rounds, never a best-of; every round counts, a round
whose job failed or did not recover in 120 s included (as 120 s).

    python bench/heal.py [--quick] [--nodes 2] [--procs-per-node 1] [--rounds 20] [--step-seconds 0.3]
                         [--fault crash|node] [--replace-after 2] [--preset tiny]
    RESULT fault=... preset=... nodes=... procs_per_node=... step_s=... heal_recover_median_s=... heal_recover_worst_s=...
           restart_recover_median_s=... restart_recover_worst_s=... speedup_median=... survivors_kept=... heal_target_met=...
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "operator"), str(ROOT / "trainer_image"), str(ROOT / "common")]
from _common import parser, result  # noqa: E402
from llmtrain_trainer.pod import heartbeat  # noqa: E402
from support.elastic import ElasticJob, base_config  # noqa: E402

LIMIT = 120.0
"""A round that has not recovered by then counts as this long."""


def steps_logged(job: ElasticJob) -> list[int]:
    out = []
    for path in job.root.glob("node*/run/steps.jsonl"):
        for line in path.read_text().splitlines():
            try:
                out.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line being written
    return out


def pids(job: ElasticJob) -> dict[int, int]:
    """Each rank's process, from its heartbeat file."""
    return {b.rank: b.pid for node in job.running for b in heartbeat.read_all(node.run_dir)}


def node_ranks(job: ElasticJob) -> list[set[int]]:
    """The ranks of each node, from its heartbeat files."""
    return [{b.rank for b in heartbeat.read_all(node.run_dir)} for node in job.running]


def wait_for_steps(job: ElasticJob, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(steps_logged(job)) < count:
        if time.monotonic() > deadline or any(n.proc.poll() is not None for n in job.running):
            raise RuntimeError("the job did not train:\n" + job.logs(tail=3000))
        time.sleep(0.2)


def pace(job: ElasticJob, steps: int, timeout: float = 120) -> float:
    """Seconds a step, by this clock: from a step's line appearing to ``steps`` more
    (polled every 20 ms, like the rounds)."""
    deadline = time.monotonic() + timeout

    def logged_past(count: int) -> int:
        while (now := len(steps_logged(job))) <= count:
            if time.monotonic() > deadline:
                raise RuntimeError("the job stopped training:\n" + job.logs(tail=3000))
            time.sleep(0.02)
        return now

    first = count = logged_past(len(steps_logged(job)))
    began = time.monotonic()
    while count < first + steps:
        count = logged_past(count)
    return (time.monotonic() - began) / (count - first)


def next_step(job: ElasticJob, began: float, done: int, before_pids: dict[int, int], mates: set[int]) -> tuple[float, bool]:
    """Seconds from ``began`` until a step past ``done`` is logged (``LIMIT`` if none by
    then), and whether every rank but ``mates`` (the killed node's) kept its process."""
    while True:
        elapsed = time.monotonic() - began
        if elapsed > LIMIT:
            return LIMIT, False
        if any(s > done for s in steps_logged(job)):
            break
        time.sleep(0.02)
    after = pids(job)
    kept = all(after.get(rank) == pid for rank, pid in before_pids.items() if rank not in mates)
    return elapsed, kept


def one_round(job: ElasticJob, victim: int) -> tuple[float, bool]:
    """Kill ``victim``'s process; seconds until the job's next step, and whether every
    rank of the other nodes kept its process (torchrun restarts a node's ranks together)."""
    before_pids = pids(job)
    mates = next((ranks for ranks in node_ranks(job) if victim in ranks), {victim})
    began = time.monotonic()
    os.kill(before_pids[victim], signal.SIGKILL)
    beats = [b for node in job.running for b in heartbeat.read_all(node.run_dir) if b.rank == victim]
    if len(beats) == 1 and beats[0].pid == before_pids[victim]:
        done = beats[0].step
    else:  # already replaced: one step past the last logged one, which costs a step more
        done = max(steps_logged(job)) + 1
        print(f"  rank {victim}'s heartbeat was no longer its own: the round asks for one step more", flush=True)
    return next_step(job, began, done, before_pids, mates)


def one_node_round(job: ElasticJob, index: int, replace_after: float) -> tuple[float, bool]:
    """Kill node ``index`` whole and start its replacement ``replace_after`` seconds later;
    seconds from the kill until the job's next step, and whether every rank of the other
    nodes kept its process."""
    before_pids = pids(job)
    mates = {b.rank for b in heartbeat.read_all(job.running[index].run_dir)}
    began = time.monotonic()
    job.kill_node(index)
    beats = [b for b in heartbeat.read_all(job.running[index].run_dir) if b.rank in mates]
    done = max((b.step for b in beats), default=max(steps_logged(job)) + 1)
    for folder in ("ckpt", "run"):  # a new node's pod: nothing on its disk
        shutil.rmtree(job.node_dir(index) / folder, ignore_errors=True)
    while time.monotonic() - began < replace_after:
        time.sleep(0.02)
    job.replace_node(index)
    return next_step(job, began, done, before_pids, mates)


def run_mode(root: Path, heal: bool, nodes: int, procs: int, rounds: int, step_seconds: float, fault: str = "crash",
             replace_after: float = 2.0, preset: str = "tiny") -> dict[str, Any]:
    cfg = base_config(maxSteps=1_000_000, checkpoint={"intervalSteps": 20}, model={"preset": preset},
                      faultTolerance={"inProcessHealing": heal, "hangTimeoutSeconds": 60, "collectiveTimeoutSeconds": 30})
    job = ElasticJob(root, cfg, nodes=nodes, procs_per_node=procs, max_restarts=rounds + 5,
                     env={"LLMTRAIN_FAULT_INJECT": f"slow@step=1,seconds={step_seconds},steps=10000000",
                          "LLMTRAIN_LOG_LEVEL": "WARNING"}).start()
    times, kept = [], []
    try:
        wait_for_steps(job, 5, 300)
        paces = [pace(job, 8)]
        for r in range(rounds):
            # Never on rank 0's node: rank 0 writes the step log.
            if fault == "node":
                while not (lost := [i for i, ranks in enumerate(node_ranks(job)) if ranks and 0 not in ranks]):
                    time.sleep(0.05)  # a heartbeat file being rewritten is skipped: read again
                index = lost[r % len(lost)]
                seconds, same = one_node_round(job, index, replace_after)
                what = f"node {index} lost, replaced {replace_after:.1f}s later"
            else:
                while not (victims := sorted(set().union(*[ranks for ranks in node_ranks(job) if 0 not in ranks]))):
                    time.sleep(0.05)  # a heartbeat file being rewritten is skipped: read again
                victim = victims[r % len(victims)]
                seconds, same = one_round(job, victim)
                what = f"rank {victim} killed"
            times.append(seconds)
            kept.append(same)
            print(f"{'heal' if heal else 'restart'} round {r + 1}: {what}, next step after {seconds:.2f}s, "
                  f"other nodes' ranks' processes {'kept' if same else 'replaced'}", flush=True)
            time.sleep(1)
            try:
                paces.append(pace(job, 4))  # a few steps between rounds: the next kill hits a running job
            except RuntimeError as err:  # the job stopped training: the rounds left count as failed
                print(f"the job stopped training after round {r + 1}; the {rounds - r - 1} rounds left count as "
                      f"{LIMIT:.0f}s each:\n{str(err)[-2000:]}", flush=True)
                times += [LIMIT] * (rounds - r - 1)
                kept += [False] * (rounds - r - 1)
                break
    finally:
        job.kill()
    print(f"{'heal' if heal else 'restart'}: a step took {statistics.median(paces):.3f}s (median of {len(paces)} paces of "
          f"4-8 steps; slowest {max(paces):.3f}s), {job.threads_per_rank()} thread(s) a rank", flush=True)
    return {"times": times, "kept": kept, "step_s": statistics.median(paces)}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2, help="nodes, 2 or more")
    p.add_argument("--procs-per-node", type=int, default=1, help="ranks a node (default 1)")
    p.add_argument("--rounds", type=int, default=None, help="kills per mode (default 20, quick 3)")
    p.add_argument("--step-seconds", type=float, default=0.3, help="each step paced to at least this long")
    p.add_argument("--fault", choices=("crash", "node"), default="crash",
                   help="crash: one rank's process killed; node: a whole node killed, then replaced")
    p.add_argument("--replace-after", type=float, default=2.0,
                   help="--fault node: seconds from the kill to the replacement node's start (default 2)")
    p.add_argument("--preset", default="tiny", help="the model preset (default tiny; small: 6 layers of 384)")
    args = p.parse_args()
    rounds = args.rounds or (3 if args.quick else 20)
    root = Path(tempfile.mkdtemp(prefix="bench-heal-", dir=ROOT / ".cache" if (ROOT / ".cache").is_dir() else None))
    try:
        heal = run_mode(root / "heal", True, args.nodes, args.procs_per_node, rounds, args.step_seconds, args.fault,
                        args.replace_after, args.preset)
        restart = run_mode(root / "restart", False, args.nodes, args.procs_per_node, rounds, args.step_seconds, args.fault,
                           args.replace_after, args.preset)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    step_s = heal["step_s"]
    hm, hw = statistics.median(heal["times"]), max(heal["times"])
    rm, rw = statistics.median(restart["times"]), max(restart["times"])
    what = "a rank's crash" if args.fault == "crash" else f"a node's loss (replaced {args.replace_after:.1f}s later)"
    print(f"heal:    next step after {what}: median {hm:.2f}s, worst {hw:.2f}s over {rounds} rounds; "
          f"the other nodes' ranks kept their processes in {sum(heal['kept'])} of {rounds}")
    print(f"restart: next step after {what}: median {rm:.2f}s, worst {rw:.2f}s over {rounds} rounds")
    if args.fault == "crash":
        print(f"step time {step_s:.2f}s; targets (issue 36): median <= 1 s + a step, worst <= 2 s + a step")
        met = hm <= 1 + step_s and hw <= 2 + step_s
    else:  # no figure to meet: healed in process, and not slower than restarting
        print(f"step time {step_s:.2f}s; a node's loss: the other nodes' ranks kept, and the median no slower than restarting")
        met = sum(heal["kept"]) == rounds and hm <= rm
    result(fault=args.fault, preset=args.preset, nodes=args.nodes, procs_per_node=args.procs_per_node, step_s=step_s,
           heal_recover_median_s=hm,
           heal_recover_worst_s=hw,
           restart_recover_median_s=rm,
           restart_recover_worst_s=rw, speedup_median=rm / hm if hm > 0 else 0.0,
           survivors_kept=f"{sum(heal['kept'])}/{rounds}", heal_target_met=int(met))


if __name__ == "__main__":
    main()
