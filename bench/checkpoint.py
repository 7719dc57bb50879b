"""Checkpoints: the training time a checkpoint costs, and how fast the tiers move it.

Everything below is measured side by side in one run, on this machine, by this script's
own clock (see docs/benchmarks.md for the results and how to read them):

- *stall*: the extra wall time of a window of steps containing one checkpoint over the
  same window without one (``_ckpt_train.py``), for our trainer with tier 1 on disk, on
  a RAM-backed tier 1, and for ``torch.distributed.checkpoint.async_save`` of the same
  state. ``stall_reduction`` = a synchronous save (``torch.save`` + fsync) / our stall;
  ``stall_vs_dcp`` = our stall / DCP's.
- ``io_steal``: on a virtual machine, the hypervisor does a guest's disk I/O on the
  guest's own CPUs (reported as steal time); this row measures the training time lost
  while ``dd`` alone writes the same bytes, the floor of any on-disk stall here.
- ``persist_bw_ratio`` / ``restore_bw_ratio``: tier-1 throughput of a checkpoint's
  persist (snapshot to commit) and restore (read, every byte hashed) over the disk's own
  sequential bandwidth (dd, direct I/O).
- ``s3_restore_speedup``: the S3 tier's parallel restore over one boto3 stream of the
  same objects, with each connection paced like S3's (``_links.PacedProxy``); the
  loopback figure without pacing is printed too.
- ``balanced_persist_speedup``: a job-wide copy of the replicated state persisted by one
  node over by two, each node behind its own shaped link (``_links.NodeLinks``).
- a sweep of the stall over step times (batch sizes) and state sizes (presets), plotted.
- *incremental* (``_ckpt_delta.py``): bytes each checkpoint after the first adds to the
  shared tier and to S3, and the time until it is committed there, for full training,
  90 % of the weights frozen and LoRA, with the tiers storing pieces by content against
  storing them whole; ``<mode>_s3_later_fraction`` = bytes added / the state's bytes,
  ``<mode>_bytes_whole_over_pieces`` = whole / by content, and the restore's time by
  content over whole.

    sudo python bench/checkpoint.py [--quick] [--plot docs/img/checkpoint_stall.png]
    python bench/checkpoint.py --incremental-only [--quick]     # the last row alone (no root)
    sudo python bench/checkpoint.py --incremental-only --cold-restores   # its restores from a dropped page cache

Needs root (dropping the page cache, network namespaces) and MinIO
(``make cluster-tools``). The last line is ``RESULT ...``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "hack"))
from _common import parser, result  # noqa: E402



def say(text: str) -> None:
    print(text, flush=True)


def io_steal(folder: Path, size: int, seconds: float) -> float:
    """Seconds of training-like compute (matmuls on every core) lost while dd writes
    ``size`` bytes with direct I/O: what the machine itself charges for the bytes."""
    import subprocess  # noqa: PLC0415

    import torch  # noqa: PLC0415

    a, b = torch.randn(768, 3072), torch.randn(3072, 768)

    def rate(duration: float) -> float:
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < duration:
            a @ b
            count += 1
        return count / (time.perf_counter() - began)

    idle = statistics.median([rate(2.0) for _ in range(2)])
    path = folder / "steal.bin"
    writer = threading.Thread(target=lambda: subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", f"bs={32 << 20}", f"count={max(1, size >> 25)}", "oflag=direct", "conv=fsync"],
        check=True, capture_output=True))
    writer.start()
    busy = rate(seconds)
    writer.join()
    path.unlink(missing_ok=True)
    return (1 - busy / idle) * seconds


def main() -> None:
    # Quiet trainer logs for the benchmark's own runs: set here, not at import, since a
    # test that imports this module must not change its session's environment (it once
    # silenced every later trainer run's log in the suite).
    os.environ.setdefault("LLMTRAIN_LOG_LEVEL", "ERROR")
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--preset", default=None, help="model preset (default gpt2-124m, quick: small)")
    p.add_argument("--pairs", type=int, default=None, help="stall pairs per row (default 6, quick 2)")
    p.add_argument("--window", type=int, default=None, help="steps per window (default 5, quick 3)")
    p.add_argument("--dir", default="/var/tmp", help="a folder on the disk under test (not tmpfs)")
    p.add_argument("--plot", default=None, help="write the sweep's PNG here")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--incremental-only", action="store_true", help="only the incremental rows (no root needed)")
    p.add_argument("--cold-restores", action="store_true",
                   help="the incremental rows' restores from a dropped page cache (root: /proc/sys/vm/drop_caches)")
    args = p.parse_args()
    if args.cold_restores and os.geteuid() != 0:
        raise SystemExit("--cold-restores needs root: it drops the page cache before each restore")
    if args.incremental_only:
        folder = Path(tempfile.mkdtemp(prefix="llmtrain-bench-delta-", dir=args.dir))
        try:
            values, rows = incremental_rows(folder, args.quick, args.cold_restores)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        say("JSON " + json.dumps({"incremental": rows}, default=str))
        result(**values)
        return
    if os.geteuid() != 0:
        raise SystemExit("bench/checkpoint.py needs root: it drops the page cache and creates network namespaces")
    quick = args.quick
    preset = args.preset or ("small" if quick else "gpt2-124m")
    pairs = args.pairs or (2 if quick else 6)
    window = args.window or (3 if quick else 5)
    batch, seq = 4, 64

    import torch  # noqa: PLC0415

    torch.set_num_threads(os.cpu_count() or 2)
    from _ckpt_io import balanced_persist, persist_and_restore, s3_restore, upload  # noqa: PLC0415
    from _ckpt_train import DcpTrainer, OurTrainer, deferral, measure  # noqa: PLC0415
    from llmtrain_store.s3 import S3Tier  # noqa: PLC0415
    from s3server import MinioServer  # noqa: PLC0415

    disk = Path(tempfile.mkdtemp(prefix="llmtrain-bench-ckpt-", dir=args.dir))
    ram = Path(tempfile.mkdtemp(prefix="llmtrain-bench-ckpt-", dir="/dev/shm"))
    out: dict[str, object] = {"preset": preset, "batch": batch, "seq": seq, "pairs": pairs, "window": window}
    try:
        # -------------------------------------------------------------- our trainer, tier 1 on disk
        say(f"[1/7] our trainer, {preset}, tier 1 on disk ({disk})")
        ours = OurTrainer(preset, batch, seq, disk / "tier1", disk / "run")
        state = ours.state_bytes()
        say(f"  state {state / 1e9:.2f} GB (parameters and AdamW moments, fp32)")
        stall_disk = measure(ours, pairs, window, log=say)
        say(f"  stall mean {stall_disk.mean:.3f}s median {stall_disk.median:.3f}s worst {stall_disk.worst:.3f}s "
            f"(step {stall_disk.step_seconds:.2f}s)")
        say("  a checkpoint due before the previous one is written (deferral):")
        deferred = deferral(ours, 2 * window, log=say)
        say("[2/7] tier-1 persist and restore against the disk's own bandwidth (dd, direct I/O), round by round")
        bw = persist_and_restore(ours, disk, 3 if quick else 5)
        ours.close()
        persisted, persist_bps, dd_write, restore_bps, dd_read = bw["bytes"], bw["persist"], bw["dd_write"], bw["restore"], bw["dd_read"]
        say(f"  dd write {dd_write / 1e6:.0f} MB/s, tier-1 persist {persist_bps / 1e6:.0f} MB/s; "
            f"dd read {dd_read / 1e6:.0f} MB/s, tier-1 restore {restore_bps / 1e6:.0f} MB/s (medians)")
        steal = io_steal(disk, persisted, seconds=max(6.0, persisted / dd_write * 1.5))
        say(f"  training time lost while dd alone writes {persisted / 1e9:.2f} GB: {steal:.2f}s (the machine's I/O cost)")

        # -------------------------------------------------------------- the peer and the RAM tier
        say("[3/7] torch.distributed.checkpoint.async_save of the same state (peer)")
        dcp = DcpTrainer(preset, batch, seq, disk / "dcp")
        stall_dcp = measure(dcp, pairs, window, log=say)
        sync = statistics.median([dcp.sync_save(disk / "sync.pt") for _ in range(3)])
        say(f"  DCP stall mean {stall_dcp.mean:.3f}s; synchronous torch.save + fsync {sync:.2f}s")
        del dcp

        say("[4/7] our trainer, tier 1 in RAM (/dev/shm): the stall without the machine's disk I/O cost")
        ours_ram = OurTrainer(preset, batch, seq, ram / "tier1", ram / "run")
        stall_ram = measure(ours_ram, pairs, window, log=say)
        ours_ram.close()
        shutil.rmtree(ram, ignore_errors=True)
        say(f"  stall mean {stall_ram.mean:.3f}s median {stall_ram.median:.3f}s worst {stall_ram.worst:.3f}s")

        say("[4b/7] DeepSpeed ZeRO-1, the same state: its save captured and copied in the background")
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        ours_ds = OurTrainer(preset, batch, seq, disk / "tier1-ds", disk / "run-ds", {"kind": "deepspeed", "zeroStage": 1})
        stall_ds = measure(ours_ds, max(2, pairs // 2), window, log=say)
        ours_ds.close()
        del ours_ds
        shutil.rmtree(disk / "tier1-ds", ignore_errors=True)
        say(f"  DeepSpeed stall mean {stall_ds.mean:.3f}s median {stall_ds.median:.3f}s worst {stall_ds.worst:.3f}s")

        # -------------------------------------------------------------- S3
        say("[5/7] S3 restore: parallel ranged GETs against one stream (MinIO on this machine)")
        rate = 40e6
        with MinioServer(disk / "s3", host="0.0.0.0") as server:
            server.make_bucket("bench")
            os.environ.update(server.env())
            upload(S3Tier("s3", "s3://bench/restore", endpoint=server.endpoint), disk / "tier1", nodes=2)
            paced_parallel, paced_single = s3_restore(server, disk / "tier1", disk, rate)
            loop_parallel, loop_single = s3_restore(server, disk / "tier1", disk, None)
            say(f"  paced {rate / 1e6:.0f} MB/s per connection: parallel {paced_parallel:.2f}s, one stream {paced_single:.2f}s; "
                f"loopback unpaced: parallel {loop_parallel:.2f}s, one stream {loop_single:.2f}s")

            say("[6/7] balanced persist of the replicated state: 1 node against 2, each behind its own link")
            link = 400
            one = balanced_persist(server, disk / "tier1", 1, link, "balanced-1")
            two = balanced_persist(server, disk / "tier1", 2, link, "balanced-2")
            say(f"  {link} Mbit/s per node: 1 node {one:.2f}s, 2 nodes {two:.2f}s")

        # -------------------------------------------------------------- sweep
        sweep: list[dict[str, float]] = []
        if not args.no_sweep:
            say("[7/7] sweep: stall over step times (batch sizes) and state sizes (presets)")
            points = [(preset, b) for b in ((2, 8) if quick else (1, 2, 8))] + \
                     [(p, batch) for p in (("tiny",) if quick else ("tiny", "small")) if p != preset]
            for point_preset, point_batch in points:
                folder = Path(tempfile.mkdtemp(prefix="sweep-", dir=disk))
                subject = OurTrainer(point_preset, point_batch, seq, folder / "tier1", folder / "run")
                stall = measure(subject, max(2, pairs // 2), window, log=say)
                subject.close()
                peer = DcpTrainer(point_preset, point_batch, seq, folder / "dcp")
                point_sync = statistics.median([peer.sync_save(folder / "sync.pt") for _ in range(2)])
                del peer
                sweep.append({"preset": point_preset, "batch": point_batch, "step_seconds": stall.step_seconds,
                              "state_bytes": stall.state_bytes, "stall": stall.mean, "sync": point_sync})
                say(f"  {point_preset} batch {point_batch}: step {stall.step_seconds:.2f}s, state {stall.state_bytes / 1e9:.2f} GB, "
                    f"stall {stall.mean:.3f}s, sync save {point_sync:.2f}s")
                shutil.rmtree(folder, ignore_errors=True)
        sweep.append({"preset": preset, "batch": batch, "step_seconds": stall_disk.step_seconds, "state_bytes": state,
                      "stall": stall_disk.mean, "sync": sync})
        say("[8/8] incremental checkpoints into the shared tier and S3: full, 90 % frozen, LoRA; by content against whole")
        delta_values, delta_rows = incremental_rows(disk / "delta", quick, args.cold_restores)
    finally:
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)

    floor = 0.01  # a stall below 10 ms is reported as 10 ms: the ratio stays finite
    values = {
        "stall_reduction": sync / max(stall_disk.mean, floor),
        "stall_vs_dcp": stall_disk.mean / max(stall_dcp.mean, floor),
        "persist_bw_ratio": persist_bps / dd_write,
        "restore_bw_ratio": restore_bps / dd_read,
        "s3_restore_speedup": paced_single / paced_parallel,
        "balanced_persist_speedup": one / two,
    }
    out.update({
        "state_bytes": state, "sync_save_seconds": sync, "io_steal_seconds": steal,
        "stall_disk": vars(stall_disk), "stall_ram": vars(stall_ram), "stall_dcp": vars(stall_dcp), "stall_deepspeed": vars(stall_ds),
        "stall_reduction_ram_tier": sync / max(stall_ram.mean, floor),
        "dd_write_bps": dd_write, "dd_read_bps": dd_read, "persist_bps": persist_bps, "restore_bps": restore_bps,
        "s3": {"paced_rate": rate, "paced_parallel": paced_parallel, "paced_single": paced_single,
               "loopback_parallel": loop_parallel, "loopback_single": loop_single},
        "balanced": {"link_mbit": link, "one_node": one, "two_nodes": two}, "deferral": deferred, "sweep": sweep, **values,
        "incremental": delta_rows,
    })
    say("JSON " + json.dumps(out, default=str))
    if args.plot:
        plot(sweep, Path(args.plot), preset)
        say(f"plot: {args.plot}")
    result(**{k: round(v, 3) for k, v in values.items()}, stall_s=round(stall_disk.mean, 3),
           stall_ram_tier_s=round(stall_ram.mean, 3), io_steal_s=round(steal, 3), sync_save_s=round(sync, 2),
           dcp_stall_s=round(stall_dcp.mean, 3), deepspeed_stall_s=round(stall_ds.mean, 3),
           s3_restore_speedup_loopback=round(loop_single / loop_parallel, 2), **delta_values)


def incremental_rows(folder: Path, quick: bool, cold: bool = False) -> tuple[dict[str, float], list[dict[str, object]]]:
    """The incremental section (``_ckpt_delta.py``): its RESULT values and its rows."""
    from _ckpt_delta import MODES, incremental  # noqa: PLC0415
    from s3server import MinioServer  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    with MinioServer(folder / "s3") as server:
        server.make_bucket("bench")
        os.environ.update(server.env())
        deltas = incremental(folder / "runs", server, "small" if quick else "gpt2-124m", 3 if quick else 4, 2, say, cold)
    rows = [d.row() for d in deltas]
    by = {(r["mode"], r["store"]): r for r in rows}
    values: dict[str, float] = {}
    for mode in MODES:
        pieces, whole = by[(mode, "pieces")], by[(mode, "whole")]
        say(f"  {mode:<9} by content: S3 +{pieces['s3_later_bytes_median'] / 1e6:.1f} MB per checkpoint "
            f"({pieces['s3_later_fraction']:.1%} of its state, {pieces['s3_later_fraction_of_full']:.1%} of full training's) "
            f"in {pieces['s3_seconds_median']:.2f}s; whole: +{whole['s3_later_bytes_median'] / 1e6:.1f} MB "
            f"in {whole['s3_seconds_median']:.2f}s; restore from S3 {pieces['s3_restore_seconds']:.2f}s against "
            f"{whole['s3_restore_seconds']:.2f}s, from the shared tier {pieces['shared_restore_seconds']:.2f}s against "
            f"{whole['shared_restore_seconds']:.2f}s")
        say(f"  {mode:<9} tier 1 (whole files) +{pieces['local_later_bytes_median'] / 1e6:.1f} MB in "
            f"{pieces['local_seconds_median']:.2f}s; the same step by content into a folder on its disk (the shared tier) "
            f"+{pieces['shared_later_bytes_median'] / 1e6:.1f} MB in {pieces['shared_after_local_seconds_median']:.2f}s more, "
            f"whole there +{whole['shared_later_bytes_median'] / 1e6:.1f} MB in {whole['shared_after_local_seconds_median']:.2f}s more")
        values[f"{mode}_local_seconds"] = round(pieces["local_seconds_median"], 2)
        values[f"{mode}_shared_by_content_after_local_seconds"] = round(pieces["shared_after_local_seconds_median"], 2)
        values[f"{mode}_s3_later_fraction"] = round(pieces["s3_later_fraction"], 3)
        values[f"{mode}_shared_later_fraction"] = round(pieces["shared_later_fraction"], 3)
        values[f"{mode}_bytes_whole_over_pieces"] = round(whole["s3_later_bytes_median"] / max(1, pieces["s3_later_bytes_median"]), 2)
        values[f"{mode}_s3_restore_pieces_over_whole"] = round(pieces["s3_restore_seconds"] / whole["s3_restore_seconds"], 2)
        values[f"{mode}_shared_restore_pieces_over_whole"] = round(pieces["shared_restore_seconds"] / whole["shared_restore_seconds"], 2)
    return values, rows


def plot(sweep: list[dict[str, float]], path: Path, preset: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    by_time = sorted((p for p in sweep if p["preset"] == preset), key=lambda p: p["step_seconds"])
    left.plot([p["step_seconds"] for p in by_time], [p["stall"] for p in by_time], "o-", label="stall (ours, tier 1 on disk)")
    left.plot([p["step_seconds"] for p in by_time], [p["sync"] for p in by_time], "s--", label="synchronous save + fsync")
    left.set_xlabel("step time (s)")
    left.set_ylabel("training time lost per checkpoint (s)")
    left.set_title(f"{preset}: over step time (batch size)")
    left.legend()
    by_size = sorted({p["preset"]: p for p in sweep if p["batch"] == 4}.values(), key=lambda p: p["state_bytes"])
    right.plot([p["state_bytes"] / 1e9 for p in by_size], [p["stall"] for p in by_size], "o-", label="stall (ours)")
    right.plot([p["state_bytes"] / 1e9 for p in by_size], [p["sync"] for p in by_size], "s--", label="synchronous save + fsync")
    right.set_xlabel("state size (GB)")
    right.set_title("over state size (presets, batch 4)")
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
