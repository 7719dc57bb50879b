"""``llmtrain``: the command line.

Subcommands:
  validate FILE...   check LLMTrainJob manifests offline, with field-named errors, and
                     print a built-in job's memory plan (--gpu-memory GIB: check it fits)
  crd [--write]      print (or write into crds/ and the chart) the generated CRD
  exit-codes         print the trainer/operator exit-code table
  run FILE           run a job locally with torchrun, no cluster (see localrun/)
  checkpoints ls|verify|prune TARGET...
                     a job's checkpoints in every tier (see storecli.py)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

import yaml
from llmtrain_contract.exitcodes import table

from llmtrain_contract import memplan

from .api import SpecInvalid, parse_job
from .api.job import LLMTrainJob
from .api.crd import CHART_CRD_TEMPLATE, CRD_FILENAME, render_chart_crd_template, render_crd_yaml
from .jobread import Unreadable, connect, read_job
from .localrun.args import add_run_parser
from .logscli import add_parser as add_logs_parser
from .planner.manifests import asks_for_gpus
from .planner.render import trainer_config
from .storecli import add_parser as add_checkpoints_parser


DESCRIPTION = "llmtrain-operator's command line: check and run LLMTrainJob specs, print the CRD and the exit codes."
EXAMPLES = """examples:
  llmtrain validate examples/*.yaml          check manifests offline (the API server's and the operator's rules)
  llmtrain run examples/01-tiny-elastic-cpu.yaml --fresh
                                             run a job on this machine with torchrun (needs the trainer extra)
  llmtrain crd > llmtrainjobs.yaml           the CustomResourceDefinition
  llmtrain exit-codes                        what each trainer exit code means to the operator
  llmtrain checkpoints ls runs/tiny-elastic  a job's checkpoints in every tier

The base install runs validate, crd, exit-codes, and checkpoints on directory tiers;
pip install 'llmtrain-operator[trainer]' adds run, and either extra adds S3 tiers (boto3)."""


def _load_documents(path: Path) -> list[object]:
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def cmd_validate(args: argparse.Namespace) -> int:
    bad = 0
    for name in args.files:
        path = Path(name)
        try:
            docs = _load_documents(path)
        except OSError as err:
            print(f"{name}: cannot read: {err.strerror}", file=sys.stderr)
            bad += 1
            continue
        except yaml.YAMLError as err:
            print(f"{name}: not valid YAML: {err}", file=sys.stderr)
            bad += 1
            continue
        jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "LLMTrainJob"]
        if not jobs:
            print(f"{name}: no LLMTrainJob document found", file=sys.stderr)
            bad += 1
            continue
        for doc in jobs:
            label = f"{name} ({(doc.get('metadata') or {}).get('name', '?')})"
            try:
                job = parse_job(doc)
            except SpecInvalid as err:
                bad += 1
                print(f"{label}: INVALID", file=sys.stderr)
                for field_error in err.errors:
                    print(f"  {field_error}", file=sys.stderr)
            else:
                print(f"{label}: ok")
                bad += _memory_plan(job, args.gpu_memory)
    return 1 if bad else 0


def _memory_plan(job: LLMTrainJob, gpu_memory_gib: float | None) -> int:
    """Print a built-in GPU job's memory plan at its smallest world (the largest share per
    rank); with ``--gpu-memory``, 1 when it does not fit such a GPU, with a change that does."""
    if job.spec.trainer.builtin is None or not asks_for_gpus(job.spec):
        return 0  # the plan is for GPU memory; a CPU job's ranks share the pod's memory limit
    spec = job.spec
    world = spec.replicas.min * spec.procs_per_node
    planned = memplan.from_config(trainer_config(job), world)
    print(f"  GPU memory per rank at world size {world}: {memplan.plan(planned).describe()}")
    if gpu_memory_gib is None:
        return 0
    room = gpu_memory_gib * memplan.GIB
    if memplan.fits(planned, room):
        print(f"  fits a GPU of {gpu_memory_gib:g} GiB")
        return 0
    hint = memplan.suggestion(planned, room)
    print(f"  does NOT fit a GPU of {gpu_memory_gib:g} GiB (the plan may fill {memplan.HEADROOM:.0%} of it, less CUDA's context); "
          + (f"try {hint}" if hint else "no single change of micro-batch, activation checkpointing or ZeRO stage makes it fit"),
          file=sys.stderr)
    return 1


def cmd_crd(args: argparse.Namespace) -> int:
    text = render_crd_yaml()
    if not args.write:
        sys.stdout.write(text)
        return 0
    root = Path(args.root)
    for path, content in ((root / "crds" / CRD_FILENAME, text), (root / CHART_CRD_TEMPLATE, render_chart_crd_template())):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {path}")
    return 0


def cmd_exit_codes(_: argparse.Namespace) -> int:
    print(f"{'code':>4}  {'name':<20} {'class':<11} reason")
    for code, name, klass, reason in table():
        print(f"{code:>4}  {name:<20} {klass:<11} {reason}")
    print("  >128 signal kill (128+N)   Retryable   SignalN;  other codes: Retryable Crash")
    return 0


def _version() -> str:
    try:
        return importlib.metadata.version("llmtrain-operator")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmtrain", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"llmtrain {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="validate LLMTrainJob manifests offline; print a built-in job's memory plan")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--gpu-memory", type=float, metavar="GIB",
                   help="also check that the plan fits a GPU of this many GiB (80 for an H100), naming a change that does")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("crd", help="print or write the generated CRD")
    p.add_argument("--write", action="store_true", help="write crds/ and the chart's template of it")
    p.add_argument("--root", default=".", help="repository root for --write (default: .)")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("exit-codes", help="print the exit-code table")
    p.set_defaults(func=cmd_exit_codes)

    p = sub.add_parser("status", help="a job's status as a person reads it: what happened, what it does now, what to do")
    p.add_argument("target", metavar="JOB", help="an LLMTrainJob's name (read through the API server), or a local run's workdir")
    p.add_argument("-n", "--namespace", default="default", help="the job's namespace (default: default)")
    p.set_defaults(func=cmd_status)

    add_logs_parser(sub)
    add_run_parser(sub)
    add_checkpoints_parser(sub)
    return parser


def cmd_status(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime  # noqa: PLC0415 - only this command

    from .statusview import render  # noqa: PLC0415 - only this command

    local = Path(args.target) / "status.json"
    if local.is_file():
        try:
            job = {"metadata": {"name": Path(args.target).name}, "status": json.loads(local.read_text())}
        except (OSError, ValueError) as err:
            print(f"llmtrain status: {local}: cannot be read: {err}", file=sys.stderr)
            return 1
    else:
        try:
            job = read_job(connect(), args.namespace, args.target)
        except Unreadable as err:
            print(f"llmtrain status: {err}", file=sys.stderr)
            return 1
    print("\n".join(render(job, datetime.now(UTC))))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
