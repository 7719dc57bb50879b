"""A tier shared by two runs (a job re-created under the same name, two jobs given one
subPath or prefix): clean-up touches only the steps of the writing run's lineage, and
two writers of one step number never fill one staging folder."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple

import pytest
from llmtrain_store import manifest as mf
from llmtrain_store.directory import DirTier
from llmtrain_store.owner import LINEAGE_MAX, Scope, adopted, lineage_of, owner_of, token
from llmtrain_store.s3 import S3Tier
from llmtrain_store.tier import CheckpointError

from store.helpers import META, save_dir, save_shared, write_file

OLD, NEW = "uid-old-job", "uid-new-job"


def _save(tier, step: int, owner: str | None, lineage: list[str] | None = None):
    """A committed step written by ``owner`` (None: by a version that recorded none)."""
    tier.scope = Scope.of(owner, lineage or []) if owner else None
    meta = {} if owner is None else {"owner": owner, "lineage": adopted(owner, lineage or [])}
    staging = tier.staging(step)
    records = {"state.llmt": write_file(staging, "state.llmt", os.urandom(100))}
    tier.write_part(step, 0, {"files": records})
    return tier.commit(step, {**META, **meta, "samples_consumed": step * 8}, {0}, {0}, timeout=5)


def _steps(tier) -> dict[int, str | None]:
    return {c.step: owner_of(c.manifest) for c in tier.list()}


def test_a_lineage_read_from_a_manifest_is_owners_only_its_owner_last_and_bounded():
    assert lineage_of({"owner": "b", "lineage": ["a", "b"]}) == ["a", "b"]
    assert lineage_of({"owner": "b", "lineage": ["b", "a"]}) == ["a", "b"], "its owner is always last"
    assert lineage_of({"owner": "b"}) == ["b"]
    assert lineage_of({"lineage": ["a"]}) == [], "no owner: written before owners were recorded"
    for forged in ({"x": 1}, "a" * 500, 7, None, ["a", 3, {"b": 1}]):
        assert lineage_of({"owner": "b", "lineage": forged}) in (["b"], ["a", "b"]), forged
    for bad_owner in (3, "", "x" * 129, ["a"], None):
        assert owner_of({"owner": bad_owner}) is None
    many = [f"owner-{i}" for i in range(100)]
    kept = lineage_of({"owner": "last", "lineage": many})
    assert len(kept) == LINEAGE_MAX and kept[-1] == "last" and kept[-2] == "owner-99", "the newest owners are kept"


def test_an_owner_token_is_short_hex_so_staging_names_split_back():
    for owner in ("3f2c-uid", "a.b.c", "../../etc", "x" * 128):
        key = token(owner)
        assert len(key) == 12 and all(c in "0123456789abcdef" for c in key)
        assert mf.staged(mf.staging_dir(120, key)) == (120, key)
    assert mf.staged(mf.staging_dir(7)) == (7, None)
    for other in (".staging-x", ".staging-00000001.a/b", "step-00000001", ".staging-00000001.a-b"):
        assert mf.staged(other) is None


def test_a_run_that_started_over_keeps_its_own_steps_beside_higher_ones_of_its_predecessor(tmp_path):
    tier = DirTier("shared", tmp_path, keep=2)
    for step in (300, 400, 500):
        _save(tier, step, OLD)
    for step in (10, 20, 30):
        _save(tier, step, NEW)
    assert tier.retain() == [10], "only the new run's own steps count against its keep"
    assert _steps(tier) == {20: NEW, 30: NEW, 300: OLD, 400: OLD, 500: OLD}
    # Without a scope (a human pruning by hand) every step counts, as before.
    tier.scope = None
    assert tier.retain() == [20, 30, 300]


def test_a_run_that_resumed_from_its_predecessor_prunes_the_steps_of_its_lineage(tmp_path):
    tier = DirTier("local", tmp_path, keep=2)
    for step in (10, 20):
        _save(tier, step, OLD)
    _save(tier, 30, NEW, lineage=[OLD])
    assert tier.retain() == [10]
    assert _steps(tier) == {20: OLD, 30: NEW}
    assert lineage_of(tier.list()[0].manifest) == [OLD, NEW]


def test_steps_that_record_no_owner_are_pruned_as_before(tmp_path):
    tier = DirTier("local", tmp_path, keep=1)
    _save(tier, 10, None)
    _save(tier, 20, NEW)
    assert tier.retain() == [10]


def test_room_is_never_made_by_deleting_another_runs_step(tmp_path, monkeypatch):
    tier = DirTier("local", tmp_path, keep=5)
    for step in (100, 200):
        _save(tier, step, OLD)
    for step in (1, 2, 3):
        _save(tier, step, NEW)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(100, 100, 0))  # never enough room
    assert tier.make_room(10) == [1, 2], "its own older steps go; its newest and the other run's stay"
    assert _steps(tier) == {3: NEW, 100: OLD, 200: OLD}


def test_two_writers_of_one_step_number_stage_apart_and_a_sweep_leaves_the_other_ones(tmp_path):
    old, new = DirTier("shared", tmp_path, keep=2, scope=Scope.of(OLD)), DirTier("shared", tmp_path, keep=2, scope=Scope.of(NEW))
    old_staging, new_staging = old.staging(40), new.staging(40)
    assert old_staging != new_staging
    old.write_part(40, 0, {"files": {"state.llmt": write_file(old_staging, "state.llmt", b"old")}})
    new.write_part(40, 1, {"files": {}})  # a part of the other run: must not complete this one
    with pytest.raises(CheckpointError, match=r"missing parts of writers \[0\]"):
        new.commit(40, {**META, "owner": NEW}, {0, 1}, {0, 1}, timeout=0.3)
    new.sweep_staging()
    assert old_staging.is_dir() and not new_staging.exists(), "a sweep takes this run's leftovers only"
    committed = old.commit(40, {**META, "owner": OLD}, {0}, {0}, timeout=5)
    assert committed.manifest["files"].keys() == {"state.llmt"}


def test_retention_sweeps_only_its_own_stale_staging(tmp_path):
    tier = DirTier("local", tmp_path, keep=2, scope=Scope.of(NEW))
    foreign = tmp_path / mf.staging_dir(5, token(OLD))
    legacy = tmp_path / mf.staging_dir(6)
    foreign.mkdir(parents=True)
    legacy.mkdir()
    own = tier.staging(7)
    save_dir(tier, 20, {"state.llmt": b"x"})
    tier.retain()
    assert foreign.is_dir() and not legacy.exists() and not own.exists()


@pytest.mark.tools  # MinIO (the minio fixture)
def test_s3_retention_and_parts_are_scoped_to_the_run(minio, monkeypatch):
    for key, value in minio.env().items():
        monkeypatch.setenv(key, value)
    old, new = S3Tier("s3", "s3://ckpt/owned", keep=2), S3Tier("s3", "s3://ckpt/owned", keep=2)
    old.scope, new.scope = Scope.of(OLD), Scope.of(NEW)
    for step in (300, 400):
        save_shared(old, step, os.urandom(1000), nodes=1, piece=1 << 20, meta={"owner": OLD})
    old.write_part(25, 0, {"files": {}})  # the other run's upload in flight
    new.write_part(15, 0, {"files": {}})  # this run's abandoned upload
    # A part record of the other run at this run's step number is not counted as this run's.
    old.write_part(20, 1, {"files": {}})
    for step in (10, 20, 30):
        committed = save_shared(new, step, os.urandom(1000), nodes=1, piece=1 << 20, meta={"owner": NEW})
        assert committed.manifest["ranks"] == [0]
    assert new.retain() == [10, 15]
    keys = minio.keys("ckpt", "owned/")
    assert {c.step: owner_of(c.manifest) for c in new.list()} == {20: NEW, 30: NEW, 300: OLD, 400: OLD}
    assert any(k.startswith("owned/step-00000025/parts/") for k in keys), "the other run's upload stays"
    assert not any(k.startswith("owned/step-00000015/") for k in keys), "this run's abandoned upload goes"
