"""``llmtrain run FILE``: run a job on this machine, no cluster needed."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from llmtrain_contract.names import Env

from ..api.job import SpecInvalid, parse_job
from ..api.vocabulary import Phase
from .cluster import LocalCluster
from .runner import LocalRun, NodeKill, write_events


def _load(path: str) -> dict[str, Any]:
    with open(path) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if isinstance(d, dict)]
    jobs = [d for d in docs if d.get("kind") == "LLMTrainJob"]
    if len(jobs) != 1:
        raise ValueError(f"{path} must hold exactly one LLMTrainJob (found {len(jobs)})")
    return jobs[0]


def cmd_run(args: argparse.Namespace) -> int:
    try:
        raw = _load(args.file)
        job = parse_job(raw)
    except (OSError, ValueError, yaml.YAMLError) as err:
        print(f"llmtrain run: {err}", file=sys.stderr)
        return 1
    except SpecInvalid as err:
        print(f"llmtrain run: {args.file} is invalid:", file=sys.stderr)
        for field_error in err.errors:
            print(f"  {field_error}", file=sys.stderr)
        return 1
    if importlib.util.find_spec("torch") is None:
        # The caller (args.run) names the extra that brings it.
        raise ModuleNotFoundError("torch is not installed", name="torch")
    raw = {**raw, "metadata": {**raw["metadata"], "namespace": raw["metadata"].get("namespace", "default"),
                               "uid": f"local-{job.metadata.name}", "generation": 1}}
    workdir = Path(args.workdir or Path("runs") / job.metadata.name)
    if args.fresh and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for warning in _local_limits(job):
        print(f"llmtrain run: note: {warning}", file=sys.stderr)

    env = {Env.FAULT_INJECT: args.inject} if args.inject else {}
    cluster = LocalCluster(job, workdir.resolve(), env=env)
    max_steps = job.spec.trainer.builtin.max_steps if job.spec.trainer.builtin else None
    reporter = _Reporter(max_steps, plain=args.no_progress)
    kills = [NodeKill.parse(k) for k in args.kill_node] + [NodeKill.parse(k, freeze=True) for k in args.freeze_node]
    run = LocalRun(raw, job, cluster, kills=kills,
                   on_event=reporter.event, on_status=reporter.status)
    started = time.time()
    print(f"llmtrain run: {job.metadata.name}: {job.spec.replicas.min}..{job.spec.replicas.max} nodes x "
          f"{job.spec.procs_per_node} procs; workdir {workdir}", flush=True)
    interrupted = False
    # Ctrl-C, and a SIGTERM (a CI's timeout, `kill`), end the run the same clean way, even
    # where the caller ignored SIGINT (a shell's background job starts with SIGINT ignored,
    # and Python then installs no handler of its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        status = run.run(timeout=args.timeout)
    except KeyboardInterrupt:
        # The runner has stopped every process (its finally); what the run produced so far
        # is still written, as for a finished run.
        interrupted, status = True, run.status
    reporter.close()
    for warning in cluster.warnings:
        print(f"llmtrain run: note: {warning}", file=sys.stderr)
    write_events(workdir / "events.jsonl", run.events)
    if interrupted:
        print(f"llmtrain run: interrupted at step {status.get('step', 0)}; processes stopped, checkpoints kept",
              file=sys.stderr)
    _summary(status, time.time() - started, workdir)
    if job.spec.trainer.builtin is not None:
        from .plot import plot_run  # noqa: PLC0415 - matplotlib costs a second; only a run that trained plots

        png = plot_run(run.steps(), run.events, workdir / "loss.png", f"{job.metadata.name}: loss and world size")
        print(f"  plot:        {png}")
    if interrupted:
        return 130
    return 0 if status.get("phase") == Phase.SUCCEEDED else 1


def _local_limits(job) -> list[str]:
    notes = []
    if job.spec.checkpoint.s3 is not None:
        notes.append("the S3 tier is not used in local runs (local and shared tiers are)")
    if any(v.value_from for v in job.spec.env or []):
        notes.append("env entries with valueFrom are taken from this shell's environment when it has the variable, "
                     "else skipped (no Secrets or ConfigMaps here)")
    if job.spec.resources and job.spec.resources.limits and "nvidia.com/gpu" in job.spec.resources.limits:
        notes.append("resources are not enforced locally; procsPerNode ranks share this machine")
    return notes


def _summary(status: dict[str, Any], seconds: float, workdir: Path) -> None:
    ckpt = (status.get("lastCheckpoint") or {}).get("summary", "-")
    reasons = ", ".join(f"{k}={v}" for k, v in sorted((status.get("restartsByReason") or {}).items())) or "none"
    print(f"\n{status.get('phase')}: step {status.get('step')} in {seconds:.0f}s")
    print(f"  restarts:    {status.get('restarts', 0)} ({reasons}); disruptions: {status.get('disruptions', 0)}")
    print(f"  checkpoint:  {ckpt}")
    if status.get("goodput") is not None:
        print(f"  goodput:     {status['goodput']:.1%} of active time spent training")
    if status.get("ettr") is not None:
        print(f"  ETTR:        {status['ettr']:.1%} of active time spent on steps that were kept "
              f"({status.get('redoSeconds', 0):.0f}s redoing lost steps)")
    failure = status.get("lastFailure")
    if failure:
        print(f"  last failure: {failure.get('kind')} / {failure.get('reason')} ({failure.get('pod') or '-'})")
    print(f"  logs:        {workdir}/*.log, events: {workdir}/events.jsonl, status: {workdir}/status.json")


class _Reporter:
    """A progress bar over optimizer steps, with events printed above it."""

    def __init__(self, max_steps: int | None, plain: bool, line_seconds: float = 10.0):
        self.plain = plain or not sys.stderr.isatty()
        self.max_steps = max_steps
        self.line_seconds = line_seconds
        self.next_line = time.monotonic() + line_seconds
        self.bar = None
        self.last_phase = None
        if not self.plain:
            from tqdm import tqdm  # noqa: PLC0415 - only on a terminal

            self.bar = tqdm(total=max_steps, unit="step", dynamic_ncols=True)

    def event(self, when: float, event) -> None:
        line = f"{time.strftime('%H:%M:%S', time.localtime(when))} {event.type:<7} {event.reason:<18} {event.message}"
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def status(self, status: dict[str, Any]) -> None:
        ckpt = (status.get("lastCheckpoint") or {}).get("summary", "-")
        state = (f"{status.get('phase')} world={status.get('worldSize', 0)} workers={status.get('workers')} "
                 f"restarts={status.get('restarts', 0)} ckpt={ckpt}")
        shown = [f"{label}={status[key]:{fmt}}" for key, label, fmt in (("loss", "loss", ".4f"), ("tokensPerSecond", "tok/s", ",.0f"))
                 if isinstance(status.get(key), (int, float))]
        state += "".join(f" {item}" for item in shown) + (f" eta={status['eta']}" if status.get("eta") else "")
        if self.bar is not None:
            self.bar.n = status.get("step", 0)
            self.bar.set_postfix_str(state, refresh=True)
        elif time.monotonic() >= self.next_line:
            # Without a terminal (CI, a pipe, nohup) a line now and then, so that a log
            # shows the run moving between Events.
            self.next_line = time.monotonic() + self.line_seconds
            total = f"/{self.max_steps}" if self.max_steps else ""
            print(f"{time.strftime('%H:%M:%S')} step {status.get('step', 0)}{total} {state}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
