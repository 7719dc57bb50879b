"""Resume at another world size: same samples-consumed position, same global batch.

Each case runs the first part to step 12 at one world size, then resumes the same
checkpoints to step 18 at another. After the resume the first step is 13, it starts at
sample 12 x globalBatchSize, and accumulation x microBatch x world == globalBatch.
"""

from __future__ import annotations

import re

import pytest
from support.elastic import base_config, run_job

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

GLOBAL, MICRO = 8, 2

# name: (strategy, (nodes, procs) before, (nodes, procs) after, how it must load)
#   local:     every rank reads a verified copy from disk
#   broadcast: a new node has no copy; it receives the replicated DDP state from a peer
#   universal: ZeRO shards are re-partitioned through DeepSpeed's universal checkpoint
CASES = {
    "ddp-2to1": ("ddp", (2, 1), (1, 1), "local"),
    "ddp-1to2": ("ddp", (1, 1), (2, 1), "broadcast"),
    "ddp-4to2": ("ddp", (2, 2), (1, 2), "local"),
    "zero2-2to1": ({"kind": "deepspeed", "zeroStage": 2}, (1, 2), (1, 1), "universal"),
    "zero2-1to2": ({"kind": "deepspeed", "zeroStage": 2}, (1, 1), (1, 2), "universal"),
    "zero1-2to1": ({"kind": "deepspeed", "zeroStage": 1}, (1, 2), (1, 1), "universal"),
    "zero2-4to2": ({"kind": "deepspeed", "zeroStage": 2}, (1, 4), (1, 2), "universal"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_resume_at_another_world_size_keeps_position_and_global_batch(tmp_path, name):
    strategy, before, after, mode = CASES[name]
    strategy = {"kind": "ddp"} if strategy == "ddp" else strategy
    first = base_config(maxSteps=12, globalBatchSize=GLOBAL, microBatchSize=MICRO, strategy=strategy)
    job1, codes = run_job(tmp_path, first, nodes=before[0], procs_per_node=before[1])
    assert codes == [0] * before[0], job1.logs()
    end_of_first = job1.steps()[-1]
    assert end_of_first["step"] == 12 and end_of_first["world"] == before[0] * before[1]

    second = dict(first, maxSteps=18)
    job2, codes = run_job(tmp_path, second, nodes=after[0], procs_per_node=after[1])
    assert codes == [0] * after[0], job2.logs()
    resumed = [r for r in job2.steps() if r["time"] > end_of_first["time"]]
    world = after[0] * after[1]
    assert [r["step"] for r in resumed] == list(range(13, 19)), job2.logs()
    assert resumed[0]["samples"] == 13 * GLOBAL  # step 13 consumed samples [12*G, 13*G)
    for record in resumed:
        assert record["world"] == world
        assert record["accum"] * MICRO * world == GLOBAL
    # The model really came from the checkpoint: a fresh model would start near ln(256).
    assert resumed[0]["loss"] < end_of_first["loss"] + 0.5
    # Either node may host rank 0; the line names the tier the state came from either way.
    via = r" from rank \d" if mode == "broadcast" else ""
    saved = f"saved at world size {before[0] * before[1]}, now {world}"
    assert re.search(rf"resumed from step 12 \(local tier, {mode}{via}, {saved}\)", job2.logs()), job2.logs()
