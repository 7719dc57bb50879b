"""Restore decisions and the tier commit protocol, without processes or torch."""

from __future__ import annotations

import json
import threading

import pytest
from llmtrain_trainer.checkpoint.restore import Candidate, candidates, can_serve, files_to_verify, find_restore_point
from llmtrain_trainer.checkpoint.tier import CheckpointError, DirTier, describe_files


def copy(path, world, ranks, samples=80, tier="local"):
    return {"tier": tier, "path": path, "world": world, "ranks": ranks, "samples": samples}


# ------------------------------------------------------------------ candidates


def test_replicated_state_everyone_holding_it_loads_locally():
    listings = [{10: [copy("/n0", 2, [0])]}, {10: [copy("/n1", 2, [1])]}]
    assert candidates(listings, world=2, sharded=False)[0] == Candidate(10, "local", 80, 2)


def test_replicated_state_a_new_node_without_a_copy_gets_a_broadcast():
    listings = [{10: [copy("/n0", 1, [0])]}, {}]
    assert candidates(listings, world=2, sharded=False) == [Candidate(10, "broadcast", 80, 1, source_rank=0)]


def test_sharded_same_world_needs_every_rank_to_hold_its_shard():
    listings = [{10: [copy("/n0", 2, [0])]}, {10: [copy("/n1", 2, [1])]}]
    assert [c.mode for c in candidates(listings, 2, sharded=True)] == ["local"]
    swapped = [{10: [copy("/n0", 2, [1])]}, {10: [copy("/n1", 2, [0])]}]
    assert candidates(swapped, 2, sharded=True) == []


def test_sharded_other_world_uses_a_complete_copy_everyone_sees():
    shared = copy("/shared/step-10", 2, [0, 1], tier="shared")
    listings = [{10: [copy("/n0", 2, [0]), shared]}]
    assert candidates(listings, world=1, sharded=True) == [
        Candidate(10, "universal", 80, 2, shared_path="/shared/step-10")
    ]


def test_newest_first_across_all_ranks():
    listings = [{10: [copy("/a10", 1, [0])], 5: [copy("/a5", 1, [0])]}, {5: [copy("/b5", 1, [0])]}]
    assert [(c.step, c.mode) for c in candidates(listings, 2, sharded=False)] == [
        (10, "broadcast"), (5, "local"), (5, "broadcast"),
    ]


def test_files_to_verify_depend_on_the_mode():
    names = ["ds/mp_rank_00_model_states.pt", "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt",
             "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt", "rng/rank-00001.pt"]

    def owner(n):
        if n.startswith("rng/"):
            return 1
        return int(n.split("zero_pp_rank_")[1].split("_")[0]) if "zero_pp_rank_" in n else None

    local = Candidate(10, "local", 80, 2)
    assert files_to_verify(local, names, 1, owner) == [names[0], names[2], names[3]]
    universal = Candidate(10, "universal", 80, 2, shared_path="/s")
    assert files_to_verify(universal, names, 0, owner) == names
    assert files_to_verify(universal, names, 1, owner) == []
    assert can_serve(local, copy("/n", 2, [0]), rank=1, sharded=True) is False


# ------------------------------------------------------------------ tiers


def _save(tier: DirTier, step: int, ranks: list[int], world: int, payload: bytes = b"x" * 100):
    for rank in ranks:
        folder = tier.staging(step)
        (folder / f"r{rank}.bin").write_bytes(payload)
        tier.write_part(step, rank, describe_files(folder, [f"r{rank}.bin"]), set())
    return tier.commit(step, {"world_size": world, "samples_consumed": step * 8, "config_hash": "h", "strategy": "ddp"}, set(ranks), 5)


def test_commit_waits_for_every_part_and_times_out_naming_the_missing_rank(tmp_path):
    tier = DirTier("local", tmp_path)
    folder = tier.staging(5)
    (folder / "r0.bin").write_bytes(b"a")
    tier.write_part(5, 0, describe_files(folder, ["r0.bin"]), set())
    with pytest.raises(CheckpointError, match=r"missing parts of ranks \[1\]"):
        tier.commit(5, {"world_size": 2, "samples_consumed": 40}, {0, 1}, timeout=0.2)
    assert tier.list() == []


def test_listing_ignores_uncommitted_and_tampered_manifests(tmp_path):
    tier = DirTier("local", tmp_path, keep=5)
    good = _save(tier, 5, [0], 1)
    _save(tier, 10, [0], 1)
    tier.staging(15)  # a crash mid-write leaves this behind
    manifest = tier.final(10) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["samples_consumed"] = 999
    manifest.write_text(json.dumps(data))
    assert [c.step for c in tier.list()] == [5]
    assert good.verify() is None


def test_verify_reports_size_and_checksum_mismatches(tmp_path):
    tier = DirTier("local", tmp_path)
    committed = _save(tier, 5, [0], 1)
    (committed.path / "r0.bin").write_bytes(b"y" * 100)
    assert committed.verify() == "r0.bin fails its sha256 check"
    (committed.path / "r0.bin").write_bytes(b"y")
    assert committed.verify() == "r0.bin has size 1, manifest says 100"
    (committed.path / "r0.bin").unlink()
    assert committed.verify() == "r0.bin is missing"


def test_retention_keeps_the_newest_and_sweeps_stale_staging(tmp_path):
    tier = DirTier("local", tmp_path, keep=2)
    for step in (5, 10, 15):
        _save(tier, step, [0], 1)
    tier.staging(7)
    assert tier.retain() == [5]
    assert [c.step for c in tier.list()] == [15, 10]
    assert not list(tmp_path.glob(".staging-*"))


def test_find_restore_point_without_any_checkpoint_is_a_fresh_start(tmp_path):
    tier = DirTier("local", tmp_path)
    assert find_restore_point([tier], 0, 1, "h", "ddp", False, lambda n: None, lambda o: [o]) is None


def test_find_restore_point_picks_the_newest_verified_step(tmp_path):
    tier = DirTier("local", tmp_path, keep=5)
    _save(tier, 5, [0], 1)
    newest = _save(tier, 10, [0], 1)
    (newest.path / "r0.bin").write_bytes(b"z" * 100)
    choice = find_restore_point([tier], 0, 1, "h", "ddp", False, lambda n: None, lambda o: [o])
    assert (choice.step, choice.mode, choice.samples) == (5, "local", 40)


def _gathers(world: int):
    """One all-gather callable per rank, backed by threads (the agreement's only I/O)."""
    slots: list = [None] * world
    barrier = threading.Barrier(world, timeout=10)

    def for_rank(rank):
        def gather(obj):
            slots[rank] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()  # nobody overwrites a slot before everyone has read it
            return out

        return gather

    return [for_rank(r) for r in range(world)]


def test_a_broadcast_reports_the_source_ranks_tier_on_every_rank(tmp_path):
    # Rank 0 landed on a new node without a copy; rank 1's node holds step 10 locally.
    empty, holder = DirTier("local", tmp_path / "n0"), DirTier("local", tmp_path / "n1")
    _save(holder, 10, [0], 1)
    gathers = _gathers(2)
    choices: dict[int, object] = {}

    def run(rank, tier):
        choices[rank] = find_restore_point([tier], rank, 2, "h", "ddp", False, lambda n: None, gathers[rank])

    threads = [threading.Thread(target=run, args=(r, t)) for r, t in enumerate((empty, holder))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert {r: (c.mode, c.source_rank, c.tier, c.source_tier) for r, c in choices.items()} == {
        0: ("broadcast", 1, None, "local"),
        1: ("broadcast", 1, "local", "local"),
    }
