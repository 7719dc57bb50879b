"""Bad numerics, with real torchrun ranks: a parameter turned NaN on one rank poisons
every rank's gradients and weights; the job rolls back to its newest checkpoint, skips
exactly the samples trained on since then, records the skip, and finishes; past the
rollback budget it fails with its own permanent code."""

from __future__ import annotations

import json
import re

import pytest
from llmtrain_contract.exitcodes import ExitCode
from support.elastic import base_config, run_job

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

GBS = 8
NUMERICS = {"hangTimeoutSeconds": 60, "collectiveTimeoutSeconds": 30,
            # Only non-finite losses here: the spike rule is unit-tested (tests/trainer/train/test_loss_guard.py).
            "numerics": {"spikeStdDevs": 0, "windowSteps": 5, "maxRollbacks": 2}}


def final_trajectory(steps: list[dict]) -> dict[int, dict]:
    """The last record of each step: a step redone after a rollback replaces the first."""
    out: dict[int, dict] = {}
    for record in steps:  # in time order
        out[record["step"]] = record
    return out


def test_a_nan_rolls_back_skips_exactly_the_recorded_samples_and_finishes(tmp_path):
    cfg = base_config(maxSteps=30, globalBatchSize=GBS, checkpoint={"intervalSteps": 5}, faultTolerance=NUMERICS)
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=2, env={"LLMTRAIN_FAULT_INJECT": "nan@step=13,rank=1"})
    assert codes == [0], job.logs()
    final = final_trajectory(job.steps())
    assert sorted(final) == list(range(1, 31))
    assert all(r["loss"] == r["loss"] for r in final.values()), "no NaN loss in the trajectory the model kept"
    # Rolled back to the newest checkpoint before step 13: step 10 (a save due at 10 is
    # deferred to 11 or 12 when the previous one is still being written on a loaded
    # machine, so the trainer's log says which). Steps R+1..13 trained on samples
    # R*GBS..13*GBS, which are skipped; step R+1 then reads the samples after them.
    found = re.search(r"rolled back to step (\d+) and skipped samples (\d+)\.\.(\d+)", job.logs())
    assert found, job.logs()
    back = int(found.group(1))
    assert 5 <= back <= 12 and (int(found.group(2)), int(found.group(3))) == (back * GBS, 13 * GBS - 1), found.group(0)
    manifest = json.loads((tmp_path / "node0" / "ckpt" / "step-00000030" / "manifest.json").read_text())
    data = manifest["data"]
    assert data["rollbacks"] == 1 and data["offset"] == 13 - back
    (skip,) = data["skips"]
    assert (skip["firstStep"], skip["lastStep"], skip["firstSample"], skip["endSample"]) == (back + 1, 13, back * GBS, 13 * GBS)
    assert "nan" in skip["reason"].lower()
    # Every sample of the stream up to the last one trained on is either trained on exactly
    # once in the kept trajectory, or in the recorded skip: none repeated, none lost.
    trained = sorted(i for r in final.values() for i in range(*r["data_samples"]))
    skipped = list(range(skip["firstSample"], skip["endSample"]))
    assert len(trained) == len(set(trained)) == 30 * GBS
    assert sorted(trained + skipped) == list(range((30 + 13 - back) * GBS))


def test_past_the_rollback_budget_the_job_fails_with_bad_numerics(tmp_path):
    ft = {**NUMERICS, "numerics": {**NUMERICS["numerics"], "maxRollbacks": 0}}
    cfg = base_config(maxSteps=30, globalBatchSize=GBS, checkpoint={"intervalSteps": 5}, faultTolerance=ft)
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=2, env={"LLMTRAIN_FAULT_INJECT": "nan@step=8,rank=0"})
    assert codes == [ExitCode.BAD_NUMERICS], job.logs()
    termination = job.termination(0)
    assert termination["reason"] == "BadNumerics" and "step 8" in termination["message"] and "maxRollbacks=0" in termination["message"]
    # The last good step, not the bad one: its loss is what the status keeps.
    good = {r["step"]: r["loss"] for r in job.steps()}
    assert termination["lastStep"] == {"step": 7, "loss": good[7]}, termination
