"""Tier 3: S3, or any S3-compatible store (MinIO, Ceph, ...), through boto3.

Transfers go through boto3's transfer manager (s3transfer's ``TransferConfig``): large
objects upload as concurrent multipart uploads and download as parallel ranged GETs; at
most ``max_in_memory_upload_chunks`` parts sit in memory, so a slow S3 never piles up
memory. Requests are retried with backoff by botocore; each part carries a CRC32 the
server verifies; and every byte is hashed (xxh3-128) against the manifest: while it is
read for upload (before it leaves) and after it is downloaded (before it is used).

Layout under ``s3://bucket/prefix/``, as in a directory tier, except that S3 has no
rename: objects go straight under ``step-<n>/``, and ``COMMITTED`` (the manifest's hash),
written last, is what makes a step exist for readers. Steps without it are swept.
Part records go under ``step-<n>/parts/<owner token>/`` (``owner.py``).

Content-addressed (``content_addressed``, ``pieces.py``): each piece is one object under
``pieces/<hash>-<size>[.zst]``, shared by every step holding it; a writer's claim goes
under ``claims/step-<n>.<owner token>.rank-<r>.json`` until its step is committed; a
piece collection in progress is marked under ``collecting/``.
"""

from __future__ import annotations

import builtins
import io
import json
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from . import manifest as mf
from . import pieces, piecestore
from .fileio import Hasher, hash_file
from .sources import Source, iter_range
from .health import absent
from .owner import Scope, mine, my_token
from .tier import (CheckpointError, Committed, StepUnreadable, allocate, digest_bytes, finish_fetch, merge_parts, new_manifest,
                   wait_for_parts)

CHUNK = 32 << 20
"""Part size of multipart uploads and ranged downloads."""
log = logging.getLogger("llmtrain.checkpoint")


def _hash_range(source: Source, offset: int, length: int) -> str:
    hasher = Hasher()
    for block in iter_range(source, offset, length):
        hasher.update(block)
    return hasher.hexdigest()


def parse_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri}")
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri}")
    return bucket, prefix.strip("/")


class RangeReader(io.RawIOBase):
    """A byte range of a file as a seekable stream, hashing what is read in one pass from
    the start, piece by piece (a seek back to the start, as botocore does to retry or to
    checksum a body, starts the hashes over)."""

    def __init__(self, source: Source, offset: int, sizes: list[int], heartbeat: Callable[[], None] = lambda: None):
        self._source = source
        self._start, self._length, self._pos = offset, sum(sizes), 0
        self._sizes = sizes
        self._hashes: list[str] = []
        self._hasher = Hasher()
        self._hashed = 0
        self._heartbeat = heartbeat

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self._pos + offset, 2: self._length + offset}[whence]
        self._pos = max(0, min(self._length, target))
        if self._pos == 0:
            self._hasher, self._hashed, self._hashes = Hasher(), 0, []
        return self._pos

    def read(self, size: int = -1) -> bytes:
        left = self._length - self._pos
        size = left if size is None or size < 0 else min(size, left)
        if size <= 0:
            return b""
        data = self._source.read(self._start + self._pos, size)
        if self._pos == self._hashed:
            self._feed(memoryview(data))
        self._pos += len(data)
        self._heartbeat()
        return data

    def _feed(self, data: memoryview) -> None:
        """Hash ``data`` (the next bytes in order), closing a piece at each boundary."""
        while len(data):
            boundary = sum(self._sizes[: len(self._hashes) + 1])
            take = min(len(data), boundary - self._hashed)
            self._hasher.update(data[:take])
            self._hashed += take
            data = data[take:]
            if self._hashed == boundary:
                self._hashes.append(self._hasher.hexdigest())
                self._hasher = Hasher()

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def digests(self) -> list[str] | None:
        """Each piece's hash, if the range was read in one pass."""
        return self._hashes if self._hashed == self._length else None

