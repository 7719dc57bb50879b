"""Hostile and broken manifests are rejected with the reason, before a byte is read; the
archive format refuses what does not describe itself consistently."""

from __future__ import annotations

import json
import struct

import pytest
from llmtrain_store import archive
from llmtrain_store import manifest as mf
from llmtrain_store.manifest import ENGINE_FILES
from llmtrain_store.fileio import FileWriter, PieceHasher, allocate, hash_file
from llmtrain_store.directory import DirTier

from llmtrain_store.tier import digest_bytes

from store.helpers import ALLOWED, save_dir


def _manifest(files):
    return {"format": mf.FORMAT_VERSION, "step": 1, "world_size": 1, "ranks": [0], "files": files}


@pytest.mark.parametrize("name, why", [
    ("../../../../../../../../etc/passwd", "leaves the checkpoint folder"),
    ("/etc/hostname", "is an absolute path"),
    ("rng/../state.llmt", "leaves the checkpoint folder"),
    ("rng\\rank-00000.llmt", "forbidden character"),
    ("state.pt", "is not a file this engine writes"),
    ("rng/rank-0.llmt", "is not a file this engine writes"),
    ("./state.llmt", "not a plain relative name"),
])
def test_a_name_outside_what_the_engine_writes_is_rejected_with_the_reason(name, why):
    with pytest.raises(mf.ManifestRejected, match=why.replace("(", r"\(")):
        mf.entries(_manifest({name: {"size": 1, "hash": "x"}}), ALLOWED)


def test_slices_must_tile_the_file_and_belong_to_it():
    good = {"size": 8, "slices": [{"name": "state.llmt.part-000-of-002", "offset": 0, "size": 4, "hash": "a", "at": 0},
                                  {"name": "state.llmt.part-001-of-002", "offset": 4, "size": 4, "hash": "b", "at": 0}]}
    assert mf.entries(_manifest({"state.llmt": good}), ALLOWED)["state.llmt"].sliced
    gap = json.loads(json.dumps(good))
    gap["slices"][1]["offset"] = 5
    with pytest.raises(mf.ManifestRejected, match="does not continue at byte 4"):
        mf.entries(_manifest({"state.llmt": gap}), ALLOWED)
    short = dict(good, size=9)
    with pytest.raises(mf.ManifestRejected, match="its pieces hold 8 bytes, the file has 9"):
        mf.entries(_manifest({"state.llmt": short}), ALLOWED)
    foreign = json.loads(json.dumps(good))
    foreign["slices"][0]["name"] = "rng/rank-00000.llmt"
    with pytest.raises(mf.ManifestRejected, match="is not one of its slices"):
        mf.entries(_manifest({"state.llmt": foreign}), ALLOWED)


def test_a_manifest_of_another_format_or_without_files_is_rejected():
    with pytest.raises(mf.ManifestRejected, match="this trainer reads format"):
        mf.entries({"format": 1, "files": {"state.llmt": {"size": 1, "hash": "x"}}}, ALLOWED)
    with pytest.raises(mf.ManifestRejected, match="lists no files"):
        mf.entries(_manifest({}), ALLOWED)
    with pytest.raises(mf.ManifestRejected, match="no valid size"):
        mf.entries(_manifest({"state.llmt": {"size": "1", "hash": "x"}}), ALLOWED)


def test_inside_refuses_a_symlink_on_the_way_and_an_escape(tmp_path):
    folder = tmp_path / "step"
    (folder / "rng").mkdir(parents=True)
    (tmp_path / "secret").write_text("s")
    (folder / "state.llmt").symlink_to(tmp_path / "secret")
    with pytest.raises(mf.ManifestRejected, match="is a symlink"):
        mf.inside(folder, "state.llmt")
    (folder / "rng2").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(mf.ManifestRejected, match="is a symlink"):
        mf.inside(folder, "rng2/secret")


def test_a_recommitted_manifest_naming_a_system_file_is_not_a_candidate(tmp_path):
    """The attack of the issue: a manifest listing ../../etc/passwd with its true size and
    hash, recommitted so that COMMITTED matches: verification names the reason."""
    tier = DirTier("local", tmp_path / "ckpt")
    committed = save_dir(tier, 10, {"state.llmt": b"s" * 100, "rng/rank-00000.llmt": b"r"})
    folder = tier.final(10)
    target = "../" * 12 + "etc/passwd"
    size, digest = hash_file(folder / target)
    manifest = dict(committed.manifest)
    manifest["files"] = {**manifest["files"], target: {"size": size, "hash": digest}}
    text = json.dumps(manifest).encode()
    (folder / mf.MANIFEST).write_bytes(text)
    (folder / mf.COMMITTED).write_text(digest_bytes(text))
    listed = tier.list()[0]
    assert listed.step == 10, "COMMITTED matches: only the names' check stands in the way"
    why = tier.verify(listed, None, ALLOWED)
    assert why is not None and "leaves the checkpoint folder" in why


