"""``llmtrain checkpoints ls|verify|prune``: a job's checkpoints in every tier.

    llmtrain checkpoints ls runs/tiny-elastic                 # a local run: every node's tier 1, the shared tier
    llmtrain checkpoints verify /mnt/ckpt/ns/job --step 120   # hash every byte (progress bar)
    llmtrain checkpoints prune s3://bucket/llmtrain/ns/job --keep 3 [--dry-run]
    llmtrain checkpoints export runs/tiny-elastic --format hf-gpt2 --out gpt2/   # weights for transformers

Runs without torch (the operator image has it). S3 credentials and endpoint come from
the environment, as boto3 reads them (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL`` ...).
Exit code 1 when a target cannot be read or a checkpoint fails verification.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llmtrain_store import export, survey
from llmtrain_store.health import classify
from llmtrain_store.safetensors import SafetensorsError
from llmtrain_store.tier import CheckpointError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("checkpoints", help="list, verify, prune or export a job's checkpoints in every tier")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("export", help="a step's model weights as safetensors, or a folder transformers loads (GPT-2)")
    q.add_argument("targets", nargs="+", metavar="TARGET", help="a local run's workdir, a tier directory or s3://bucket/prefix")
    q.add_argument("--endpoint", help="S3 endpoint URL (default: AWS_ENDPOINT_URL or AWS)")
    q.add_argument("--step", type=int, help="the step to export (default: the newest committed one)")
    q.add_argument("--format", choices=export.FORMATS, default="safetensors",
                   help="safetensors: our parameter names (what initFrom reads); hf-gpt2: config.json and GPT-2's names")
    q.add_argument("--out", required=True, help="the folder to write (created if missing)")
    q.add_argument("--n-head", type=int, help="attention heads, for a checkpoint whose manifest does not record the model")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    for name, text in (("ls", "which checkpoints each tier holds, complete and checked (names, sizes)"),
                       ("verify", "hash every byte of the checkpoints against their manifests"),
                       ("prune", "apply retention: keep the newest --keep checkpoints")):
        q = actions.add_parser(name, help=text)
        q.add_argument("targets", nargs="+", metavar="TARGET", help="a local run's workdir, a tier directory or s3://bucket/prefix")
        q.add_argument("--endpoint", help="S3 endpoint URL (default: AWS_ENDPOINT_URL or AWS)")
        if name == "verify":
            q.add_argument("--step", type=int, help="only this step (default: every committed one)")
            q.add_argument("--no-progress", action="store_true", help="no progress bar")
        if name == "prune":
            q.add_argument("--keep", type=int, required=True, help="committed checkpoints to keep per tier (>= 1)")
            q.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    p.set_defaults(func=run)


def _found(args: argparse.Namespace) -> list[survey.Found] | None:
    found: list[survey.Found] = []
    for target in args.targets:
        try:
            found += survey.tiers_of(target, args.endpoint)
        except ValueError as err:
            print(f"llmtrain checkpoints: {err}", file=sys.stderr)
            return None
    return found


def _rows(found: survey.Found) -> list[survey.Row] | None:
    try:
        return survey.rows(found)
    except Exception as err:  # noqa: BLE001 - a tier that cannot be read is reported by its reason
        print(f"{found.label}: cannot be read: {_reason(err)}", file=sys.stderr)
        return None


def _reason(err: Exception) -> str:
    """Why a tier could not be used, in words: a client library missing from this install
    (boto3 for an S3 tier: the base install has none) names the extra that brings it."""
    if isinstance(err, ModuleNotFoundError) and not (err.name or "").startswith("llmtrain_"):
        return f"{err.name} is not installed (pip install 'llmtrain-operator[operator]')"
    return classify(err).message


def run(args: argparse.Namespace) -> int:
    found = _found(args)
    if found is None:
        return 1
    return {"ls": _ls, "verify": _verify, "prune": _prune, "export": _export}[args.action](args, found)


def _ls(args: argparse.Namespace, found: list[survey.Found]) -> int:
    bad = 0
    for tier in found:
        rows = _rows(tier)
        if rows is None:
            bad += 1
            continue
        print(f"{tier.label}: {len(rows)} committed checkpoint{'s' if len(rows) != 1 else ''}")
        if rows:
            print(f"  {'STEP':>9}  {'WORLD':>5}  {'RANKS':<12} {'SIZE':>10} {'STORED':>10}  {'STRATEGY':<9} STATE")
        for row in rows:
            ranks = f"{row.ranks[0]}-{row.ranks[-1]}" if len(row.ranks) > 1 else str(row.ranks[0]) if row.ranks else "-"
            state = ("complete" if row.complete else "partial (a node's share)") + (
                ", ok" if row.problem is None else f", BAD: {row.problem}")
            print(f"  {row.step:>9}  {row.world:>5}  {ranks:<12} {survey.human(row.bytes):>10} {survey.human(row.stored):>10}"
                  f"  {row.strategy:<9} {state}")
            bad += row.problem is not None
        if rows:
            logical, stored = sum(r.bytes for r in rows), sum(r.stored for r in rows)
            print(f"  {survey.human(stored)} stored for {survey.human(logical)} of checkpoints"
                  f" ({stored / logical:.0%}: pieces shared between steps are stored once, some compressed)" if logical else "")
    return 1 if bad else 0


def _verify(args: argparse.Namespace, found: list[survey.Found]) -> int:
    bad = 0
    for tier in found:
        rows = _rows(tier)
        if rows is None:
            bad += 1
            continue
        for row in rows:
            if args.step is not None and row.step != args.step:
                continue
            bar = _bar(f"{tier.label} step {row.step}", row.bytes, args.no_progress)
            problem = survey.verify(tier, row.committed, progress=bar.update)
            bar.close()
            verdict = "verified, every byte matches its manifest" if problem is None else f"FAILED: {problem}"
            print(f"{tier.label}: step {row.step}: {verdict}")
            bad += problem is not None
    return 1 if bad else 0


def _prune(args: argparse.Namespace, found: list[survey.Found]) -> int:
    if args.keep < 1:
        print("llmtrain checkpoints prune: --keep must be at least 1", file=sys.stderr)
        return 1
    for tier in found:
        try:
            doomed = survey.prune(tier, args.keep, args.dry_run)
        except Exception as err:  # noqa: BLE001 - reported by its reason
            print(f"{tier.label}: cannot be pruned: {_reason(err)}", file=sys.stderr)
            return 1
        verb = "would delete" if args.dry_run else "deleted"
        print(f"{tier.label}: {verb} " + (", ".join(f"step {s}" for s in doomed) if doomed else "nothing"))
    return 0


def _export(args: argparse.Namespace, found: list[survey.Found]) -> int:
    try:
        tier, committed = export.pick(found, args.step)
        bar = _bar(f"{tier.label} step {committed.step}", None, args.no_progress)
        done = export.export(tier, committed, args.format, Path(args.out), args.n_head, progress=bar.update)
        bar.close()
    except (export.ExportError, CheckpointError, SafetensorsError) as err:  # CheckpointError: the copy failed its check
        print(f"llmtrain checkpoints export: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - a tier that cannot be read (S3 down, access refused): said by its reason
        print(f"llmtrain checkpoints export: {_reason(err)}", file=sys.stderr)
        return 1
    print(f"{done.tier}: step {done.step}: {done.tensors} tensors, {survey.human(done.nbytes)} -> "
          + ", ".join(str(f) for f in done.files))
    return 0


class _NoBar:
    def update(self, n: int) -> None:
        return None

    def close(self) -> None:
        return None


def _bar(label: str, total: int | None, off: bool) -> Any:
    if off or not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm  # noqa: PLC0415 - only on a terminal
    except ModuleNotFoundError:
        return _NoBar()  # the base install has no tqdm; the verdict lines do not need a bar

    return tqdm(total=total, unit="B", unit_scale=True, desc=label, leave=False)
