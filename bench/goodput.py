"""Goodput under a seeded failure schedule, timed from outside (the effective training
time ratio, ETTR).

The local cluster, the operator installed with helm, a real Prometheus scraping the
operator and the trainers, MinIO on loopback as S3. One job (example 01's model and
data; 2 nodes, elastic between 1 and 2; checkpoints on all three tiers, node-local at
the adaptive interval) trains for the whole run while the benchmark injects failures
on a seeded schedule: one in each window of ``--gap`` seconds (600: on average one per
10 minutes), cycling through

| kind | injected by the benchmark |
|---|---|
| crash | SIGKILL of every process of the pod holding a seeded rank |
| node | a worker's node loses its heartbeats and every process; back after ``--heal`` s |
| frozen | SIGSTOP of a seeded rank's process |
| hang | rank 1 blocks outside any collective (``hang@trigger``), rank 0 in the all-reduce |
| partition | a worker's node loses its heartbeats and links, processes keep running; healed after ``--heal`` s |
| eviction | the Eviction API on the pod holding a seeded rank (SIGTERM, emergency checkpoint) |

Every time is the benchmark's own clock (bench/_goodput.py has the accounting): the
step log of the pod holding rank 0 is followed from its run volume, each line stamped
when first seen; the job's status is watched. Per fault: detect = injection to the
failure in the status; recover = injection to the first step of a re-formed group
(scheduling, rendezvous and restore included); redo = from there to the first step past
the pre-fault high-water mark. A group that re-forms with nothing injected (the job
growing back when a node returns) is an interruption too, from the old group's last
step, and so is a group going back (a rollback for bad numerics). ETTR = 1 - (start-up +
the union of every interruption + every stall of 10 s or more without a step, the end
of the run included) / wall, the wall from ``kubectl apply`` to the end. What it saw is
kept in ``.cache/bench-goodput/observed.json``. Checkpoint stalls stay inside productive time (the step
log cannot see them); their share is reported from the trainers' own histograms.

    python bench/goodput.py [--quick] [--minutes M] [--gap S] [--seed N] [--png PATH]
    RESULT ettr=... recover_process_s=... recover_node_s=... detect_hang_s=... lost_steps_per_failure=...

``--quick`` runs one crash and one node loss, 2 minutes apart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "hack"), str(ROOT / "tests"), str(ROOT / "operator"), str(ROOT / "trainer_image"),
                str(ROOT / "common")]
from _common import parser, result  # noqa: E402
from _goodput import (KINDS, Injected, Interruption, StepSeen, account, episode_lost, interruptions, schedule,  # noqa: E402
                      spread, steady_step_seconds)

NS, NAME = "goodput", "goodput"
GATEWAY = "10.244.0.1"
"""Where pods reach this host (the local cluster's bridge): MinIO listens there."""
GRACE, HANG_TIMEOUT = 10, 10
TARGETS = {"ettr": 0.97, "recover_process_s": 6.0, "recover_node_s": 60.0}
HANG_TRIGGER = "goodput-hang"
WORK = ROOT / ".cache" / "bench-goodput"


def job_manifest(s3_port: int) -> dict[str, Any]:
    from e2e.jobs import job_manifest as example  # noqa: PLC0415

    return example(NAME, {
        "spec.trainer.builtin.maxSteps": 10_000_000,
        "spec.checkpoint.intervalSteps": "auto",
        # The schedule's own rate as the prior: a user who expects a failure every 10
        # minutes says so, instead of the 4-hour default.
        "spec.checkpoint.auto": {"mtbfPriorSeconds": 600},
        "spec.checkpoint.shared": {"claimName": "ckpt-shared"},
        "spec.checkpoint.s3": {"bucket": "ckpt", "endpoint": f"http://{GATEWAY}:{s3_port}", "credentialsSecret": {"name": "s3"}},
        "spec.faultTolerance.nodeFailureGraceSeconds": GRACE, "spec.faultTolerance.hangTimeoutSeconds": HANG_TIMEOUT,
        "spec.faultTolerance.progressTimeoutSeconds": 600, "spec.faultTolerance.maxRestarts": 100,
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": f"hang@trigger={HANG_TRIGGER},rank=1"}],
    })


class Steps(threading.Thread):
    """Follows the step log of every pod of the job from the pods' run volumes (only
    the pod holding rank 0 writes one), stamping each whole line when first seen."""

    def __init__(self, bed: Any):
        super().__init__(name="steps", daemon=True)
        self.bed, self.seen, self.stop = bed, [], threading.Event()
        self._offsets: dict[Path, int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for log in (self.bed.state / "pods").glob("*/volumes/run/steps.jsonl"):
                self._read(log)
            time.sleep(0.1)

    def _read(self, log: Path) -> None:
        try:
            with log.open("rb") as fh:
                fh.seek(self._offsets.get(log, 0))
                data = fh.read()
        except OSError:
            return  # the pod's folder went away
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        if not end:
            return
        now = time.monotonic()
        self._offsets[log] = self._offsets.get(log, 0) + end
        uid = log.parts[-4]
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line) if line.strip() else None
            except ValueError:
                continue  # a torn line (the pod killed mid-write): the thread must live on
            if isinstance(rec, dict) and "step" in rec:
                self.seen.append(StepSeen(now, rec["step"], (uid, rec.get("attempt", 0)), rec.get("world", 0)))

    def newest(self) -> StepSeen | None:
        return self.seen[-1] if self.seen else None


class Status(threading.Thread):
    """Watches the job; keeps the moments its failure record (restarts, disruptions,
    the last failure) changed, and the newest status."""

    def __init__(self, kubeconfig: Path):
        from _kube import Kube  # noqa: PLC0415

        super().__init__(name="status", daemon=True)
        self.kube, self.stop = Kube(kubeconfig), threading.Event()
        self.changes: list[float] = []
        self.latest: dict[str, Any] = {}

    @staticmethod
    def mark(status: dict[str, Any]) -> tuple:
        return (status.get("restarts", 0), status.get("disruptions", 0), json.dumps(status.get("lastFailure"), sort_keys=True))

    def run(self) -> None:
        path = f"/apis/llmtrain.io/v1alpha1/namespaces/{NS}/llmtrainjobs?fieldSelector=metadata.name%3D{NAME}"
        for arrived, _, obj in self.kube.watch(path, "0", self.stop):
            status = obj.get("status") or {}
            if self.latest and self.mark(status) != self.mark(self.latest):
                self.changes.append(arrived)
            self.latest = status


class Injector:
    """The faults, each returning what it hit; ``after`` holds the clean-ups due later
    (a node healed, a hang trigger removed), as (due, action)."""

    def __init__(self, bed: Any, heal_after: float):
        self.bed, self.heal_after = bed, heal_after
        self.after: list[tuple[float, Callable[[], None]]] = []

    def pods(self, role: str = "worker") -> list[dict[str, Any]]:
        from e2e.jobs import pods  # noqa: PLC0415

        return [p for p in pods(self.bed, NS, NAME, role=role) if not p["metadata"].get("deletionTimestamp")]

    def holder(self, rank: int) -> tuple[dict[str, Any], int]:
        from e2e.jobs import rank_holder  # noqa: PLC0415

        return rank_holder(self.bed, NS, NAME, rank)

    def ready(self, kind: str) -> bool:
        """The target exists: two workers training (a fault right after the last one's
        recovery waits for it, as the schedule's window allows)."""
        try:
            return len(self.pods()) == 2 and all(self.holder(r) for r in (0, 1))
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError):
            return False  # a failed read (kubectl, a heartbeat file going away): asked again next round

    def inject(self, kind: str, pick: float) -> str:
        rank = 0 if pick < 0.5 else 1
        if kind == "crash":
            pod, _ = self.holder(rank)
            self.bed.kill_pod(NS, pod["metadata"]["name"])
            return f"pod of rank {rank}"
        if kind == "frozen":
            _, pid = self.holder(rank)
            os.kill(pid, signal.SIGSTOP)
            return f"rank {rank} (pid {pid})"
        if kind == "hang":
            from e2e.jobs import run_dir  # noqa: PLC0415

            pod, _ = self.holder(1)
            trigger = run_dir(self.bed, pod) / HANG_TRIGGER
            trigger.write_text("")
            self.after.append((time.monotonic() + 60, lambda: trigger.unlink(missing_ok=True)))
            return "rank 1"
        if kind == "eviction":
            pod, _ = self.holder(rank)
            name = pod["metadata"]["name"]
            body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}}
            self.bed.kubectl("create", "--raw", f"/api/v1/namespaces/{NS}/pods/{name}/eviction", "-f", "-", input=json.dumps(body))
            return f"pod of rank {rank}"
        # node, partition: a worker's node that does not hold the rendezvous store
        store = {p["spec"].get("nodeName") for p in self.pods("rendezvous")}
        nodes = sorted({p["spec"]["nodeName"] for p in self.pods()} - store) or sorted({p["spec"]["nodeName"] for p in self.pods()})
        node = nodes[int(pick * len(nodes))]
        (self.bed.fail_node if kind == "node" else self.bed.partition_node)(node)
        self.after.append((time.monotonic() + self.heal_after, lambda: self.bed.heal_node(node)))
        return node

    def due(self) -> None:
        now = time.monotonic()
        for item in [a for a in self.after if a[0] <= now]:
            self.after.remove(item)
            item[1]()

    def flush(self) -> None:
        for _, action in self.after:
            action()
        self.after.clear()


