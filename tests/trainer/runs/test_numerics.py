"""Bad numerics, with real torchrun ranks: a parameter turned NaN on one rank poisons
every rank's gradients and weights; the job rolls back to its newest checkpoint, skips
exactly the samples trained on since then, records the skip, and finishes; past the
rollback budget it fails with its own permanent code."""

from __future__ import annotations

import json

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
    # Rolled back to step 10 (the newest checkpoint before step 13): steps 11..13 trained
    # on samples 80..103, which are skipped; step 11 now reads samples 104..111.
    manifest = json.loads((tmp_path / "node0" / "ckpt" / "step-00000030" / "manifest.json").read_text())
    data = manifest["data"]
    assert data["rollbacks"] == 1 and data["offset"] == 3
    (skip,) = data["skips"]
    assert (skip["firstStep"], skip["lastStep"], skip["firstSample"], skip["endSample"]) == (11, 13, 80, 104)
    assert "nan" in skip["reason"].lower()
    # Every sample of the stream up to the last one trained on is either trained on exactly
    # once in the kept trajectory, or in the recorded skip: none repeated, none lost.
    trained = sorted(i for r in final.values() for i in range(*r["data_samples"]))
    skipped = list(range(skip["firstSample"], skip["endSample"]))
    assert len(trained) == len(set(trained)) == 30 * GBS
    assert sorted(trained + skipped) == list(range((30 + 3) * GBS))
    logs = job.logs()
    assert "rolled back to step 10 and skipped samples 80..103" in logs, logs


def test_past_the_rollback_budget_the_job_fails_with_bad_numerics(tmp_path):
    ft = {**NUMERICS, "numerics": {**NUMERICS["numerics"], "maxRollbacks": 0}}
    cfg = base_config(maxSteps=30, globalBatchSize=GBS, checkpoint={"intervalSteps": 5}, faultTolerance=ft)
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=2, env={"LLMTRAIN_FAULT_INJECT": "nan@step=8,rank=0"})
    assert codes == [ExitCode.BAD_NUMERICS], job.logs()
    termination = job.termination(0)
    assert termination["reason"] == "BadNumerics" and "step 8" in termination["message"] and "maxRollbacks=0" in termination["message"]
