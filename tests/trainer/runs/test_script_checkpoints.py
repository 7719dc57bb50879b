"""A user's script with the checkpoint API under the real launcher and torchrun: two ranks
save a DDP-style state into node-local and shared tiers, a rank dies mid-run, torchrun
restarts the group in place, and the job resumes from the newest committed step and ends
with exactly the weights of a run that never failed. Then the node-local tier is lost
(a replacement node) and a third run restores from the shared tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from llmtrain_contract.command import script_program, worker_command
from llmtrain_contract.names import Env
from support.elastic import free_port

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