def run(args: Any) -> dict[str, Any]:
    from e2e.jobs import PVC, create  # noqa: PLC0415
    from e2e.prometheus import Prometheus  # noqa: PLC0415
    from localcluster.cluster import LocalCluster  # noqa: PLC0415
    from support.chart import install_operator  # noqa: PLC0415
    from s3server import MinioServer  # noqa: PLC0415
    from tqdm import tqdm  # noqa: PLC0415

    kinds = ("crash", "node") if args.quick else KINDS
    count = len(kinds) if args.quick else max(len(KINDS), round(args.minutes * 60 / args.gap))
    plan = schedule(args.seed, kinds, args.gap, count)
    duration = count * args.gap
    WORK.mkdir(parents=True, exist_ok=True)
    bed = LocalCluster.default().up()
    prometheus = None
    try:
        install_operator(bed, "llmtrain-system", "replicaCount=1", "operator.resyncSeconds=5", "nodeSelector.llmtrain\\.io/pool=system")
        with MinioServer(_fresh(WORK / "minio"), host="0.0.0.0") as s3:
            s3.make_bucket("ckpt")
            prometheus = Prometheus(bed, _fresh(WORK / "prometheus")).start()
            bed.kubectl("create", "namespace", NS)
            bed.kubectl("apply", "-n", NS, "-f", "-", input=PVC)
            env = s3.env()
            bed.kubectl("create", "secret", "generic", "s3", "-n", NS, f"--from-literal=AWS_ACCESS_KEY_ID={env['AWS_ACCESS_KEY_ID']}",
                        f"--from-literal=AWS_SECRET_ACCESS_KEY={env['AWS_SECRET_ACCESS_KEY']}")
            steps, status = Steps(bed), Status(bed.kubeconfig)
            status.start()
            created = time.monotonic()
            create(bed, NS, job_manifest(s3.port))
            steps.start()
            faults = drive(bed, plan, created, duration, steps, status, args, tqdm)
            ended = time.monotonic()
            final = dict(status.latest)
            try:
                scraped = _scraped(prometheus, ended - created)
            except (OSError, ValueError, KeyError) as err:  # an hour of observations is not lost to one query
                print(f"Prometheus could not be queried: {err}", flush=True)
                scraped = {"restarts_by_reason": {}, "stall_seconds": 0.0, "step_seconds": 0.0, "stall_share": None}
            steps.stop.set()
            status.stop.set()
            bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false")
    finally:
        if prometheus is not None:
            prometheus.stop()
        bed.down()
    return {"created": created, "ended": ended, "steps": list(steps.seen), "faults": faults, "changes": list(status.changes),
            "status": final, "scraped": scraped, "plan": plan}


