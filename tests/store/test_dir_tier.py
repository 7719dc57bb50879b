"""The directory tier: the commit protocol, verification, balanced shares reassembled,
retention with pins and under disk pressure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from llmtrain_store import manifest as mf
from llmtrain_store import shares
from llmtrain_store.health import classify
from llmtrain_store.directory import DirTier

from llmtrain_store.tier import CheckpointError, merge_parts

from store.helpers import ALLOWED, flip_byte, save_dir, save_shared

PIECE = 4096


def test_commit_waits_for_every_part_and_times_out_naming_the_missing_writer(tmp_path):
    tier = DirTier("local", tmp_path)
    tier.write_part(5, 0, {"files": {}})
    with pytest.raises(CheckpointError, match=r"missing parts of writers \[1\]"):
        tier.commit(5, {}, {0, 1}, {0, 1}, timeout=0.3)
    assert tier.list() == [], "an incomplete step is never listed"

    done = threading.Timer(0.2, lambda: tier.write_part(5, 1, {"files": {}}))
    done.start()
    committed = tier.commit(5, {"world_size": 2}, {0, 1}, {0, 1}, timeout=5)
    assert committed.step == 5 and (tier.final(5) / mf.COMMITTED).exists()


def test_a_torn_or_edited_manifest_is_not_listed(tmp_path):
    tier = DirTier("local", tmp_path)
    save_dir(tier, 1, {"state.llmt": b"a" * 10})
    save_dir(tier, 2, {"state.llmt": b"b" * 10})
    (tier.final(2) / mf.MANIFEST).write_text((tier.final(2) / mf.MANIFEST).read_text().replace('"step": 2', '"step": 3'))
    assert [c.step for c in tier.list()] == [1]


def test_verify_names_a_truncated_a_flipped_and_a_missing_file(tmp_path):
    tier = DirTier("local", tmp_path)
    committed = save_dir(tier, 7, {"state.llmt": os.urandom(50_000), "rng/rank-00000.llmt": b"r" * 10})
    assert tier.verify(committed, None, ALLOWED) is None
    state = tier.final(7) / "state.llmt"
    flip_byte(state)
    tier._verified.clear()
    assert "fails its xxh3-128 check" in tier.verify(committed, ["state.llmt"], ALLOWED)
    with open(state, "r+b") as fh:
        fh.truncate(100)
    tier._verified.clear()
    assert "has 100 bytes, the manifest says 50000" in tier.verify(committed, ["state.llmt"], ALLOWED)
    (tier.final(7) / "rng" / "rank-00000.llmt").unlink()
    tier._verified.clear()
    assert "rng/rank-00000.llmt is missing" in tier.verify(committed, ["rng/rank-00000.llmt"], ALLOWED)


def test_a_symlinked_file_fails_verification_even_with_the_right_bytes(tmp_path):
    tier = DirTier("local", tmp_path / "t")
    committed = save_dir(tier, 3, {"state.llmt": b"x" * 100})
    real = tmp_path / "elsewhere"
    (tier.final(3) / "state.llmt").rename(real)
    (tier.final(3) / "state.llmt").symlink_to(real)
    assert "is a symlink" in tier.verify(committed, None, ALLOWED)


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_balanced_shares_reassemble_byte_for_byte_and_each_node_stores_about_1_over_n(tmp_path, nodes):
    state = os.urandom(10 * PIECE + 123)
    tier = DirTier("shared", tmp_path / "shared")
    committed = save_shared(tier, 20, state, nodes, piece=PIECE)
    files = mf.entries(committed.manifest, ALLOWED)
    assert files["state.llmt"].size == len(state) and files["state.llmt"].sliced
    sizes = [(tier.final(20) / mf.slice_name("state.llmt", i, nodes)).stat().st_size for i in range(nodes)]
    assert sum(sizes) == len(state), "the replicated file is stored once per job"
    assert max(sizes) <= len(state) / nodes + PIECE, sizes
    assert tier.verify(committed, None, ALLOWED) is None
    records = tier.fetch(committed, ["state.llmt"], tmp_path / "pulled", ALLOWED)
    assert (tmp_path / "pulled" / "state.llmt").read_bytes() == state
    # The pulled copy's record reuses the pieces' hashes: it verifies as a whole file.
    assert records["state.llmt"]["size"] == len(state)


def test_fetch_of_a_corrupted_share_fails_and_names_it(tmp_path):
    tier = DirTier("shared", tmp_path / "shared")
    committed = save_shared(tier, 4, os.urandom(6 * PIECE), 2, piece=PIECE)
    flip_byte(tier.final(4) / mf.slice_name("state.llmt", 1, 2), 10)
    with pytest.raises(CheckpointError, match=r"state\.llmt\.part-001-of-002 of step 4 does not match"):
        tier.fetch(committed, ["state.llmt"], tmp_path / "pulled", ALLOWED)


def test_merge_parts_takes_one_copy_of_pieces_stored_twice():
    pieces = [(i * 10, 10, f"h{i}") for i in range(6)]
    whole = {"slices": {"f": {"size": 60, "pieces": shares.share_record("f", 0, 2, pieces)}}}
    half = {"slices": {"f": {"size": 60, "pieces": shares.share_record("f", 1, 2, pieces[3:])}}}
    merged = merge_parts([whole, half])["f"]["slices"]
    assert [p["offset"] for p in merged] == [0, 10, 20, 30, 40, 50]
    assert {p["name"] for p in merged} == {"f.part-000-of-002"}, "stays on one object while it has the bytes"
    with pytest.raises(CheckpointError, match="no writer stored the bytes from 30"):
        merge_parts([{"slices": {"f": {"size": 60, "pieces": shares.share_record("f", 0, 2, pieces[:3])}}}])


def test_merge_parts_refuses_shares_of_copies_that_differ():
    ours = [(i * 10, 10, f"h{i}") for i in range(6)]
    theirs = ours[:5] + [(50, 14, "other")]  # another node's copy: same start, other tail
    part0 = {"slices": {"f": {"size": 60, "whole": shares.fingerprint(ours), "pieces": shares.share_record("f", 0, 2, ours[:3])}}}
    part1 = {"slices": {"f": {"size": 64, "whole": shares.fingerprint(theirs), "pieces": shares.share_record("f", 1, 2, theirs[3:])}}}
    with pytest.raises(CheckpointError, match=r"f: the writers' copies differ \(2 versions: sizes \[60, 64\]\)"):
        merge_parts([part0, part1])
    same_size = dict(part1["slices"]["f"], size=60, whole=shares.fingerprint(ours[:5] + [(50, 10, "other")]))
    with pytest.raises(CheckpointError, match="copies differ"):
        merge_parts([part0, {"slices": {"f": same_size}}])
    part1["slices"]["f"] = dict(part1["slices"]["f"], size=60, whole=shares.fingerprint(ours),
                                pieces=shares.share_record("f", 1, 2, ours[3:]))
    assert len(merge_parts([part0, part1])["f"]["slices"]) == 6


def test_merge_parts_names_writers_that_cut_a_file_at_other_piece_sizes():
    """Trainers of two versions (an image changed mid-run reaches new pods only) hash the
    same bytes in pieces of other sizes: their shares cannot make one file, and the
    refusal says why rather than that the bytes differ."""
    old = [(i * 10, 10, f"a{i}") for i in range(6)]
    new = [(i * 20, 20, f"b{i}") for i in range(3)]
    part0 = {"slices": {"f": {"size": 60, "whole": shares.fingerprint(old), "pieces": shares.share_record("f", 0, 2, old[:3])}}}
    part1 = {"slices": {"f": {"size": 60, "whole": shares.fingerprint(new), "pieces": shares.share_record("f", 1, 2, new[1:])}}}
    with pytest.raises(CheckpointError, match=r"f: the writers cut it in pieces of different sizes \(\[10, 20\] bytes\)"):
        merge_parts([part0, part1])


def test_retention_keeps_the_newest_and_leaves_a_pinned_step_until_unpinned(tmp_path):
    tier = DirTier("local", tmp_path, keep=2)
    for step in (1, 2, 3):
        save_dir(tier, step, {"state.llmt": b"s"})
    pin = tier.pin(1, "rank-00001")
    assert pin is not None
    assert tier.retain() == []
    assert [c.step for c in tier.list()] == [3, 2, 1]
    pin.unlink()
    assert tier.retain() == [1]
    assert tier.pin(1, "rank-00001") is None, "a step that is gone cannot be pinned"


def test_a_pin_of_a_process_that_died_does_not_block_retention(tmp_path):
    tier = DirTier("local", tmp_path, keep=1)
    for step in (1, 2):
        save_dir(tier, step, {"state.llmt": b"s"})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".pins").mkdir(exist_ok=True)
    (tmp_path / ".pins" / f"{mf.step_dir(1)}.rank-00000").write_text(dead.stdout.strip())
    assert tier.retain() == [1]


def test_make_room_deletes_older_checkpoints_but_never_the_newest(tmp_path, monkeypatch):
    tier = DirTier("local", tmp_path, keep=5)
    for step in (1, 2, 3):
        save_dir(tier, step, {"state.llmt": b"s"})
    free = {"bytes": 0}

    def usage(path):
        # Each deletion frees 100 bytes of this pretend disk.
        return type("U", (), {"free": free["bytes"] + 100 * (3 - len(tier.list()))})()

    monkeypatch.setattr("llmtrain_store.directory.shutil.disk_usage", usage)
    assert tier.make_room(150) == [1, 2]
    assert [c.step for c in tier.list()] == [3]
    assert tier.make_room(10_000) == [], "the newest stays, whatever the need"


def test_delete_is_atomic_for_readers_and_sweep_removes_leftovers(tmp_path):
    tier = DirTier("local", tmp_path)
    save_dir(tier, 1, {"state.llmt": b"s"})
    (tmp_path / ".deleting-step-00000009").mkdir()
    (tmp_path / ".staging-00000010").mkdir()
    tier.sweep_staging()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".pins")) == ["step-00000001"]
    tier.delete(1)
    assert tier.list() == [] and not any(tmp_path.glob(".deleting-*"))


def test_a_full_filesystem_is_reported_as_no_space(tmp_path):
    err = OSError(28, "No space left on device")
    assert classify(err).reason == "NoSpace"
    wrapped = CheckpointError("write failed")
    wrapped.__cause__ = PermissionError(13, "denied")
    assert classify(wrapped).reason == "PermissionDenied"


def test_a_manifest_written_by_hand_with_an_unexpected_file_is_rejected_by_verify(tmp_path):
    tier = DirTier("local", tmp_path)
    committed = save_dir(tier, 2, {"state.llmt": b"s" * 10})
    manifest = dict(committed.manifest)
    manifest["files"] = {**manifest["files"], "payload.so": {"size": 1, "hash": "x"}}
    committed.manifest = json.loads(json.dumps(manifest))
    assert "is not a file this engine writes" in tier.verify(committed, None, ALLOWED)
