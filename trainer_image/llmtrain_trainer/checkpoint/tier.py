"""A checkpoint tier backed by a directory: node-local disk (tier 1) or a shared
filesystem mount (tier 2).

Layout of one tier::

    <root>/step-00000120/           a committed checkpoint (renamed into place atomically)
        manifest.json               step, world size, ranks covered, files with size+sha256
        COMMITTED                   sha256 of manifest.json; written last
        state.pt | ds/...           engine files
        rng/rank-00000.pt           per-rank RNG states
    <root>/.staging-00000120/       being written; ignored by readers, swept on start
        parts/rank-00000.json       one rank's files, written when that rank is done

Several writers (the ranks of a node, or the nodes of a job for a shared tier) fill one
staging folder; each announces its files with a part record; a single committer waits
for every expected part, writes the manifest and COMMITTED, and renames the folder.
A reader trusts a folder only if COMMITTED matches the manifest and every file it
needs has the recorded size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
COMMITTED = "COMMITTED"


class CheckpointError(Exception):
    """A checkpoint could not be written or read (the tier degrades; training goes on)."""


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_durably(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    fsync_file(tmp)
    tmp.replace(path)


def describe_files(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Size and sha256 of files after they are written (read back: hashes what is on disk)."""
    out = {}
    for name in names:
        path = folder / name
        fsync_file(path)
        out[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return out


@dataclass
class Committed:
    """A committed checkpoint in one tier, as listed (not yet verified)."""

    tier: str
    step: int
    path: Path
    manifest: dict[str, Any]

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])

    @property
    def ranks(self) -> set[int]:
        return {int(r) for r in self.manifest["ranks"]}

    @property
    def complete(self) -> bool:
        """Holds the files of every rank of the world that saved it."""
        return self.ranks == set(range(self.world_size))

    def verify(self, names: list[str] | None = None) -> str | None:
        """None if the named files (default: all) match the manifest; else why not."""
        files = self.manifest["files"]
        for name in names if names is not None else list(files):
            if name not in files:
                return f"{name} is not in the manifest"
            path = self.path / name
            try:
                size = path.stat().st_size
            except OSError:
                return f"{name} is missing"
            if size != files[name]["size"]:
                return f"{name} has size {size}, manifest says {files[name]['size']}"
            if sha256_file(path) != files[name]["sha256"]:
                return f"{name} fails its sha256 check"
        return None


@dataclass
class DirTier:
    """One directory-backed tier."""

    name: str
    root: Path
    keep: int = 2
    every_checkpoints: int = 1
    _verified: dict[tuple[int, tuple[str, ...]], str | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    # ------------------------------------------------------------------ writing

    def staging(self, step: int) -> Path:
        folder = self.root / f".staging-{step:08d}"
        (folder / "parts").mkdir(parents=True, exist_ok=True)
        return folder

    def final(self, step: int) -> Path:
        return self.root / f"step-{step:08d}"

    def write_part(self, step: int, rank: int, files: dict[str, dict[str, Any]], replicated: set[str]) -> None:
        """Announce that ``rank``'s files for ``step`` are durable in the staging folder."""
        record = {"rank": rank, "files": files, "replicated": sorted(replicated & set(files))}
        write_json_durably(self.staging(step) / "parts" / f"rank-{rank:05d}.json", record)

    def commit(
        self,
        step: int,
        meta: dict[str, Any],
        expected_ranks: set[int],
        timeout: float,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> Committed:
        """Wait for every expected part, then write the manifest and COMMITTED and
        rename the staging folder into place. Only one process per tier calls this."""
        folder = self.staging(step)
        parts_dir = folder / "parts"
        deadline = time.monotonic() + timeout
        while True:
            present = {int(p.stem.split("-")[1]) for p in parts_dir.glob("rank-*.json")}
            if expected_ranks <= present:
                break
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"{self.name} tier: step {step} incomplete after {timeout:.0f}s; "
                    f"missing parts of ranks {sorted(expected_ranks - present)}"
                )
            heartbeat()
            time.sleep(0.02)
        files: dict[str, Any] = {}
        for rank in sorted(expected_ranks):
            record = json.loads((parts_dir / f"rank-{rank:05d}.json").read_text())
            files.update(record["files"])
        manifest = {
            **meta,
            "format": FORMAT_VERSION,
            "step": step,
            "ranks": sorted(expected_ranks),
            "files": files,
        }
        write_json_durably(folder / MANIFEST, manifest)
        digest = sha256_file(folder / MANIFEST)
        shutil.rmtree(parts_dir, ignore_errors=True)
        (folder / COMMITTED).write_text(digest + "\n")
        fsync_file(folder / COMMITTED)
        final = self.final(step)
        if final.exists():  # re-saving a step after a restore: replace the old copy
            shutil.rmtree(final)
        folder.replace(final)
        fsync_dir(self.root)
        return Committed(self.name, step, final, manifest)

    def retain(self) -> list[int]:
        """Delete committed checkpoints beyond ``keep`` (oldest first). Returns the steps
        deleted. Staging folders of steps older than the newest commit are swept too."""
        steps = sorted(c.step for c in self.list())
        doomed = steps[: max(0, len(steps) - self.keep)]
        for step in doomed:
            shutil.rmtree(self.final(step), ignore_errors=True)
        if steps:
            for stale in self.root.glob(".staging-*"):
                if int(stale.name.split("-")[1]) < steps[-1]:
                    shutil.rmtree(stale, ignore_errors=True)
        return doomed

    # ------------------------------------------------------------------ reading

    def list(self) -> list[Committed]:
        """Committed checkpoints whose COMMITTED marker matches the manifest, newest first.
        Unreadable entries are skipped, never raised: a tier must not break a restore."""
        out: list[Committed] = []
        if not self.root.is_dir():
            return out
        for folder in self.root.glob("step-*"):
            try:
                marker = (folder / COMMITTED).read_text().strip()
                if marker != sha256_file(folder / MANIFEST):
                    continue
                manifest = json.loads((folder / MANIFEST).read_text())
                out.append(Committed(self.name, int(manifest["step"]), folder, manifest))
            except (OSError, ValueError, KeyError):
                continue
        return sorted(out, key=lambda c: c.step, reverse=True)

    def verify_cached(self, committed: Committed, names: list[str] | None) -> str | None:
        key = (committed.step, tuple(names) if names is not None else ())
        if key not in self._verified:
            self._verified[key] = committed.verify(names)
        return self._verified[key]

    def sweep_staging(self) -> None:
        """Remove staging folders left by a crash. Called before the first save."""
        for stale in self.root.glob(".staging-*"):
            shutil.rmtree(stale, ignore_errors=True)