def drive(bed: Any, plan: list, created: float, duration: float, steps: Steps, status: Status, args: Any, tqdm: Any) -> list[Injected]:
    injector = Injector(bed, args.heal)
    faults: list[Injected] = []
    todo = list(plan)
    bar = tqdm(total=round(duration), unit="s", desc="goodput", file=sys.stderr, mininterval=5,
               bar_format="{desc} {n_fmt}/{total_fmt}s |{bar}| {postfix}")
    try:
        while (now := time.monotonic()) < created + duration:
            injector.due()
            if todo and now >= created + todo[0].at and injector.ready(todo[0].kind):
                planned = todo.pop(0)
                at = time.monotonic()
                target = injector.inject(planned.kind, planned.pick)
                faults.append(Injected(planned.kind, at, target))
                bar.write(f"{at - created:7.1f}s  injected {planned.kind} ({target}); planned at {planned.at:.1f}s")
            newest = steps.newest()
            bar.set_postfix_str(f"step {newest.step if newest else '-'}, world {newest.world if newest else '-'}, "
                                f"{len(faults)}/{len(plan)} faults, restarts {status.latest.get('restarts', 0)}", refresh=False)
            bar.update(round(now - created) - bar.n)  # redraws at most every mininterval
            time.sleep(0.2)
    finally:
        injector.flush()
        bar.close()
    if todo:
        raise RuntimeError(f"{len(todo)} planned faults never found their target (two workers training): {todo}")
    return faults


