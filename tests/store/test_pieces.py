"""Content-addressed pieces in the job-wide tiers (``pieces.py``, ``piecestore.py``): a
piece is stored once however many steps hold it, compressed where that pays, read back
byte for byte, refused when forged, and collected only when nothing refers to it, even
while a commit races a prune."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmtrain_store import manifest as mf
from llmtrain_store import pieces, piecestore
from llmtrain_store.directory import DirTier
from llmtrain_store.tier import CheckpointError, digest_bytes

from store.helpers import ALLOWED, pieces_of, save_pieces

PIECE = 1 << 20


def _tier(tmp_path, keep: int = 3) -> DirTier:
    return DirTier("shared", tmp_path / "shared", keep=keep, content_addressed=True)


def _fetch(tier, committed, tmp_path, name="state.llmt") -> bytes:
    dest = tmp_path / f"pulled-{committed.step}-{time.monotonic_ns()}"
    tier.fetch(committed, [name], dest, ALLOWED)
    return (dest / name).read_bytes()


def _stored(tier) -> int:
    return sum(tier.piece_objects().values())


def test_a_step_that_shares_most_pieces_stores_only_the_changed_ones(tmp_path):
    tier = _tier(tmp_path)
    frozen = os.urandom(18 * PIECE)
    first = frozen + os.urandom(2 * PIECE)
    step1, sent1 = save_pieces(tier, 1, {"state.llmt": first}, nodes=2, piece=PIECE)
    assert sent1 == len(first), "random bytes are stored whole, uncompressed"
    second = frozen + os.urandom(2 * PIECE)
    step2, sent2 = save_pieces(tier, 2, {"state.llmt": second}, nodes=2, piece=PIECE)
    assert sent2 == 2 * PIECE, "only the two changed pieces go to the tier"
    assert _stored(tier) == len(first) + 2 * PIECE
    assert step2.manifest["format"] == mf.FORMAT_PIECES
    assert not any(p.name.startswith("state") for p in (tmp_path / "shared" / mf.step_dir(2)).iterdir()), \
        "a step folder holds its manifest, no piece"
    assert _fetch(tier, step1, tmp_path) == first
    assert _fetch(tier, step2, tmp_path) == second
    assert tier.verify(step2, None, ALLOWED) is None


def test_pieces_that_compress_are_stored_compressed_and_read_back_exactly(tmp_path):
    tier = _tier(tmp_path)
    zeros = bytes(3 * PIECE)
    text = (b"step 120 loss 2.71828 " * 100_000)[:PIECE]
    noise = os.urandom(PIECE)
    state = zeros + text + noise
    committed, sent = save_pieces(tier, 1, {"state.llmt": state}, piece=PIECE)
    slices = committed.manifest["files"]["state.llmt"]["slices"]
    assert [s.get("codec") for s in slices] == ["zstd"] * 4 + [None], "zeros and text compressed, noise raw"
    assert len({s["ref"] for s in slices[:3]}) == 1, "three zero pieces are one object"
    assert sent < PIECE + PIECE // 10, "three zero pieces share one object; text shrinks to almost nothing"
    assert sorted(tier.piece_objects()) == sorted(
        pieces.object_name(s["ref"], s.get("codec")) for s in {s["ref"]: s for s in slices}.values())
    assert _fetch(tier, committed, tmp_path) == state
    assert tier.verify(committed, None, ALLOWED) is None


def test_retention_collects_only_the_pieces_no_kept_step_holds(tmp_path):
    tier = _tier(tmp_path, keep=2)
    base = os.urandom(4 * PIECE)
    states = {step: base + os.urandom(PIECE) for step in (1, 2, 3)}
    for step, state in states.items():
        save_pieces(tier, step, {"state.llmt": state}, piece=PIECE)
    assert len(tier.piece_objects()) == 4 + 3
    assert tier.retain() == [1]
    assert [c.step for c in tier.list()] == [3, 2]
    assert len(tier.piece_objects()) == 4 + 2, "step 1's own piece went with it; the shared ones stayed"
    for committed in tier.list():
        assert _fetch(tier, committed, tmp_path) == states[committed.step]


def _seeded(seed: int, size: int) -> bytes:
    return seed.to_bytes(4, "little") * (size // 4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=1, max_size=6),
       keep=st.integers(1, 3))
def test_a_piece_a_kept_step_holds_survives_every_prune(tmp_path_factory, steps, keep):
    """Steps built from a small pool of pieces (so they share many), pruned after each
    commit: every kept step reads back whole, and nothing else is stored."""
    tmp_path = tmp_path_factory.mktemp("prop")
    tier = _tier(tmp_path, keep=keep)
    pool = [_seeded(i + 1, 64 << 10) for i in range(6)]
    states = {}
    for step, choice in enumerate(steps, start=1):
        states[step] = b"".join(pool[i] for i in choice)
        save_pieces(tier, step, {"state.llmt": states[step]}, piece=64 << 10)
        tier.retain()
        kept = tier.list()
        assert [c.step for c in kept] == list(range(step, max(0, step - keep), -1))
        for committed in kept:
            assert _fetch(tier, committed, tmp_path) == states[committed.step]
        held = set().union(*(pieces.refs_in(c.manifest) for c in kept))
        assert {pieces.ref_of_object(o) for o in tier.piece_objects()} == held


def test_a_claimed_piece_survives_a_prune_that_runs_before_its_commit(tmp_path):
    """A writer found piece P stored (held by step 1) and skipped it; the prune that
    deletes step 1 runs before the writer commits step 2: P must stay."""
    tier = _tier(tmp_path, keep=1)
    state = os.urandom(2 * PIECE)
    save_pieces(tier, 1, {"state.llmt": state}, piece=PIECE)
    run = pieces_of(state, PIECE)
    held = tier.claim(2, 0, {f"{h}-{n}" for _, n, h in run})
    assert len(held) == 2
    tier.delete(1)  # step 1 gone: only the claim holds its pieces now
    assert tier.collect() == []
    from llmtrain_store.sources import MemorySource
    written = tier.put_pieces(MemorySource([state]), run, held)
    assert written.written == 0 and written.reused == len(state)
    tier.write_part(2, 0, {"files": {}, "slices": {"state.llmt": {"size": len(state), "whole": "w",
                                                                  "pieces": written.records}}})
    committed = tier.commit(2, {"config_hash": "h", "strategy": "ddp", "world_size": 1, "samples_consumed": 0}, {0}, {0}, 5)
    assert tier.collect() == []
    assert _fetch(tier, committed, tmp_path) == state
    assert not (tmp_path / "shared" / mf.step_dir(2) / "claims").exists(), "the manifest holds the pieces now"


def test_a_writer_waits_out_a_collection_in_progress_and_stores_what_it_deleted(tmp_path, monkeypatch):
    """A collection that began before the writer's claim may delete a piece the writer
    would have skipped: the writer waits for it to end before it trusts the listing."""
    tier = _tier(tmp_path, keep=1)
    state = os.urandom(PIECE)
    save_pieces(tier, 1, {"state.llmt": state}, piece=PIECE)
    tier.delete(1)
    tier.marker_put("slow-collector")  # a collection that read the claims already
    (obj,) = tier.piece_objects()

    def finish_collection() -> None:
        time.sleep(0.6)
        tier.piece_delete(obj)  # what it had decided before the claim existed
        tier.marker_drop("slow-collector")

    collector = threading.Thread(target=finish_collection)
    collector.start()
    began = time.monotonic()
    run = pieces_of(state, PIECE)
    held = tier.claim(2, 0, {f"{h}-{n}" for _, n, h in run})
    collector.join()
    assert time.monotonic() - began >= 0.5, "the writer waited for the collection to end"
    assert held == {}, "the deleted piece is not taken as stored"
    from llmtrain_store.sources import MemorySource
    assert tier.put_pieces(MemorySource([state]), run, held).written == PIECE


def test_a_dead_collections_marker_is_waited_out_then_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(pieces, "WAIT", 0.3)
    tier = _tier(tmp_path)
    tier.marker_put("crashed")
    began = time.monotonic()
    tier.claim(1, 0, set())
    assert 0.3 <= time.monotonic() - began < 5
    assert tier.markers() == []


def test_commits_racing_prunes_lose_nothing(tmp_path, monkeypatch):
    """One thread commits steps that reuse most pieces of the step before; another
    prunes and collects without pause. Every step the tier lists reads back whole."""
    monkeypatch.setattr(pieces, "WINDOW", 0.2)
    monkeypatch.setattr(pieces, "WAIT", 0.6)
    tier = _tier(tmp_path, keep=1)
    pruner = _tier(tmp_path, keep=1)
    piece = 64 << 10
    base = [os.urandom(piece) for _ in range(8)]
    states: dict[int, bytes] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def prune() -> None:
        while not stop.is_set():
            try:
                pruner.retain()
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)
                return

    thread = threading.Thread(target=prune)
    thread.start()
    try:
        for step in range(1, 31):
            base[step % 8] = os.urandom(piece)  # one piece changes per step
            states[step] = b"".join(base)
            committed, _ = save_pieces(tier, step, {"state.llmt": states[step]}, piece=piece)
            assert _fetch(tier, committed, tmp_path) == states[step]
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    for committed in tier.list():
        assert tier.verify(committed, None, ALLOWED) is None
        assert _fetch(tier, committed, tmp_path) == states[committed.step]


# ---------------------------------------------------------------------- hostile input


def _forge(tier, committed, edit) -> object:
    """Rewrite a committed manifest (and its COMMITTED marker, as someone who can write
    the tier would) with ``edit`` applied to its first piece record."""
    folder = tier.final(committed.step)
    manifest = json.loads((folder / mf.MANIFEST).read_text())
    edit(manifest["files"]["state.llmt"]["slices"][0])
    text = json.dumps(manifest).encode()
    (folder / mf.MANIFEST).write_bytes(text)
    (folder / mf.COMMITTED).write_text(digest_bytes(text) + "\n")
    tier._verified.clear()
    return next(c for c in tier.list() if c.step == committed.step)


@pytest.mark.parametrize("edit, why", [
    (lambda p: p.update(ref="../../../etc/passwd"), "is not the hash and size of its piece"),
    (lambda p: p.update(ref=p["ref"].split("-")[0] + "-7"), "is not the hash and size of its piece"),
    (lambda p: p.update(name="state.llmt"), "also names an object"),
    (lambda p: p.update(codec="lz4", stored=10), "unknown codec"),
    (lambda p: p.update(codec="zstd", stored=1 << 40), "no plausible stored size"),
    (lambda p: p.update(stored=5), "no plausible stored size"),
    (lambda p: p.update(codec=[], stored=5), "unknown codec"),
    (lambda p: p.update(size=10**15, ref=p["hash"] + "-" + str(10**15)), "larger than any piece"),
])
def test_a_forged_piece_reference_is_refused_by_name(tmp_path, edit, why):
    tier = _tier(tmp_path)
    committed, _ = save_pieces(tier, 1, {"state.llmt": os.urandom(2 * PIECE)}, piece=PIECE)
    forged = _forge(tier, committed, edit)
    with pytest.raises(mf.ManifestRejected, match=why):
        mf.entries(forged.manifest, ALLOWED)
    assert why in tier.verify(forged, None, ALLOWED)
    from llmtrain_store import survey
    (row,) = survey.rows(survey.Found("shared", tier))
    assert why in row.problem, "llmtrain checkpoints ls says why, and does not crash"


def test_a_reference_in_a_format_2_manifest_is_refused(tmp_path):
    tier = _tier(tmp_path)
    committed, _ = save_pieces(tier, 1, {"state.llmt": os.urandom(PIECE)}, piece=PIECE)
    with pytest.raises(mf.ManifestRejected, match="piece reference in a format 2 manifest"):
        mf.entries({**committed.manifest, "format": mf.FORMAT_VERSION}, ALLOWED)


def test_a_missing_truncated_or_swapped_piece_fails_the_fetch_naming_it(tmp_path):
    tier = _tier(tmp_path)
    state = os.urandom(3 * PIECE)
    committed, _ = save_pieces(tier, 1, {"state.llmt": state}, piece=PIECE)
    objects = sorted(tier.piece_objects())
    folder = tmp_path / "shared" / pieces.PIECES_DIR
    (folder / objects[0]).unlink()
    with pytest.raises(CheckpointError, match=f"{objects[0]} cannot be read"):
        tier.fetch(committed, ["state.llmt"], tmp_path / "a", ALLOWED)
    save_pieces(tier, 2, {"state.llmt": state}, piece=PIECE)  # stores the missing piece again
    with open(folder / objects[1], "r+b") as fh:
        fh.truncate(PIECE - 1)
    with pytest.raises(CheckpointError, match="has 1048575 bytes, the manifest says 1048576"):
        tier.fetch(committed, ["state.llmt"], tmp_path / "b", ALLOWED)
    (folder / objects[1]).write_bytes((folder / objects[2]).read_bytes())  # the right size, other bytes
    with pytest.raises(CheckpointError, match=f"{objects[1]} does not match its manifest"):
        tier.fetch(committed, ["state.llmt"], tmp_path / "c", ALLOWED)
    assert "does not match its manifest (its xxh3-128 check fails)" in tier.verify(committed, None, ALLOWED)


def test_a_compressed_piece_that_inflates_beyond_its_size_is_refused(tmp_path):
    """A forged .zst object that decompresses to far more than its piece: the reader
    stops one byte past the size, never allocating what the frame claims."""
    tier = _tier(tmp_path)
    committed, _ = save_pieces(tier, 1, {"state.llmt": bytes(PIECE)}, piece=PIECE)
    (slice_,) = committed.manifest["files"]["state.llmt"]["slices"]
    assert slice_["codec"] == "zstd"
    import zstandard
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(1 << 30))
    assert len(bomb) < slice_["size"] + (slice_["size"] >> 7)
    (tmp_path / "shared" / pieces.PIECES_DIR / pieces.object_name(slice_["ref"], "zstd")).write_bytes(bomb)
    forged = _forge(tier, committed, lambda p: p.update(stored=len(bomb)))
    with pytest.raises(CheckpointError, match="holds 1048577\\+ bytes, its reference says 1048576"):
        tier.fetch(forged, ["state.llmt"], tmp_path / "x", ALLOWED)


def test_a_symlinked_pieces_folder_is_not_followed(tmp_path):
    tier = _tier(tmp_path)
    state = os.urandom(PIECE)
    committed, _ = save_pieces(tier, 1, {"state.llmt": state}, piece=PIECE)
    shared = tmp_path / "shared"
    (shared / pieces.PIECES_DIR).rename(tmp_path / "elsewhere")
    (shared / pieces.PIECES_DIR).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="is a symlink"):
        tier.fetch(committed, ["state.llmt"], tmp_path / "x", ALLOWED)


def test_collection_leaves_names_that_are_not_pieces(tmp_path):
    tier = _tier(tmp_path, keep=1)
    save_pieces(tier, 1, {"state.llmt": os.urandom(PIECE)}, piece=PIECE)
    stranger = tmp_path / "shared" / pieces.PIECES_DIR / "README"
    stranger.write_text("not ours")
    save_pieces(tier, 2, {"state.llmt": os.urandom(PIECE)}, piece=PIECE)
    tier.retain()
    assert stranger.exists()
    assert len([o for o in tier.piece_objects() if pieces.ref_of_object(o)]) == 1


def test_plan_and_codec_decisions_are_pure(tmp_path):
    assert pieces.plan(["a" * 32 + "-5", "b" * 32 + "-5.zst", ".tmp-1", "junk"], {"a" * 32 + "-5"}) == \
        pieces.Plan(["b" * 32 + "-5.zst"], 1)
    assert not pieces.worth_compressing(os.urandom(1 << 20))
    assert pieces.worth_compressing(bytes(1 << 20))
    assert pieces.encode(os.urandom(4096)) [1] is None
    with pytest.raises(pieces.PieceRejected, match="holds 3 bytes"):
        pieces.decode(b"abc", None, 4)
    with pytest.raises(pieces.PieceRejected, match="not a valid zstd frame"):
        pieces.decode(b"not zstd at all", "zstd", 4)
    assert piecestore.held_of({"a" * 32 + "-5.zst": 3, "junk": 1}) == {"a" * 32 + "-5": ("zstd", 3)}


def test_an_empty_file_is_stored_as_no_piece_and_read_back_empty(tmp_path):
    tier = _tier(tmp_path)
    committed, sent = save_pieces(tier, 1, {"state.llmt": os.urandom(PIECE), "rng/rank-00000.llmt": b""}, piece=PIECE)
    assert committed.manifest["files"]["rng/rank-00000.llmt"] == {"size": 0, "slices": []}
    assert tier.verify(committed, None, ALLOWED) is None
    tier.fetch(committed, ["rng/rank-00000.llmt"], tmp_path / "x", ALLOWED)
    assert (tmp_path / "x" / "rng/rank-00000.llmt").read_bytes() == b""
