"""A job re-created under its old name (same tiers) with another config and
``allowFreshStart``: it starts over, keeps its own new steps although its predecessor's
sort higher, leaves the predecessor's alone, and resumes from its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.elastic import base_config, run_job

pytestmark = pytest.mark.slow  # real torchrun runs

OLD = base_config(jobUid="uid-of-the-deleted-job", maxSteps=40, checkpoint={"intervalSteps": 10})
# At most 3 saves in 15 steps (a deferred save is only later, never an extra one), so the
# new run prunes none of its own and every step number it wrote is there to be read.
NEW = base_config(jobUid="uid-of-the-new-job", seed=7, maxSteps=15,
                  checkpoint={"intervalSteps": 5, "allowFreshStart": True})


def _owners(folder: Path) -> dict[int, str]:
    return {int(p.name[5:]): json.loads((p / "manifest.json").read_text())["owner"] for p in folder.glob("step-*")}


def _of(owners: dict[int, str], owner: str) -> set[int]:
    return {step for step, o in owners.items() if o == owner}


def test_a_recreated_job_that_starts_over_keeps_its_own_steps_and_its_predecessors(tmp_path):
    # Which steps are saved depends on the timing (a save still in flight defers the
    # next), so the checks are by owner: keep is 3 in tier 1 and in the shared tier.
    old_uid, new_uid = OLD["jobUid"], NEW["jobUid"]
    job, codes = run_job(tmp_path, OLD, shared_tier=True)
    assert codes == [0], job.logs()
    local, shared = tmp_path / "node0" / "ckpt", tmp_path / "shared"
    old_local, old_shared = _owners(local), _owners(shared)
    assert set(old_local.values()) == {old_uid} and len(old_local) == 3 and max(old_local) == 40, old_local
    assert old_shared and set(old_shared.values()) == {old_uid}, old_shared

    job, codes = run_job(tmp_path, NEW, shared_tier=True)
    assert codes == [0], job.logs()
    assert "starting from step 0 because checkpoint.allowFreshStart is set" in job.logs()
    owners = _owners(local)
    # Left alone but where the new run wrote a step of the same number: in make test at
    # 0de0e6d the predecessor had kept step 10 (timing), and the new run's step 10 replaced it.
    assert {s: o for s, o in owners.items() if o == old_uid} == {
        s: o for s, o in old_local.items() if s not in _of(owners, new_uid)}, "the predecessor's steps are left alone"
    assert 15 in _of(owners, new_uid) and max(_of(owners, new_uid)) == 15, (
        "the new run keeps its own steps although the predecessor's sort higher")
    in_shared = _owners(shared)
    assert {s: o for s, o in in_shared.items() if o == old_uid} == {
        s: o for s, o in old_shared.items() if s not in _of(in_shared, new_uid)}

    job, codes = run_job(tmp_path, dict(NEW, maxSteps=20), shared_tier=True)
    assert codes == [0], job.logs()
    assert "resumed from step 15 " in job.logs(), "it resumes from its own newest step, not the predecessor's"
    owners = _owners(local)
    mine = _of(owners, new_uid)
    assert max(mine) == 20 and len(mine) == 3, f"its keep of 3 counts its own steps only: {owners}"
    # A step number the new run reaches replaces the predecessor's step of that number.
    assert {s: o for s, o in owners.items() if o == old_uid} == {s: o for s, o in old_local.items() if s not in mine}
    manifest = json.loads((local / "step-00000020" / "manifest.json").read_text())
    assert manifest["lineage"] == [new_uid], "a fresh start adopts nobody's lineage"
