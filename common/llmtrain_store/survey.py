"""What ``llmtrain checkpoints`` does, without the CLI around it: find a job's tiers,
list their checkpoints with a cheap check, verify every byte, apply retention.

A *target* is a local run's workdir (``runs/<job>``: every node's tier 1 and the shared
tier), a tier directory, or an S3 URI (``s3://bucket/prefix``; endpoint and credentials
from the environment, as boto3 takes them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import manifest as mf
from . import piecestore
from .fileio import Hasher, iter_file
from .s3 import S3Tier
from .directory import DirTier
from .tier import CheckpointError, Committed, Tier


@dataclass(frozen=True)
class Found:
    label: str
    """How the tier is named in the output: its path or URI, and its role."""
    tier: Tier


def tiers_of(target: str, endpoint: str | None = None) -> list[Found]:
    """The tiers a target names. Raises ValueError when it names none."""
    if target.startswith("s3://"):
        return [Found(target, S3Tier("s3", target, endpoint=endpoint))]
    path = Path(target)
    if not path.is_dir():
        raise ValueError(f"{target}: no such directory (give a local run's workdir, a tier directory or an s3:// URI)")
    if any(path.glob(mf.STEP_PREFIX + "*")) or any(path.glob(mf.STAGING_PREFIX + "*")):
        return [Found(str(path), DirTier(path.name, path))]
    found = [Found(f"{node / 'ckpt'} (local)", DirTier("local", node / "ckpt")) for node in sorted(path.glob("node-*"))
             if (node / "ckpt").is_dir()]
    if (path / "shared").is_dir():
        found.append(Found(f"{path / 'shared'} (shared)", DirTier("shared", path / "shared")))
    if not found:
        raise ValueError(f"{target}: holds no checkpoints (no step-* folders, no node-*/ckpt or shared/ tiers)")
    return found


@dataclass
class Row:
    step: int
    world: int
    ranks: list[int]
    bytes: int
    strategy: str
    complete: bool
    """Holds every rank's files of the world that saved it."""
    problem: str | None
    """None when names and sizes check out; else why not."""
    committed: Committed
    stored: int = 0
    """Bytes this step added to the tier: its own objects, and the content-addressed
    pieces no older listed step holds, as stored (compressed where they are)."""


def rows(found: Found) -> list[Row]:
    """Every committed checkpoint of a tier, newest first, each checked cheaply: the
    manifest's names (what the engine writes, no escapes) and each stored object's size."""
    out = []
    parsed: dict[int, dict[str, mf.FileEntry]] = {}
    for committed in found.tier.list():
        man = committed.manifest
        allowed = mf.ENGINE_FILES.get(str(man.get("strategy")))
        try:
            files = mf.entries(man, allowed) if allowed is not None else None
            problem = None if files is not None else f"unknown strategy {man.get('strategy')!r}"
        except mf.ManifestRejected as err:
            files, problem = None, f"manifest rejected: {err}"
        if problem is None and allowed is not None:
            problem = found.tier.verify(committed, None, allowed) if isinstance(found.tier, S3Tier) else _sizes(committed, files)
        out.append(Row(committed.step, committed.world_size, sorted(committed.ranks),
                       sum(f.size for f in files.values()) if files else 0, str(man.get("strategy")), committed.complete,
                       problem, committed))
        parsed[committed.step] = files or {}
    _count_stored(out, parsed)
    return out


def _count_stored(rows: list[Row], parsed: dict[int, dict[str, mf.FileEntry]]) -> None:
    """Each row's ``stored`` from its checked files (``parsed``): oldest first, a
    content-addressed piece counts for the first step that holds it (``pieces.py``)."""
    seen: set[str] = set()
    for row in sorted(rows, key=lambda r: r.step):
        for entry in parsed[row.step].values():
            for obj, (size, _) in entry.stored_sizes().items():
                row.stored += size if obj == entry.name else sum(p.size for p in entry.pieces if p.name == obj)
            for obj, size in entry.piece_sizes().items():
                if obj not in seen:
                    seen.add(obj)
                    row.stored += size


def _sizes(committed: Committed, files: dict[str, mf.FileEntry] | None) -> str | None:
    folder = Path(committed.location)
    for entry in (files or {}).values():
        for obj, expected in entry.piece_sizes().items():
            try:
                size = mf.inside(folder.parent, obj).stat().st_size
            except mf.ManifestRejected as err:
                return str(err)
            except OSError:
                return f"{obj} is missing"
            if size != expected:
                return f"{obj} has {size} bytes, the manifest says {expected}"
        for stored, (expected, exact) in entry.stored_sizes().items():
            try:
                size = mf.inside(folder, stored).stat().st_size
            except mf.ManifestRejected as err:
                return str(err)
            except OSError:
                return f"{stored} is missing"
            if size != expected if exact else size < expected:
                return f"{stored} has {size} bytes, the manifest says {'' if exact else 'at least '}{expected}"
    return None


def verify(found: Found, committed: Committed, progress: Callable[[int], None] = lambda n: None,
           workers: int = 4) -> str | None:
    """Hash every byte of a checkpoint against its manifest (an S3 tier's objects are
    streamed, never stored); ``progress`` hears of each block. None when it all matches."""
    allowed = mf.ENGINE_FILES.get(str(committed.manifest.get("strategy")))
    if allowed is None:
        return f"unknown strategy {committed.manifest.get('strategy')!r}"
    try:
        pieces = [p for f in mf.entries(committed.manifest, allowed).values() for p in f.pieces]
    except mf.ManifestRejected as err:
        return f"manifest rejected: {err}"
    tier = found.tier

    def check(piece: mf.Piece) -> str | None:
        hasher, size = Hasher(), 0
        try:
            for block in _blocks(tier, committed, piece):
                hasher.update(block)
                size += len(block)
                progress(len(block))
        except (mf.ManifestRejected, CheckpointError) as err:
            return str(err)
        except Exception as err:  # noqa: BLE001 - a missing or unreadable object is a finding, not a crash
            return f"{piece.name}: cannot be read ({type(err).__name__})"
        if size != piece.size or hasher.hexdigest() != piece.hash:
            return f"{piece.name} fails its {committed.manifest.get('hash', 'xxh3-128')} check at bytes {piece.at}..{piece.at + piece.size}"
        return None

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verify") as pool:
        problems = [p for p in pool.map(check, pieces) if p]
    return problems[0] if problems else None


def _blocks(tier: Tier, committed: Committed, piece: mf.Piece) -> Iterator[bytes]:
    if piece.ref is not None:  # read whole, decompressed with a bound and checked (piecestore.read)
        assert isinstance(tier, (S3Tier, DirTier))
        yield piecestore.read(tier, piece)
        return
    if isinstance(tier, S3Tier):
        body = tier.client().get_object(Bucket=tier.bucket, Key=f"{committed.location}/{piece.name}",
                                        Range=f"bytes={piece.at}-{piece.at + piece.size - 1}")["Body"]
        while block := body.read(8 << 20):
            yield block
        return
    yield from iter_file(mf.inside(Path(committed.location), piece.name), piece.at, piece.size)


def prune(found: Found, keep: int, dry_run: bool) -> list[int]:
    """Apply retention: keep the newest ``keep`` committed checkpoints (and sweep
    abandoned uploads or staging folders older than the newest). Returns the steps
    deleted (or, with ``dry_run``, that would be)."""
    steps = sorted(c.step for c in found.tier.list())
    doomed = steps[: max(0, len(steps) - keep)]
    if dry_run:
        return doomed
    tier = found.tier
    tier.keep = keep
    return tier.retain()


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return f"{size:.2f} TB"