def test_the_archive_header_is_checked_against_the_file(tmp_path):
    entries = archive.layout([("a", "float32", (3,), 12), ("b", "uint8", (5000,), 5000)])
    header = archive.encode_header({"k": 1}, entries)
    assert len(header) % archive.ALIGN == 0
    size = len(header) + archive.payload_size(entries)
    decoded = archive.decode_header(header, file_size=size)
    assert decoded.meta == {"k": 1} and decoded.entry("b").offset == archive.ALIGN
    with pytest.raises(archive.ArchiveError, match="the header describes"):
        archive.decode_header(header, file_size=size - 1)
    with pytest.raises(archive.ArchiveError, match="bad magic"):
        archive.decode_header(b"PK\x03\x04" + header[4:])
    body = json.loads(header[16:].rstrip(b"\0"))
    body["tensors"][0]["offset"] = 1 << 40
    forged = json.dumps(body).encode()
    with pytest.raises(archive.ArchiveError, match="lies outside the payload"):
        archive.decode_header(archive.MAGIC + struct.pack("<Q", len(forged)) + forged)


def test_the_payload_starts_at_the_same_offset_whatever_the_metadata_says():
    """A step count gaining digits must not shift the payload (and with it every piece a
    content-addressed tier holds already); metadata beyond the room kept for it still fits."""
    entries = archive.layout([(f"param/t{i}", "float32", (64,), 256) for i in range(200)])
    sizes = {len(archive.encode_header({"steps": steps, "lr": 0.1}, entries)) for steps in (9, 10, 99_999, 10**12)}
    assert len(sizes) == 1, sizes
    big = archive.encode_header({"note": "x" * (archive.META_ROOM + 8192)}, entries)
    assert len(big) > sizes.pop()
    assert archive.decode_header(big).meta["note"] == "x" * (archive.META_ROOM + 8192)


def test_a_file_is_hashed_in_pieces_as_it_is_written_direct_or_buffered(tmp_path):
    data = bytes(range(256)) * 4096 * 3  # 3 MiB, not a multiple of the piece
    piece = 1 << 20
    for direct in (True, False):
        writer = FileWriter(tmp_path / f"f{direct}", piece, direct=direct)
        memory = allocate(len(data))  # direct I/O needs page-aligned memory
        memory[: len(data)] = data
        writer.write(memoryview(memory)[: len(data)], aligned_memory=True)
        pieces = writer.close()
        assert [(o, n) for o, n, _ in pieces] == [(0, piece), (piece, piece), (2 * piece, len(data) - 2 * piece)]
        for offset, size, digest in pieces:
            assert hash_file(tmp_path / f"f{direct}", offset, size) == (size, digest)
    hasher = PieceHasher(piece)
    for start in range(0, len(data), 1000):  # fed in odd chunks: the same pieces
        hasher.update(data[start:start + 1000])
    assert hasher.finish() == pieces


@pytest.mark.parametrize("name", [
    "ds/mp_rank_00_model_states.pt",                          # ZeRO 0-2: rank 0's model states
    "ds/zero_pp_rank_1_mp_rank_00_model_states.pt",           # ZeRO-3: every rank's own (seen on an H200)
    "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt",           # fp32
    "ds/bf16_zero_pp_rank_7_mp_rank_00_optim_states.pt",      # bf16 (seen on an H200)
    "ds/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt.part-001-of-004",
    "rng/rank-00003.llmt",
])
def test_every_file_deepspeed_writes_at_each_stage_and_precision_is_allowed(name):
    assert ENGINE_FILES["deepspeed"].fullmatch(name)


@pytest.mark.parametrize("name", [
    "ds/../../etc/passwd", "ds/evil.py", "ds/fp16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "ds/zero_pp_rank_x_mp_rank_00_model_states.pt", "state.llmt", "ds/mp_rank_01_model_states.pt",
])
def test_a_name_deepspeed_never_writes_is_refused(name):
    assert not ENGINE_FILES["deepspeed"].fullmatch(name)


@pytest.mark.parametrize("total, piece", [
    (1000, 4 << 20),  # a file under the smallest piece is one piece
    (70 << 20, 4 << 20),  # a fine-tune's small state: 18 pieces, not 70 (one request each from S3)
    (600 << 20, 600 << 20 >> 6),  # 1/64 of a file between 256 MiB and 4 GiB
    (600 * 10**6, -(-(600 * 10**6) // 64 // 4096) * 4096),  # rounded up to 4 KiB (direct I/O)
    (16 << 30, 64 << 20),  # never more than 64 MiB, what a reader holds in memory
])
def test_pieces_are_a_64th_of_a_file_between_4_and_64_mib_on_4_kib_boundaries(total, piece):
    size = mf.piece_size(total)
    assert size == piece
    assert size % 4096 == 0 and mf.PIECE_MIN <= size <= mf.PIECE
