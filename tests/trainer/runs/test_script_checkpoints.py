"""A user's script with the checkpoint API under the real launcher and torchrun: two ranks
save a DDP-style state into node-local and shared tiers, a rank dies mid-run, torchrun
restarts the group in place, and the job resumes from the newest committed step and ends
with exactly the weights of a run that never failed. Then the node-local tier is lost
(a replacement node) and a third run restores from the shared tier."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from llmtrain_contract.command import script_program, worker_command
from llmtrain_contract.names import Env
from support.elastic import ElasticJob, free_port

pytestmark = pytest.mark.slow  # real torchrun runs

SCRIPT = """
import datetime, json, os, sys
import torch, torch.distributed as dist
from llmtrain_trainer import checkpoints

STEPS = int(sys.argv[1])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
weights = torch.zeros(16)
store = checkpoints.open()
step, state = store.restore()
if state is not None:
    weights = state["weights"]
print(f"rank {rank} attempt {attempt} resumed from {step}", flush=True)
for step in range(step + 1, STEPS + 1):
    grad = torch.arange(16, dtype=torch.float32) * (rank + 1) * step / 100  # a deterministic gradient per rank and step
    dist.all_reduce(grad)
    weights -= 0.01 * grad / dist.get_world_size()
    if step % 4 == 0:
        store.save(step, {"weights": weights, "step": step})
    if step == 7 and attempt == 0 and os.environ.get("CRASH"):
        store.wait()  # rank 0 commits the node's step 4: the crash then loses steps 5-7
        dist.barrier()
        if rank == 1:
            os._exit(9)
store.save(STEPS, {"weights": weights, "step": STEPS}, sync=True)
store.close()
if rank == 0:
    with open(os.environ["OUT"], "w") as f:
        json.dump({"weights": weights.tolist(), "attempt": attempt}, f)
