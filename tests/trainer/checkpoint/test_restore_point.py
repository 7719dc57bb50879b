"""Restore decisions across ranks and tiers, without processes: the agreement's only I/O
is an all-gather, played here by threads."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest
from llmtrain_store import manifest as mf
from llmtrain_store.fileio import hash_file
from llmtrain_store.tier import digest_bytes
from llmtrain_store.directory import DirTier
from llmtrain_trainer.checkpoint.restore import (Candidate, can_serve, candidates, files_to_verify, find_restore_point, holds,
                                                 rank_ranges)

from store.helpers import ALLOWED, flip_byte, save_dir, save_shared


def copy(location, world, ranks, samples=80, tier="local", index=0):
    return {"tier": tier, "index": index, "location": location, "world": world, "ranks": rank_ranges(ranks), "samples": samples,
            "max_steps": None}


def _owner(name):
    return None


# ------------------------------------------------------------------ candidates (pure)


def test_replicated_state_everyone_holding_it_loads_locally():
    listings = [{10: [copy("/n0", 2, [0])]}, {10: [copy("/n1", 2, [1])]}]
    assert candidates(listings, world=2, sharded=False)[0] == Candidate(10, "local", 80, 2)


def test_replicated_state_a_new_node_without_a_copy_gets_a_broadcast_from_the_fastest_holder_then_the_others():
    # The fastest holder's copy first; should it fail its check, another holder's copy of
    # the same step before any older step.
    listings = [{10: [copy("s3://b/p", 1, [0], tier="s3", index=2)]}, {10: [copy("/n1", 1, [0])]}, {}]
    assert candidates(listings, world=3, sharded=False) == [Candidate(10, "broadcast", 80, 1, source_rank=1),
                                                            Candidate(10, "broadcast", 80, 1, source_rank=0)]


def test_sharded_same_world_needs_every_rank_to_hold_its_shard():
    listings = [{10: [copy("/n0", 2, [0])]}, {10: [copy("/n1", 2, [1])]}]
    assert [c.mode for c in candidates(listings, 2, sharded=True)] == ["local"]
    swapped = [{10: [copy("/n0", 2, [1])]}, {10: [copy("/n1", 2, [0])]}]
    assert candidates(swapped, 2, sharded=True) == []


def test_sharded_other_world_uses_a_complete_copy_every_rank_sees():
    shared = copy("s3://b/p/step-10", 2, [0, 1], tier="s3", index=2)
    listings = [{10: [copy("/n0", 2, [0]), shared]}]
    assert candidates(listings, world=1, sharded=True) == [Candidate(10, "universal", 80, 2, universal_tier="s3")]


def test_newest_first_across_all_ranks():
    listings = [{10: [copy("/a10", 1, [0])], 5: [copy("/a5", 1, [0])]}, {5: [copy("/b5", 1, [0])]}]
    assert [(c.step, c.mode) for c in candidates(listings, 2, sharded=False)] == [
        (10, "broadcast"), (5, "local"), (5, "broadcast"), (5, "broadcast"),
    ]


def test_files_to_verify_depend_on_the_mode_and_the_node():
    names = ["ds/mp_rank_00_model_states.pt", "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt",
             "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt", "rng/rank-00000.llmt", "rng/rank-00001.llmt"]

    def owner(n):
        return int(n.split("zero_pp_rank_")[1].split("_")[0]) if "zero_pp_rank_" in n else None

    local = Candidate(10, "local", 80, 2)
    assert files_to_verify(local, names, 1, owner, node_ranks=[1]) == [names[0], names[2], names[4]]
    assert files_to_verify(local, names, 0, owner, node_ranks=[0, 1]) == names, "a node leader pulls for its node"
    universal = Candidate(10, "universal", 80, 2, universal_tier="shared")
    assert files_to_verify(universal, names, 0, owner, node_ranks=[0]) == names[:3] + [names[3]]
    assert can_serve(local, copy("/n", 2, [0]), rank=1, sharded=True) is False


# ------------------------------------------------------------------ the agreement


def _gathers(world: int):
    slots: list = [None] * world
    barrier = threading.Barrier(world, timeout=20)

    def for_rank(rank):
        def gather(obj):
            slots[rank] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()  # nobody overwrites a slot before everyone has read it
            return out

        return gather

    return [for_rank(r) for r in range(world)]


def _agree(tiers_per_rank, world=None, sharded=False):
    world = world or len(tiers_per_rank)
    gathers = _gathers(world)
    out: dict[int, object] = {}

    def run(rank):
        out[rank] = find_restore_point(tiers_per_rank[rank], rank, world, [rank], "h", "ddp", sharded, ALLOWED, _owner,
                                       gathers[rank])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_without_any_checkpoint_it_is_a_fresh_start(tmp_path):
    assert find_restore_point([DirTier("local", tmp_path)], 0, 1, [0], "h", "ddp", False, ALLOWED, _owner, lambda o: [o]) is None


def test_a_corrupt_newest_local_copy_falls_back_to_the_shared_tier_with_the_reason_logged(tmp_path, caplog):
    local, shared = DirTier("local", tmp_path / "local"), DirTier("shared", tmp_path / "shared")
    state = os.urandom(10_000)
    save_dir(local, 10, {"state.llmt": state, "rng/rank-00000.llmt": b"r\0"})
    save_shared(shared, 10, state, nodes=1)
    flip_byte(local.final(10) / "state.llmt")
    with caplog.at_level(logging.WARNING, "llmtrain.restore"):
        choice = _agree([[local, shared]])[0]
    assert (choice.step, choice.tier) == (10, "shared")
    assert "step 10: not using the local tier's copy: state.llmt fails its xxh3-128 check" in caplog.text


def test_with_no_verified_copy_of_the_newest_step_it_takes_an_older_one(tmp_path, caplog):
    local = DirTier("local", tmp_path, keep=5)
    save_dir(local, 5, {"state.llmt": b"a" * 100})
    save_dir(local, 10, {"state.llmt": b"b" * 100})
    (local.final(10) / "state.llmt").write_bytes(b"c" * 100)
    with caplog.at_level(logging.WARNING, "llmtrain.restore"):
        choice = _agree([[local]])[0]
    assert (choice.step, choice.mode, choice.samples) == (5, "local", 40)
    assert "falling back from step 10 (local)" in caplog.text


def test_a_broadcast_reports_the_source_ranks_tier_on_every_rank(tmp_path):
    empty, holder = DirTier("local", tmp_path / "n0"), DirTier("local", tmp_path / "n1")
    save_dir(holder, 10, {"state.llmt": b"s" * 10})
    choices = _agree([[empty], [holder]])
    assert {r: (c.mode, c.source_rank, c.tier, c.source_tier) for r, c in choices.items()} == {
        0: ("broadcast", 1, None, "local"),
        1: ("broadcast", 1, "local", "local"),
    }


def _recommit(tier, step, edit):
    """Edit a committed manifest and recommit it (COMMITTED matches again): tampering, not
    a torn write."""
    folder = tier.final(step)
    manifest = json.loads((folder / mf.MANIFEST).read_text())
    edit(manifest, folder)
    text = json.dumps(manifest).encode()
    (folder / mf.MANIFEST).write_bytes(text)
    (folder / mf.COMMITTED).write_text(digest_bytes(text))


def _traversal(manifest, folder):
    target = "../" * 12 + "etc/passwd"
    size, digest = hash_file(folder / target)
    manifest["files"][target] = {"size": size, "hash": digest}


def _absolute(manifest, folder):
    size, digest = hash_file(Path("/etc/hostname"))
    manifest["files"]["/etc/hostname"] = {"size": size, "hash": digest}


def _symlink(manifest, folder):
    real = folder.parent / "outside.bin"
    (folder / "state.llmt").rename(real)
    (folder / "state.llmt").symlink_to(real)


def _unexpected(manifest, folder):
    (folder / "hook.py").write_text("print('pwned')")
    size, digest = hash_file(folder / "hook.py")
    manifest["files"]["hook.py"] = {"size": size, "hash": digest}


def _size(manifest, folder):
    manifest["files"]["state.llmt"]["size"] += 1


@pytest.mark.parametrize("edit, reason", [
    (_traversal, "leaves the checkpoint folder"),
    (_absolute, "'/etc/hostname' is an absolute path"),
    (_symlink, "state.llmt is a symlink"),
    (_unexpected, "'hook.py' is not a file this engine writes"),
    (_size, "state.llmt has 10 bytes, the manifest says 11"),
], ids=["traversal", "absolute", "symlink", "unexpected-name", "size-mismatch"])
def test_a_hostile_manifest_is_rejected_with_the_reason_and_restore_falls_back(tmp_path, caplog, edit, reason):
    local = DirTier("local", tmp_path / "ckpt", keep=5)
    save_dir(local, 5, {"state.llmt": b"a" * 10})
    save_dir(local, 10, {"state.llmt": b"b" * 10})
    _recommit(local, 10, edit)
    with caplog.at_level(logging.WARNING, "llmtrain.restore"):
        choice = _agree([[local]])[0]
    assert choice.step == 5, "the older, intact step"
    assert reason in caplog.text, caplog.text


class _Broken:
    """A tier whose listing fails with ``err`` (what an S3 tier raises)."""

    kind = "s3"

    def __init__(self, err):
        self.name, self.err, self.calls = "s3", err, 0

    def list(self):
        self.calls += 1
        raise self.err


def _restore(tiers, **kw):
    errors = []
    choice = find_restore_point(tiers, 0, 1, [0], "h", "ddp", False, ALLOWED, _owner, lambda o: [o],
                                on_error=lambda tier, err: errors.append(tier), sleep=lambda s: None, **kw)
    return choice, errors


def test_an_unreachable_tier_with_nothing_elsewhere_is_retried_then_a_retryable_error(tmp_path):
    from llmtrain_trainer.checkpoint.restore import LIST_RETRIES, TierUnavailable

    broken = _Broken(ConnectionRefusedError(111, "refused"))
    with pytest.raises(TierUnavailable, match="s3 tier: the endpoint cannot be reached"):
        _restore([DirTier("local", tmp_path), broken])
    assert broken.calls == len(LIST_RETRIES) + 1


def test_an_unreachable_tier_does_not_stop_a_restore_from_another_tier(tmp_path):
    local = DirTier("local", tmp_path)
    save_dir(local, 5, {"state.llmt": b"a" * 10})
    choice, errors = _restore([local, _Broken(ConnectionRefusedError(111, "refused"))])
    assert choice.step == 5 and errors == ["s3"] * 4


def test_refused_credentials_are_not_retried_and_a_fresh_job_starts(tmp_path, caplog):
    from botocore.exceptions import ClientError

    denied = ClientError({"Error": {"Code": "InvalidAccessKeyId", "Message": "The key AKIAXXXX is wrong"},
                          "ResponseMetadata": {"HTTPStatusCode": 403}}, "ListObjectsV2")
    broken = _Broken(denied)
    with caplog.at_level(logging.WARNING, "llmtrain.restore"):
        choice, errors = _restore([DirTier("local", tmp_path), broken])
    assert choice is None and broken.calls == 1 and errors == ["s3"]
    assert "s3 tier: cannot list checkpoints: the credentials were refused" in caplog.text
    assert "AKIAXXXX" not in caplog.text


def _unreadable(tier: DirTier, step: int) -> None:
    """A committed step whose manifest cannot be read (EISDIR here; EIO, ESTALE or EACCES
    on a real filesystem): listed, but not absent."""
    folder = tier.root / mf.step_dir(step)
    (folder / mf.MANIFEST).unlink()
    (folder / mf.MANIFEST).mkdir()


def test_a_listed_step_that_cannot_be_read_never_lets_a_job_start_over(tmp_path, caplog):
    """Whatever the reason (here a folder where the manifest should be), a step the tier
    lists but cannot read is committed progress that may exist: with nothing readable
    elsewhere, the trainer exits retryable instead of starting at step 0."""
    from llmtrain_store.tier import StepUnreadable
    from llmtrain_trainer.checkpoint.restore import TierUnavailable

    shared = DirTier("shared", tmp_path / "shared", keep=1)
    save_dir(shared, 10, {"state.llmt": b"a" * 10})
    _unreadable(shared, 10)
    (tmp_path / "shared" / mf.step_dir(20)).mkdir()  # an upload that never committed: not listed, no error
    with pytest.raises(StepUnreadable, match="shared tier: step 10 is listed but cannot be read"):
        shared.list()
    assert shared.retain(keep=0) == []
    assert (tmp_path / "shared" / mf.step_dir(10)).is_dir(), "retention deleted nothing"
    with pytest.raises(TierUnavailable, match="shared tier: step 10 is listed but cannot be read"):
        _restore([DirTier("local", tmp_path / "local"), shared])


def test_steps_that_can_be_read_beside_one_that_cannot_are_used_and_the_other_is_kept(tmp_path, caplog):
    """One unreadable folder does not hide the tier's other steps from a restore, nor stop
    retention for good: it is named, never deleted, never counted."""
    shared = DirTier("shared", tmp_path / "shared", keep=1)
    for step in (5, 10, 15):
        save_dir(shared, step, {"state.llmt": bytes([step]) * 10})
    _unreadable(shared, 5)
    with caplog.at_level(logging.ERROR, "llmtrain.restore"):
        choice, _ = _restore([DirTier("local", tmp_path / "local"), shared])
    assert choice.step == 15
    assert "shared tier: step 5 is listed but cannot be read" in caplog.text and "restoring from the steps that could" in caplog.text
    assert shared.retain() == [10], "the readable older step goes; the unreadable one stays"
    assert (tmp_path / "shared" / mf.step_dir(5)).is_dir()


def test_a_step_being_deleted_while_listed_is_left_out_not_an_error(tmp_path):
    tier = DirTier("shared", tmp_path / "shared", keep=5)
    save_dir(tier, 5, {"state.llmt": b"a" * 10})
    save_dir(tier, 10, {"state.llmt": b"b" * 10})
    (tier.root / mf.step_dir(10) / mf.COMMITTED).unlink()  # deletion under way, or a commit not finished
    assert [c.step for c in tier.list()] == [5]


def test_reads_refused_on_a_listed_step_are_retryable_though_a_refused_listing_is_not(tmp_path):
    """A refused listing (wrong keys) says nothing exists that this job can see: a fresh
    job starts (the test above). A refused read of a step the listing showed says progress
    exists: the trainer exits retryable, with the reason."""
    from botocore.exceptions import ClientError
    from llmtrain_store.tier import StepUnreadable
    from llmtrain_trainer.checkpoint.restore import TierUnavailable

    denied = ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")
    try:
        raise StepUnreadable("s3", [40], denied) from denied
    except StepUnreadable as err:
        unreadable = err
    with pytest.raises(TierUnavailable, match="s3 tier: step 40 is listed but cannot be read: the credentials were refused"):
        _restore([DirTier("local", tmp_path), _Broken(unreadable)])


def test_a_copys_ranks_travel_as_runs_whose_size_does_not_grow_with_the_world():
    import pickle

    assert rank_ranges([3, 0, 1, 2, 7, 8, 3]) == [(0, 4), (7, 9)]
    assert [r for r in range(10) if holds([(0, 4), (7, 9)], r)] == [0, 1, 2, 3, 7, 8]
    assert not holds([], 0)
    # What every rank gathers from every rank: a complete copy is one run at any world size.
    small, large = (pickle.dumps({10: [copy("s3://b/p", w, list(range(w)), tier="s3")]}) for w in (8, 8192))
    assert len(large) - len(small) < 8
    # A world of 8,192 ranks, each holding its own shard in tier 1 and the job's complete
    # copy in S3: local loading and the universal copy are both found.
    world = 8192
    complete = copy("s3://b/p", world, list(range(world)), tier="s3", index=2)
    listings = [{10: [copy(f"/n{r // 8}", world, [r]), complete]} for r in range(world)]
    assert [c.mode for c in candidates(listings, world, sharded=True)] == ["local", "universal"]