class OffsetWriter(io.RawIOBase):
    """Where s3transfer writes a download: at ``base`` + its offsets in an open file,
    keeping only the object's bytes in ``window`` (an object may hold more pieces than
    the copy chosen from it; the rest belongs to other objects' ranges of the file)."""

    def __init__(self, fd: int, base: int, window: tuple[int, int], heartbeat: Callable[[], None] = lambda: None):
        self._fd, self._base, self._pos = fd, base, 0
        self._lo, self._hi = window
        self._heartbeat = heartbeat

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else self._pos + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        start, end = max(self._pos, self._lo), min(self._pos + len(view), self._hi)
        done = start
        while done < end:
            done += os.pwrite(self._fd, view[done - self._pos:end - self._pos], self._base + done)
        self._pos += len(view)
        self._heartbeat()
        return len(view)


@dataclass
class S3Tier(piecestore.PieceTier):
    CLAIM_POLL_SECONDS: ClassVar[float] = 0.5  # a listing of markers is a request: not five a second

    name: str
    uri: str
    keep: int = 5
    interval_steps: int = 0
    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    """Path-style addressing (``endpoint/bucket/key``), which most S3-compatible servers
    need; default: on when an endpoint is given."""
    concurrency: int = 8
    """Parallel parts of one transfer (multipart upload, ranged download)."""
    connect_timeout: float = 5
    attempts: int = 6
    """Tries of one request (botocore's standard retry mode: exponential backoff)."""
    scope: Scope | None = None
    """The run writing this tier (set once its restore is agreed): retention touches only
    its lineage's steps (``owner.py``). None (a tool acting by hand): every step."""
    content_addressed: bool = False
    """Store pieces by content, once for every step that holds them (``pieces.py``)."""
    _client: Any = field(default=None, repr=False)
    _delete_client: Any = field(default=None, repr=False)

    kind = "s3"

    def __post_init__(self) -> None:
        self.bucket, self.prefix = parse_uri(self.uri)

    # ------------------------------------------------------------------ plumbing

    def client(self) -> Any:
        if self._client is None:
            self._client = self._make_client(self.attempts, self.connect_timeout, 60)
        return self._client

    def _deleter(self) -> Any:
        """A client for a collection's piece deletes: one attempt, short timeouts, so that
        every delete is over within ``pieces.WAIT - pieces.WINDOW`` of its window's end
        (a writer that waited that long trusts the listing; ``pieces.py``)."""
        if self._delete_client is None:
            self._delete_client = self._make_client(1, 3, 5)
        return self._delete_client

    def _make_client(self, attempts: int, connect_timeout: float, read_timeout: float) -> Any:
        import boto3  # noqa: PLC0415 - only jobs with an S3 tier need boto3
        from botocore.config import Config  # noqa: PLC0415

        endpoint = self.endpoint or os.environ.get("AWS_ENDPOINT_URL") or None
        if self.path_style is None:
            style = "path" if endpoint is not None else "auto"
        else:
            style = "path" if self.path_style else "virtual"
        config = Config(
            retries={"max_attempts": attempts, "mode": "standard"}, connect_timeout=connect_timeout,
            read_timeout=read_timeout, s3={"addressing_style": style}, max_pool_connections=max(10, self.concurrency * 2),
        )
        return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=self.region or "us-east-1", config=config)

    def transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig  # noqa: PLC0415

        return TransferConfig(multipart_threshold=CHUNK, multipart_chunksize=CHUNK, max_concurrency=self.concurrency,
                              use_threads=True)

    def key(self, step: int, name: str = "") -> str:
        parts = [p for p in (self.prefix, mf.step_dir(step), name) if p]
        return "/".join(parts)

    def _put(self, key: str, body: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=body)

    def _get(self, key: str) -> bytes:
        data: bytes = self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return data

    def _objects(self, prefix: str) -> dict[str, int]:
        """key -> size, of every object under ``prefix``."""
        out: dict[str, int] = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = int(obj["Size"])
        return out

    def _steps(self) -> list[int]:
        prefix = (self.prefix + "/" if self.prefix else "") + mf.STEP_PREFIX
        found = set()
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                tail = common["Prefix"].rstrip("/").rsplit("/", 1)[-1]
                if tail[len(mf.STEP_PREFIX):].isdigit():
                    found.add(int(tail[len(mf.STEP_PREFIX):]))
        return sorted(found)

    # ------------------------------------------------------------------ writing

    def put_share(self, step: int, name: str, source: Source, pieces: list[tuple[int, int, str]],
                  heartbeat: Callable[[], None] = lambda: None) -> None:
        """Upload the contiguous ``pieces`` (offset, size, hash) of ``source`` as the
        object ``name``. The bytes are hashed as they are read: if a piece does not match
        its hash (the disk returned something else than was written), the object is
        deleted and CheckpointError raised."""
        reader = RangeReader(source, pieces[0][0], [p[1] for p in pieces], heartbeat)
        self.client().upload_fileobj(reader, self.bucket, self.key(step, name), Config=self.transfer_config())
        digests = reader.digests()
        if digests is None:
            digests = [_hash_range(source, o, n) for o, n, _ in pieces]
        if digests != [p[2] for p in pieces]:
            self.client().delete_object(Bucket=self.bucket, Key=self.key(step, name))
            raise CheckpointError(f"{self.name} tier: {name} of step {step} read back from disk does not match its hash")

    # ------------------------------------------------------------------ pieces (content_addressed)

    def _under(self, folder: str) -> str:
        return "/".join(p for p in (self.prefix, folder) if p) + "/"

    def piece_objects(self) -> dict[str, int]:
        base = self._under(pieces.PIECES_DIR)
        return {key[len(base):]: size for key, size in self._objects(base).items() if "/" not in key[len(base):]}

    def piece_put(self, obj: str, data: bytes) -> None:
        self._put(self._under(pieces.PIECES_DIR) + obj, data)

    def piece_get(self, obj: str) -> bytes:
        return self._get(self._under(pieces.PIECES_DIR) + obj)

    def piece_delete(self, obj: str) -> None:
        self._deleter().delete_object(Bucket=self.bucket, Key=self._under(pieces.PIECES_DIR) + obj)

    def _claim_key(self, step: int, writer: int | None = None) -> str:
        token = self.scope.token if self.scope else "none"
        tail = "" if writer is None else f"rank-{writer:05d}.json"
        return f"{self._under('claims')}{mf.step_dir(step)}.{token}.{tail}"

    def claims(self) -> builtins.list[Any]:
        out = []
        for key in self._objects(self._under("claims")):
            try:
                out.append(json.loads(self._get(key)))
            except ValueError as err:
                raise CheckpointError(f"{self.name} tier: claim {key.rsplit('/', 1)[-1]} is not JSON; no piece is collected") from err
            except Exception as err:
                if not absent(err):
                    raise
        return out

    def claim_put(self, step: int, writer: int, record: dict[str, Any]) -> None:
        self._put(self._claim_key(step, writer), json.dumps(record).encode())

    def _drop_claims(self, step: int) -> None:
        self._delete_keys(list(self._objects(self._claim_key(step))))

    def _drop_stale_claims(self, newest: int) -> None:
        """This run's claims of steps older than its newest commit: left by a writer that
        died before its part record, or by a failed delete at a commit. No write of
        them is in progress (a run stores its steps in order), and each pins pieces."""
        base = self._under("claims")
        token = self.scope.token if self.scope else "none"
        stale = []
        for key in self._objects(base):
            folder, _, rest = key[len(base):].partition(".")
            step = mf.step_of(folder)
            if step is not None and step < newest and rest.startswith(token + "."):
                stale.append(key)
        self._delete_keys(stale)

    def markers(self) -> builtins.list[str]:
        base = self._under("collecting")
        return sorted(key[len(base):] for key in self._objects(base))

    def marker_put(self, token: str) -> None:
        self._put(self._under("collecting") + token, b"")

    def marker_drop(self, token: str) -> None:
        self._delete_keys([self._under("collecting") + token])

    # ------------------------------------------------------------------ parts and commits

    def _parts(self, step: int) -> str:
        """Where ``step``'s part records go: under the writer's owner token, so that two
        runs writing one step number never count each other's parts."""
        return self.key(step, f"parts/{self.scope.token}/" if self.scope else "parts/")

    def write_part(self, step: int, writer: int, part: dict[str, Any]) -> None:
        self._put(f"{self._parts(step)}rank-{writer:05d}.json", json.dumps(part, sort_keys=True).encode())

    def commit(self, step: int, meta: dict[str, Any], expected: set[int], ranks: set[int], timeout: float,
               heartbeat: Callable[[], None] = lambda: None) -> Committed:
        parts_prefix = self._parts(step)
        wait_for_parts(self.name, step, expected,
                       lambda: {int(k[len(parts_prefix) + 5:-5]) for k in self._objects(parts_prefix)
                                if k[len(parts_prefix):].startswith("rank-") and k[len(parts_prefix) + 5:-5].isdigit()},
                       timeout, heartbeat, poll=0.5)
        parts = [json.loads(self._get(f"{parts_prefix}rank-{w:05d}.json")) for w in sorted(expected)]
        manifest = new_manifest(step, meta, ranks, merge_parts(parts))
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        self._put(self.key(step, mf.MANIFEST), text)
        self._put(self.key(step, mf.COMMITTED), (digest_bytes(text) + "\n").encode())
        try:  # the manifest holds what the part records and claims said; they are clutter now
            self._delete_keys([f"{parts_prefix}rank-{w:05d}.json" for w in sorted(expected)])
            if self.content_addressed:
                self._drop_claims(step)
        except Exception as err:  # noqa: BLE001 - the step is committed; leftovers are harmless
            log.debug("step %d: part records not removed (%s)", step, type(err).__name__)
        return Committed(self, step, self.key(step), manifest)

    def delete(self, step: int) -> None:
        """COMMITTED first, so that a step half deleted is never listed."""
        self._delete_keys([self.key(step, mf.COMMITTED)])
        self._delete_keys(list(self._objects(self.key(step) + "/")))

    def _delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            self.client().delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]],
                                                                       "Quiet": True})

    def retain(self) -> list[int]:
        """Delete committed steps beyond ``keep`` (oldest first), and uncommitted steps
        older than the newest committed one (abandoned uploads). Only ``scope``'s steps
        count or go: another run's committed steps, and uploads holding another run's
        part records, stay."""
        untouchable: set[int | None] = set()
        try:
            listed = self.list()
        except StepUnreadable as err:  # counted among the readable steps only, never deleted
            log.warning("%s: retention keeps it and counts the readable steps", err)
            listed, untouchable = err.listed, set(err.steps)
        committed = sorted(c.step for c in listed if mine(self.scope, c.manifest))
        untouchable |= {c.step for c in listed}
        doomed = committed[: max(0, len(committed) - self.keep)]
        abandoned = []
        if committed:
            abandoned = [s for s in self._steps() if s < committed[-1] and s not in untouchable and self._abandoned_mine(s)]
        for step in doomed + abandoned:
            self.delete(step)
        if committed:
            self._drop_stale_claims(committed[-1])
        self.collect()
        return sorted(set(doomed + abandoned))

    def _abandoned_mine(self, step: int) -> bool:
        """An uncommitted step holds no part record of another run (whose upload it may be)."""
        prefix = self.key(step, "parts/")
        for key in self._objects(prefix):
            head = key[len(prefix):].split("/", 1)
            if len(head) == 2 and not my_token(self.scope, head[0]):
                return False
        return True

    def sweep_staging(self) -> None:
        """Nothing to do at start: an unfinished step has no COMMITTED and is swept by
        ``retain`` once a newer step commits."""

    # ------------------------------------------------------------------ reading

    def list(self) -> list[Committed]:
        """Committed steps, newest first. A step without its manifest or marker (not
        committed yet, or being deleted) or whose marker does not match is left out; one
        that cannot be read for another reason raises StepUnreadable (``tier.py``)."""
        out = []
        unreadable: list[tuple[int, BaseException]] = []
        for step in self._steps():
            try:
                text = self._get(self.key(step, mf.MANIFEST))
                marker = self._get(self.key(step, mf.COMMITTED))
            except Exception as err:  # noqa: BLE001 - classified: absent, or unreadable (named after the listing)
                if not absent(err):
                    unreadable.append((step, err))
                continue
            if marker.decode(errors="replace").strip() != digest_bytes(text):
                continue
            try:
                manifest = json.loads(text)
                out.append(Committed(self, int(manifest["step"]), self.key(step), manifest))
            except (ValueError, KeyError, TypeError):  # a manifest that matches its marker but is no manifest
                continue
        listed = sorted(out, key=lambda c: c.step, reverse=True)
        if unreadable:
            raise StepUnreadable(self.name, [s for s, _ in unreadable], unreadable[0][1], listed) from unreadable[0][1]
        return listed

    def verify(self, committed: Committed, names: builtins.list[str] | None, allowed: re.Pattern[str]) -> str | None:
        """Names and sizes: the bytes themselves are hashed as they are fetched."""
        try:
            files = mf.entries(committed.manifest, allowed)
            sizes = self._objects(committed.location + "/")
        except mf.ManifestRejected as err:
            return f"manifest rejected: {err}"
        held = None
        for name in names if names is not None else list(files):
            if name not in files:
                return f"{name} is not in the manifest"
            for stored, (expected, exact) in files[name].stored_sizes().items():
                size = sizes.get(f"{committed.location}/{stored}")
                if size is None:
                    return f"{stored} is missing"
                if size != expected if exact else size < expected:
                    return f"{stored} has {size} bytes, the manifest says {'' if exact else 'at least '}{expected}"
            if files[name].referenced:
                held = self.piece_objects() if held is None else held
                for obj, expected in files[name].piece_sizes().items():
                    size = held.get(obj.removeprefix(pieces.PIECES_DIR + "/"))
                    if size is None:
                        return f"{obj} is missing"
                    if size != expected:
                        return f"{obj} has {size} bytes, the manifest says {expected}"
        return None

    def fetch(self, committed: Committed, names: builtins.list[str], dest: Path, allowed: re.Pattern[str],
              heartbeat: Callable[[], None] = lambda: None, workers: int = 4,
              optional: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
        """Download the named files (slices in parallel, each as parallel ranged GETs)
        into ``dest``, then check every piece's hash (read back from the page cache: the
        ranged parts arrive out of order); returns their records. A mismatch raises
        CheckpointError, except for ``optional`` files, which are left out."""
        files = mf.entries(committed.manifest, allowed)
        jobs = []
        shared: dict[str, list[tuple[Path, str, mf.Piece]]] = {}
        for name in names:
            entry = files[name]
            target = allocate(dest, name, entry.size)
            if entry.referenced:  # content-addressed: each object read once, checked in memory
                for piece in entry.pieces:
                    shared.setdefault(piece.name, []).append((target, name, piece))
                continue
            # The pieces used from one object are a contiguous run of it (merge_parts
            # leaves an object only when it ends): it lands at its first piece's offset.
            spans: dict[str, tuple[int, int, int]] = {}
            for piece in entry.pieces:
                base, lo, hi = spans.get(piece.name, (piece.offset - piece.at, piece.at, piece.at))
                spans[piece.name] = (base, min(lo, piece.at), max(hi, piece.at + piece.size))
            jobs += [(target, obj, span) for obj, span in spans.items()]

        def download(job: tuple[Path, str, tuple[int, int, int]]) -> None:
            target, obj, (base, lo, hi) = job
            fd = os.open(target, os.O_WRONLY)
            try:
                self.client().download_fileobj(self.bucket, f"{committed.location}/{obj}",
                                               OffsetWriter(fd, base, (lo, hi), heartbeat), Config=self.transfer_config())
                os.fsync(fd)
            finally:
                os.close(fd)

        failed: dict[str, str] = {}
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3-fetch") as pool:
            list(pool.map(download, jobs))
        failed.update(piecestore.place_all(self, shared, committed.step, max(workers, self.concurrency), heartbeat))
        for name in names:
            if files[name].referenced:
                continue
            for piece in files[name].pieces:
                if hash_file(dest / name, piece.offset, piece.size)[1] != piece.hash:
                    failed[name] = f"{self.name} tier: {piece.name} of step {committed.step} does not match its manifest"
                    break
            heartbeat()
        return finish_fetch(files, names, dest, failed, optional)