"""


def expected(steps: int, world: int = 2) -> list[float]:
    weights = torch.zeros(16)
    for step in range(1, steps + 1):
        grad = sum(torch.arange(16, dtype=torch.float32) * (rank + 1) * step / 100 for rank in range(world))
        weights -= 0.01 * grad / world
    return weights.tolist()


def run(tmp_path, name: str, steps: int, crash: bool) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    tiers = [{"name": "local", "uri": str(tmp_path / "local"), "keep": 2},
             {"name": "shared", "uri": str(tmp_path / "shared"), "keep": 3, "intervalSteps": 4}]
    run_dir, out = tmp_path / f"run-{name}", tmp_path / f"{name}.json"
    env = {**os.environ, Env.RUN_DIR: str(run_dir), Env.CHECKPOINT_TIERS: json.dumps(tiers), "OUT": str(out),
           Env.JOB: "scripted", Env.JOB_UID: "uid-1", **({"CRASH": "1"} if crash else {})}
    torchrun = ["--standalone", "--nproc-per-node=2", "--max-restarts=2", "--monitor-interval=1"]
    command = worker_command(sys.executable, str(run_dir), torchrun, script_program([str(script), str(steps)]),
                             str(tmp_path / f"term-{name}"))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    return done, (json.loads(out.read_text()) if out.exists() else {})


def test_a_crash_resumes_from_the_newest_committed_step_and_a_new_disk_from_the_shared_tier(tmp_path):
    done, result = run(tmp_path, "first", 12, crash=True)
    logs = done.stdout + done.stderr
    assert done.returncode == 0, logs[-4000:]
    assert "rank 0 attempt 1 resumed from 4" in logs and "rank 1 attempt 1 resumed from 4" in logs, logs[-4000:]
    assert result["attempt"] == 1 and result["weights"] == pytest.approx(expected(12), abs=1e-6)
    # A replacement node: tier 1 gone. The shared tier (every 4th step) holds step 12.
    for path in sorted((tmp_path / "local").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    done, result = run(tmp_path, "second", 16, crash=False)
    logs = done.stdout + done.stderr
    assert done.returncode == 0, logs[-4000:]
    assert "rank 0 attempt 0 resumed from 12" in logs and "rank 1 attempt 0 resumed from 12" in logs, logs[-4000:]
    assert result["weights"] == pytest.approx(expected(16), abs=1e-6)


def _broadcast(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from llmtrain_trainer import checkpoints

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    checkpoints.BROADCAST_CHUNK = 1000  # several pieces and a short last one
    data = bytes(range(256)) * 15 + b"end" if rank == 1 else None
    got = checkpoints.broadcast_bytes(data, src=1)
    with open(f"{out}-{rank}", "wb") as f:
        f.write(got)
    dist.destroy_process_group()


def test_a_broadcast_restore_sends_the_sources_bytes_in_pieces(tmp_path):
    """The path of a rank whose node holds no copy (the other ranks' get it from the source)."""
    import torch.multiprocessing as mp

    mp.spawn(_broadcast, args=(free_port(), str(tmp_path / "got")), nprocs=2, join=True)
    expected_bytes = bytes(range(256)) * 15 + b"end"
    assert (tmp_path / "got-0").read_bytes() == expected_bytes == (tmp_path / "got-1").read_bytes()


SHARDED = """
import datetime, json, logging, os, sys
import torch, torch.distributed as dist
from llmtrain_trainer import checkpoints

logging.basicConfig(level=logging.INFO)  # the store's lines (a pull from S3) in the node's log

STEPS, CRASH = int(sys.argv[1]), os.environ.get("CRASH_MARK")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
shard = torch.zeros(8)  # this rank's own part: it depends on the rank, as a ZeRO shard does
store = checkpoints.open(sharded=True)
step, state = store.restore()
if state is not None:
    assert state["rank"] == rank, f"rank {rank} was given rank {state['rank']}'s part"
    shard = state["shard"]
print(f"rank {rank} resumed from {step}", flush=True)
for step in range(step + 1, STEPS + 1):
    own = torch.arange(8, dtype=torch.float32) * (rank + 1) * step / 100
    total = own.clone()
    dist.all_reduce(total)
    shard -= 0.01 * (own + total / world)
    if step % 4 == 0:
        store.save(step, {"shard": shard, "rank": rank, "step": step})
    if step == 7 and CRASH and not os.path.exists(CRASH):
        store.wait()  # each rank's step 4 is in its node's tier 1: the crash loses steps 5-7
        dist.barrier()
        if rank == 1:
            open(CRASH, "w").close()
            os._exit(9)
store.save(STEPS, {"shard": shard, "rank": rank, "step": STEPS}, sync=True)
store.close()
with open(os.environ["OUT"] + f"-{rank}.json", "w") as f:
    json.dump(shard.tolist(), f)
"""


def sharded_expected(steps: int, rank: int, world: int = 2) -> list[float]:
    shard = torch.zeros(8)
    for step in range(1, steps + 1):
        total = sum(torch.arange(8, dtype=torch.float32) * (r + 1) * step / 100 for r in range(world))
        shard -= 0.01 * (torch.arange(8, dtype=torch.float32) * (rank + 1) * step / 100 + total / world)
    return shard.tolist()


def _sharded_job(tmp_path, name: str, steps: int, nodes: int, minio, crash: bool = False, restarts: int = 2):
    script = tmp_path / "sharded.py"
    script.write_text(textwrap.dedent(SHARDED))
    s3 = {"name": "s3", "uri": "s3://ckpt/sharded-script", "keep": 3, "intervalSteps": 4}
    tiers = {i: [{"name": "local", "uri": str(tmp_path / f"node{i}" / "ckpt"), "keep": 2}, s3] for i in range(nodes)}
    env = {**minio.env(), Env.JOB: "sharded", Env.JOB_UID: "uid-2", "OUT": str(tmp_path / name),
           "LLMTRAIN_PREFETCH": "0",  # the rank's own pull, not the launcher's ahead of it (test_prefetch_restore.py)
           **({"CRASH_MARK": str(tmp_path / "crashed")} if crash else {})}
    job = ElasticJob(tmp_path, {}, nodes=nodes, max_restarts=restarts, env=env, program=script_program([str(script), str(steps)]),
                     node_env={i: {Env.CHECKPOINT_TIERS: json.dumps(t)} for i, t in tiers.items()}).start()
    codes = job.wait(timeout=240)
    shards = {r: json.loads(p.read_text()) for r in range(nodes) if (p := tmp_path / f"{name}-{r}.json").exists()}
    return job, codes, shards


def _node_rank(job: ElasticJob, index: int) -> int:
    return int(re.findall(r"rank (\d) resumed from", job.running[index].output())[-1])


def _first_resume(job: ElasticJob, index: int) -> int | None:
    """The first step node ``index``'s rank resumed from other than a fresh start: counted
    per node, not over the logs, so that a later regrouping (another start, after more
    steps) neither hides nor doubles it."""
    return next((int(s) for s in re.findall(r"resumed from (\d+)", job.running[index].output()) if s != "0"), None)


@pytest.mark.tools  # MinIO (the minio fixture)
def test_a_sharded_state_on_two_nodes_resumes_after_a_crash_from_s3_when_ranks_lose_or_swap_their_disks(tmp_path, minio):
    """Each rank's own part on two nodes (launcher, torchrun, our rendezvous store), the
    slower tier S3 from the script: a crash resumes every rank from step 4; a node whose
    disk holds another rank's part (the rendezvous may give nodes other ranks when they
    join again) and then two wiped disks: each rank pulls its own part of the newest step from
    S3, never another rank's; at another world size the restore says it needs resharding."""
    job, codes, shards = _sharded_job(tmp_path, "first", 12, 2, minio, crash=True)
    logs = job.logs()
    assert codes == [0, 0], logs[-6000:]
    assert (tmp_path / "crashed").exists(), "rank 1 should have crashed at step 7"
    assert [_first_resume(job, i) for i in (0, 1)] == [4, 4], "both ranks should resume from step 4 after the crash:\n" + logs[-6000:]
    assert shards == {r: pytest.approx(sharded_expected(12, r), abs=1e-6) for r in (0, 1)}
    committed = sorted(k for k in minio.keys("ckpt", "sharded-script/") if k.endswith("/COMMITTED"))
    assert committed and committed[-1].endswith("step-00000012/COMMITTED"), committed

    # Both nodes' disks hold the same rank's part of step 12 (node 0's copied over node
    # 1's): whichever ranks the rendezvous gives the nodes this time (it may swap them: it
    # did here between runs), exactly one node lacks its rank's part and pulls it from S3.
    a, b = tmp_path / "node0" / "ckpt", tmp_path / "node1" / "ckpt"
    held = [int(p.name[12:17]) for p in (a / "step-00000012").glob("script-rank-*.pt")]
    assert len(held) == 1, held
    shutil.rmtree(b)
    shutil.copytree(a, b)
    job, codes, shards = _sharded_job(tmp_path, "one-disk-twice", 16, 2, minio)
    logs = job.logs()
    assert codes == [0, 0], logs[-6000:]
    assert [_first_resume(job, i) for i in (0, 1)] == [12, 12], logs[-6000:]
    ranks = {i: _node_rank(job, i) for i in (0, 1)}
    pulled = [i for i in (0, 1) if "pulled step 12 from the s3 tier into tier 1" in job.running[i].output()]
    assert pulled == [i for i, r in ranks.items() if r != held[0]], (held, ranks, logs[-6000:])
    for node, rank in ranks.items():  # each node's tier 1 now holds its own rank's part of step 12
        assert (tmp_path / f"node{node}" / "ckpt" / "step-00000012" / f"script-rank-{rank:05d}.pt").exists()
    assert shards == {r: pytest.approx(sharded_expected(16, r), abs=1e-6) for r in (0, 1)}

    # Both disks lost (two replacement nodes): step 16 from S3.
    for folder in (a, b):
        shutil.rmtree(folder)
    job, codes, shards = _sharded_job(tmp_path, "wiped", 20, 2, minio)
    logs = job.logs()
    assert codes == [0, 0], logs[-6000:]
    assert [_first_resume(job, i) for i in (0, 1)] == [16, 16], logs[-6000:]
    assert all("pulled step 16 from the s3 tier" in job.running[i].output() for i in (0, 1)), logs[-6000:]
    assert shards == {r: pytest.approx(sharded_expected(20, r), abs=1e-6) for r in (0, 1)}

    # One node: each rank's file is its own part of a world of 2.
    shutil.rmtree(a)
    job, codes, shards = _sharded_job(tmp_path, "smaller", 24, 1, minio, restarts=0)
    logs = job.logs()
    assert codes != [0] and not shards, logs[-6000:]
    assert "ReshardNeeded" in logs and "saved at world size 2; this run has 1 ranks" in logs, logs[-6000:]
