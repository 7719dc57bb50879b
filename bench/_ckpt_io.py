"""The I/O side of bench/checkpoint.py: the disk's own bandwidth (dd), tier-1 persist and
restore throughput, S3 restore in parallel against one stream, and the balanced persist
of a replicated state by 1 and by 2 nodes. Every time is the benchmark's own clock
around the whole operation."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BLOCK = 32 << 20


def drop_caches() -> None:
    """Cold reads: the page cache must not serve what the disk should."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def dd_write(folder: Path, size: int) -> float:
    """Bytes/s of the disk under ``folder`` writing ``size`` bytes: dd with direct I/O, the
    data fsync'ed."""
    path = folder / "dd.bin"
    count = max(1, size // BLOCK)
    began = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={BLOCK}", f"count={count}", "oflag=direct", "conv=fsync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - began
    return count * BLOCK / seconds


def dd_read(folder: Path) -> float:
    """Bytes/s of the disk reading back ``dd_write``'s file: direct I/O, cold cache."""
    path = folder / "dd.bin"
    drop_caches()
    began = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", f"bs={BLOCK}", "iflag=direct"], check=True, capture_output=True)
    return path.stat().st_size / (time.perf_counter() - began)


def committed_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def persist_and_restore(trainer: Any, folder: Path, rounds: int) -> dict[str, float]:
    """Tier 1 against the disk's own bandwidth, alternating round by round so that the
    disk's drift hits both alike; medians. *Persist*: from the save call to the moment
    the step's ``COMMITTED`` appears (what a reader can see; polled every 5 ms), training
    waiting. *Restore*: reading the state back into memory as a restore does (direct I/O,
    every byte hashed and checked), cold cache."""
    from llmtrain_trainer.engines import rng  # noqa: PLC0415

    t = trainer.trainer
    persist, restore, writes, reads = [], [], [], []
    size = 0
    for _ in range(rounds):
        t.step_once()
        t.ckpt.wait()  # a checkpoint the loop itself took at this step is not the one timed
        began = time.perf_counter()
        t.ckpt.save(t.step, t.step * trainer.batch, rng.capture())
        marker = t.ckpt.local.final(t.step) / "COMMITTED"
        while not marker.exists():
            time.sleep(0.005)
        seconds = time.perf_counter() - began
        t.ckpt.wait()
        size = committed_bytes(t.ckpt.local.final(t.step))
        persist.append(size / seconds)
        writes.append(dd_write(folder, size))
        restore.append(restore_bandwidth(t.ckpt.local.root))
        reads.append(dd_read(folder))
        (folder / "dd.bin").unlink()
    return {"persist": statistics.median(persist), "dd_write": statistics.median(writes), "bytes": size,
            "restore": statistics.median(restore), "dd_read": statistics.median(reads)}


def restore_bandwidth(tier: Path) -> float:
    """Bytes/s reading the newest tier-1 checkpoint's state into memory as a restore does,
    cold cache."""
    from llmtrain_store import manifest as mf  # noqa: PLC0415
    from llmtrain_store.archive import decode_header, header_block_size  # noqa: PLC0415
    from llmtrain_store.directory import DirTier  # noqa: PLC0415
    from llmtrain_trainer.state.arena import Arena  # noqa: PLC0415
    from llmtrain_trainer.state.tensorio import read_arena  # noqa: PLC0415
    from llmtrain_trainer.engines.ddp import DDPEngine  # noqa: PLC0415

    newest = DirTier("local", tier).list()[0]
    path = Path(newest.location) / "state.llmt"
    entry = mf.entries(newest.manifest, DDPEngine.allowed_names())["state.llmt"]
    with open(path, "rb") as fh:
        length = header_block_size(fh.read(16))
        fh.seek(0)
        prefix = fh.read(length)
    arena = Arena(list(decode_header(prefix).tensors))
    arena.as_bytes_tensor().zero_()  # faulted in: a restore reads into a live model
    drop_caches()
    began = time.perf_counter()
    read_arena(path, arena, [(p.offset, p.size, p.hash) for p in entry.pieces])
    return entry.size / (time.perf_counter() - began)


# ---------------------------------------------------------------------------- S3


def upload(tier: Any, local: Path, nodes: int = 1) -> Any:
    """Store the newest tier-1 checkpoint under ``local`` into ``tier`` as a job of
    ``nodes`` nodes would (each its share), and commit; returns the committed step."""
    from llmtrain_store import manifest as mf  # noqa: PLC0415
    from llmtrain_store import shares  # noqa: PLC0415
    from llmtrain_store.sources import FileSource  # noqa: PLC0415
    from llmtrain_store.directory import DirTier  # noqa: PLC0415
    from llmtrain_trainer.checkpoint.propagate import pieces_of  # noqa: PLC0415

    newest = DirTier("local", local).list()[0]
    record = newest.manifest["files"]["state.llmt"]
    pieces = pieces_of(record)
    source = FileSource(Path(newest.location) / "state.llmt")
    for node, run in enumerate(shares.split(pieces, nodes)):
        if run:
            tier.put_share(newest.step, mf.slice_name("state.llmt", node, nodes), source, run)
        tier.write_part(newest.step, node, {"slices": {"state.llmt": {
            "size": record["size"], "pieces": shares.share_record("state.llmt", node, nodes, run)}}})
    meta = {k: v for k, v in newest.manifest.items() if k not in ("files", "ranks", "format", "step", "hash")}
    ranks = set(range(nodes))
    return tier.commit(newest.step, {**meta, "world_size": nodes}, ranks, ranks, timeout=60)


def s3_restore(server: Any, local: Path, scratch: Path, rate: float | None) -> tuple[float, float]:
    """(parallel, single-stream) seconds to bring the state back from S3: the S3 tier's
    fetch (parallel ranged GETs of every slice, hashes checked) against a plain boto3
    ``get_object`` read of the same objects one after the other. ``rate``: bytes/s per
    connection (``PacedProxy``), None for loopback as it is."""
    import boto3  # noqa: PLC0415
    from botocore.config import Config  # noqa: PLC0415

    sys.path.insert(0, str(HERE))
    from _links import PacedProxy  # noqa: PLC0415
    from llmtrain_store.s3 import S3Tier  # noqa: PLC0415
    from llmtrain_trainer.engines.ddp import DDPEngine  # noqa: PLC0415

    proxy = PacedProxy("127.0.0.1", server.port, rate).start() if rate else None
    endpoint = f"http://127.0.0.1:{proxy.port}" if proxy else server.endpoint
    try:
        tier = S3Tier("s3", "s3://bench/restore", endpoint=endpoint)
        committed = tier.list()[0]
        drop_caches()
        began = time.perf_counter()
        tier.fetch(committed, ["state.llmt"], scratch / "parallel", DDPEngine.allowed_names())
        parallel = time.perf_counter() - began
        client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                                config=Config(s3={"addressing_style": "path"}))
        keys = sorted({p["name"] for p in committed.manifest["files"]["state.llmt"]["slices"]})
        drop_caches()
        began = time.perf_counter()
        with open(scratch / "single", "wb") as out:
            for key in keys:
                body = client.get_object(Bucket="bench", Key=f"{committed.location}/{key}")["Body"]
                while block := body.read(8 << 20):
                    out.write(block)
            out.flush()
            os.fsync(out.fileno())
        single = time.perf_counter() - began
    finally:
        if proxy:
            proxy.stop()
    for name in ("parallel", "single"):
        subprocess.run(["rm", "-rf", str(scratch / name)], check=False)
    return parallel, single