def _fresh(folder: Path) -> Path:
    import shutil  # noqa: PLC0415

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _scraped(prometheus: Any, wall: float) -> dict[str, Any]:
    """What the real Prometheus scraped over the run: the operator's restarts by reason,
    and the stall share (the trainers' checkpoint stall over stall plus step time,
    summed over ranks: the stall is timed outside the step)."""
    import urllib.parse  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    from e2e.prometheus import PORT  # noqa: PLC0415

    url = f"http://127.0.0.1:{PORT}/api/v1/query?" + urllib.parse.urlencode({"query": "sum by (reason) (llmtrain_operator_restarts_total)"})
    with urllib.request.urlopen(url, timeout=10) as resp:
        rows = json.loads(resp.read())["data"]["result"]
    by_reason = {r["metric"].get("reason", "?"): float(r["value"][1]) for r in rows if float(r["value"][1])}
    window, job = f"{int(wall) + 60}s", f'llmtrain_job="{NAME}"'
    stall = prometheus.query(f"sum(increase(llmtrain_trainer_checkpoint_stall_seconds_sum{{{job}}}[{window}]))") or 0.0
    step = prometheus.query(f"sum(increase(llmtrain_trainer_step_seconds_sum{{{job}}}[{window}]))") or 0.0
    return {"restarts_by_reason": by_reason, "stall_seconds": stall, "step_seconds": step,
            "stall_share": stall / (stall + step) if stall + step > 0 else None}


def report(seen: dict[str, Any], png: Path | None) -> dict[str, float]:
    created, ended, steps = seen["created"], seen["ended"], seen["steps"]
    cuts = interruptions(steps, seen["faults"], seen["changes"])
    acct = account(created, ended, steps, cuts)
    print(f"wall {acct.wall:.0f}s, start-up {acct.startup:.1f}s, lost {acct.lost:.1f}s (start-up included), "
          f"final step {steps[-1].step if steps else 0}")
    print(f"{'at':>8} {'kind':<10} {'target':<18} {'detect':>7} {'recover':>8} {'redo':>6} {'lost steps':>10} {'rejoin':>7} {'episode':>8}")
    for cut in (c for c in cuts if c.fault is not None):
        rejoin = sum((r.caught_up or ended) - r.start for r in cut.rejoins)
        print(f"{cut.start - created:8.1f} {cut.cause:<10} {cut.fault.target:<18} {_s(cut.detected, cut.start):>7} "
              f"{_s(cut.resumed_at, cut.start):>8} {_s(cut.caught_up, cut.resumed_at):>6} {_n(cut.lost_steps):>10} "
              f"{rejoin:7.1f} {episode_lost(cut, ended):8.1f}")
    unowned = [c for c in cuts if c.fault is None and not any(c in f.rejoins for f in cuts)]
    for cause in sorted({c.cause for c in unowned}):
        mine = [c for c in unowned if c.cause == cause]
        print(f"{cause} with nothing injected before it: {len(mine)} times, at "
              + ", ".join(f"{c.start - created:.0f}s (lost {(c.caught_up or ended) - c.start:.1f}s)" for c in mine))
    if steps and ended - steps[-1].at > 10:
        print(f"no step seen in the last {ended - steps[-1].at:.0f}s (the job's phase at the end: {seen['status'].get('phase')})")
    kinds = sorted({c.cause for c in cuts if c.fault is not None}, key=KINDS.index)
    values: dict[str, float] = {}
    for kind in kinds:
        mine = [c for c in cuts if c.cause == kind]
        for what, got in (("detect", [c.detected - c.start for c in mine if c.detected is not None]),
                          ("recover", [c.resumed_at - c.start for c in mine if c.resumed_at is not None]),
                          ("episode", [episode_lost(c, ended) for c in mine])):
            s = spread(got)
            if s is not None:
                print(f"{kind + '_' + what:<20} median {s.median:7.2f}s  worst {s.worst:7.2f}s  (n={s.n})")
                values[f"{kind}_{what}"], values[f"{kind}_{what}_worst"] = s.median, s.worst
        never = [c for c in mine if c.resumed_at is None]
        if never:
            print(f"{kind}: {len(never)} never recovered (counted as lost until the end)")
    faults = [c for c in cuts if c.fault is not None]
    lost_steps = [c.lost_steps for c in faults if c.lost_steps is not None]
    pace = steady_step_seconds(steps, cuts, 2)
    final = steps[-1].step if steps else 0
    op = seen["status"]
    scraped = seen["scraped"]
    print(f"steady step time at world 2: {pace:.3f}s" if pace else "steady step time: no undisturbed steps at world 2")
    if pace:
        print(f"cross-check: final step x steady step time / wall = {final * pace / acct.wall:.3f} "
              "(counts every slower step too, e.g. at world size 1)")
    print(f"the operator's own status: phase {op.get('phase')}, ettr {op.get('ettr')}, goodput {op.get('goodput')}, "
          f"restarts {op.get('restarts')} {op.get('restartsByReason')}, disruptions {op.get('disruptions')}")
    print(f"the interval in force at the end: {json.dumps(op.get('checkpointCadence'))}")
    print(f"Prometheus: restarts by reason {scraped['restarts_by_reason']}; checkpoint stall {scraped['stall_seconds']:.3f}s "
          f"over {scraped['step_seconds']:.1f}s of steps (summed over ranks)")
    if png is not None:
        plot(created, ended, steps, cuts, png)
        print(f"plot: {png}")
    out = {"ettr": round(acct.ettr, 4)}
    for key, value in (("recover_process_s", "crash_recover"), ("recover_process_worst_s", "crash_recover_worst"),
                       ("recover_node_s", "node_recover"), ("recover_node_worst_s", "node_recover_worst"),
                       ("detect_hang_s", "hang_detect"), ("detect_frozen_s", "frozen_detect")):
        if value in values:
            out[key] = round(values[value], 2)
    out["lost_steps_per_failure"] = round(sum(lost_steps) / len(lost_steps), 1) if lost_steps else -1
    out["stall_share"] = scraped["stall_share"] if scraped["stall_share"] is not None else -1  # printed to 4 digits
    out["failures"] = len(faults)
    out["wall_s"] = round(acct.wall)
    for key, target in TARGETS.items():  # each against its worst case
        got = out.get(key[:-2] + "_worst_s", out.get(key)) if key.endswith("_s") else out.get(key)
        if got is not None:
            ok = got >= target if key == "ettr" else got <= target
            print(f"target {key} {'>=' if key == 'ettr' else '<='} {target}: {got} ({'met' if ok else 'NOT met'})")
    return out


