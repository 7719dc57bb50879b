"""``llmtrain checkpoints ls|verify|prune`` over a local run's workdir, a tier directory
and an S3 prefix (a real MinIO)."""

from __future__ import annotations

import os

import pytest
from llmtrain_operator.cli import main
from llmtrain_store.directory import DirTier
from llmtrain_store.s3 import S3Tier

from store.helpers import flip_byte, save_dir, save_shared


@pytest.fixture
def workdir(tmp_path):
    """A local run's layout: two nodes' tier 1 and the shared tier."""
    for node in (0, 1):
        tier = DirTier("local", tmp_path / f"node-{node}" / "ckpt", keep=5)
        for step in (10, 20):
            save_dir(tier, step, {"state.llmt": os.urandom(3000), f"rng/rank-{node:05d}.llmt": b"r"}, world=2, ranks={node})
    shared = DirTier("shared", tmp_path / "shared", keep=5)
    for step in (10, 20):
        save_shared(shared, step, os.urandom(3 << 20), nodes=2, piece=1 << 20)  # 3 pieces: a share each
    return tmp_path


def test_ls_shows_every_tier_its_steps_and_which_are_complete(workdir, capsys):
    assert main(["checkpoints", "ls", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert f"{workdir / 'node-0' / 'ckpt'} (local): 2 committed checkpoints" in out
    assert f"{workdir / 'shared'} (shared): 2 committed checkpoints" in out
    lines = [line.split() for line in out.splitlines() if line.strip().startswith(("10 ", "20 "))]
    assert len(lines) == 6
    assert out.count("partial (a node's share), ok") == 4 and out.count("complete, ok") == 2


def test_ls_flags_a_truncated_file_and_exits_1(workdir, capsys):
    state = workdir / "node-1" / "ckpt" / "step-00000020" / "state.llmt"
    with open(state, "r+b") as fh:
        fh.truncate(10)
    assert main(["checkpoints", "ls", str(workdir / "node-1" / "ckpt")]) == 1
    assert "BAD: state.llmt has 10 bytes, the manifest says 3000" in capsys.readouterr().out


def test_verify_hashes_every_byte_and_names_a_flipped_one(workdir, capsys):
    assert main(["checkpoints", "verify", "--no-progress", str(workdir / "shared")]) == 0
    assert capsys.readouterr().out.count("verified, every byte matches its manifest") == 2
    flip_byte(workdir / "shared" / "step-00000010" / "state.llmt.part-001-of-002")
    assert main(["checkpoints", "verify", "--no-progress", "--step", "10", str(workdir / "shared")]) == 1
    out = capsys.readouterr().out
    assert "step 10: FAILED: state.llmt.part-001-of-002 fails its xxh3-128 check" in out
    assert "step 20" not in out


def test_prune_keeps_the_newest_and_dry_run_deletes_nothing(workdir, capsys):
    target = str(workdir / "node-0" / "ckpt")
    assert main(["checkpoints", "prune", "--keep", "1", "--dry-run", target]) == 0
    assert "would delete step 10" in capsys.readouterr().out
    assert (workdir / "node-0" / "ckpt" / "step-00000010").exists()
    assert main(["checkpoints", "prune", "--keep", "1", target]) == 0
    assert "deleted step 10" in capsys.readouterr().out
    assert not (workdir / "node-0" / "ckpt" / "step-00000010").exists()
    assert main(["checkpoints", "prune", "--keep", "0", target]) == 1


def test_a_target_that_is_not_a_tier_says_so(tmp_path, capsys):
    assert main(["checkpoints", "ls", str(tmp_path / "missing")]) == 1
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["checkpoints", "ls", str(tmp_path / "empty")]) == 1
    assert "holds no checkpoints" in capsys.readouterr().err


@pytest.mark.tools  # MinIO (the minio fixture)
def test_s3_ls_verify_prune_and_a_refused_key(minio, monkeypatch, capsys):
    for key, value in minio.env().items():
        monkeypatch.setenv(key, value)
    tier = S3Tier("s3", "s3://ckpt/cli", keep=10)
    for step in (1, 2, 3):
        save_shared(tier, step, os.urandom(4000), nodes=2)
    assert main(["checkpoints", "ls", "s3://ckpt/cli"]) == 0
    assert "s3://ckpt/cli: 3 committed checkpoints" in capsys.readouterr().out
    assert main(["checkpoints", "verify", "--no-progress", "s3://ckpt/cli"]) == 0
    assert capsys.readouterr().out.count("verified") == 3
    minio.client().put_object(Bucket="ckpt", Key="cli/step-00000003/state.llmt.part-000-of-002", Body=b"x" * 2000)
    assert main(["checkpoints", "verify", "--no-progress", "--step", "3", "s3://ckpt/cli"]) == 1
    assert "FAILED: state.llmt.part-000-of-002 fails its xxh3-128 check" in capsys.readouterr().out
    assert main(["checkpoints", "prune", "--keep", "1", "s3://ckpt/cli"]) == 0
    assert "deleted step 1, step 2" in capsys.readouterr().out
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "definitely-wrong-secret-123")
    assert main(["checkpoints", "ls", "s3://ckpt/cli"]) == 1
    err = capsys.readouterr().err
    assert "cannot be read: the credentials were refused" in err and "definitely-wrong" not in err


def test_a_content_addressed_tier_shows_stored_against_logical_bytes_and_verifies_its_pieces(tmp_path, capsys):
    from llmtrain_store import pieces

    from store.helpers import save_pieces

    shared = DirTier("shared", tmp_path / "shared", keep=5, content_addressed=True)
    frozen = os.urandom(9 << 20)
    for step in (10, 20):
        save_pieces(shared, step, {"state.llmt": frozen + os.urandom(1 << 20)}, nodes=2, piece=1 << 20)
    assert main(["checkpoints", "ls", str(tmp_path / "shared")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip().startswith(("10 ", "20 "))}
    assert rows["10"][3:7] == ["10.49", "MB", "10.49", "MB"], "the first step stores all of its bytes"
    assert rows["20"][3:7] == ["10.49", "MB", "1.05", "MB"], "the second one only its changed piece"
    assert "11.53 MB stored for 20.97 MB of checkpoints (55%" in out
    victim = sorted((tmp_path / "shared" / pieces.PIECES_DIR).iterdir())[0]
    flip_byte(victim)
    assert main(["checkpoints", "verify", "--no-progress", str(tmp_path / "shared")]) == 1
    assert f"FAILED: shared tier: piece pieces/{victim.name} does not match its manifest" in capsys.readouterr().out
    assert main(["checkpoints", "prune", "--keep", "1", str(tmp_path / "shared")]) == 0
    assert len(list((tmp_path / "shared" / pieces.PIECES_DIR).iterdir())) == 10, "step 10's own piece is collected"