# ---------------------------------------------------------------------------- balanced persist


def balanced_persist(server: Any, local: Path, nodes: int, rate_mbit: int, prefix: str) -> float:
    """Seconds for ``nodes`` nodes, each in its own network namespace behind a link
    shaped to ``rate_mbit``, to store a job-wide copy of the replicated state in S3 (each
    node its share, then rank 0 commits): from the go signal, by this clock, until every
    node's process is done."""
    sys.path.insert(0, str(HERE))
    from _links import NodeLinks  # noqa: PLC0415

    go = local.parent / f"go-{prefix}"
    go.unlink(missing_ok=True)
    with NodeLinks(nodes, rate_mbit) as links:
        procs = []
        for node in range(nodes):
            endpoint = f"http://{links.host_ip(node)}:{server.port}"
            argv = [sys.executable, str(HERE / "_persist_node.py"), json.dumps({
                "local": str(local), "node": node, "nodes": nodes, "endpoint": endpoint, "uri": f"s3://bench/{prefix}",
                "go": str(go), "env": server.env()})]
            procs.append(subprocess.Popen(links.command(node, argv), stdout=subprocess.PIPE, text=True))
        for proc in procs:  # each prints "ready" once imported and connected
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "a node did not start"
        drop_caches()
        began = time.perf_counter()
        go.write_text("go")
        codes = [proc.wait(timeout=3600) for proc in procs]
        seconds = time.perf_counter() - began
    if any(codes):
        raise RuntimeError(f"a node failed: exit codes {codes}")
    return seconds