def _s(end: float | None, begin: float | None) -> str:
    return "-" if end is None or begin is None else f"{end - begin:.1f}"


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def plot(created: float, ended: float, steps: list[StepSeen], cuts: list[Interruption], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.plot([(s.at - created) / 60 for s in steps], [s.step for s in steps], ",", color="tab:blue", label="step seen (rank 0's log)")
    colours = dict(zip(KINDS, ("tab:red", "tab:purple", "tab:orange", "tab:brown", "tab:olive", "tab:cyan")))
    labelled = set()
    for cut in cuts:
        end = cut.caught_up if cut.caught_up is not None else ended
        colour = colours.get(cut.cause, "tab:gray")
        label = None if cut.cause in labelled else cut.cause
        labelled.add(cut.cause)
        ax.axvspan((cut.start - created) / 60, (end - created) / 60, color=colour, alpha=0.3, label=label)
        if cut.fault is not None:
            ax.axvline((cut.start - created) / 60, color=colour, lw=0.8)
    ax.set_xlabel("minutes since kubectl apply (the benchmark's clock)")
    ax.set_ylabel("step")
    ax.set_title("Training progress under the failure schedule; shaded: from the fault (or re-form) until past the old high-water mark")
    ax.title.set_fontsize(9)
    ax.legend(loc="upper left", fontsize=8, markerscale=20)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60, help="run length (default 60; rounded to whole --gap windows)")
    p.add_argument("--gap", type=float, default=None, help="mean seconds between failures (default 600, quick 120)")
    p.add_argument("--heal", type=float, default=90, help="seconds until a lost or partitioned node comes back (default 90)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--png", default=str(WORK / "goodput.png"), help="where to draw step against time")
    args = p.parse_args()
    args.gap = args.gap or (120 if args.quick else 600)
    seen = run(args)
    # Everything the figures come from, so that a run's report can be checked (and its
    # accounting recomputed) after the bed is gone.
    (WORK / "observed.json").write_text(json.dumps({
        **{k: seen[k] for k in ("created", "ended", "changes", "status", "scraped")},
        "steps": [[s.at, s.step, list(s.group), s.world] for s in seen["steps"]],
        "faults": [vars(f) for f in seen["faults"]]}, default=str))
    result(**report(seen, Path(args.png) if args.png else None))


if __name__ == "__main__":
    main()
