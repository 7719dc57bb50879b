"""Preemptive caching (``prefetch.py``): at pod start, the job's newest checkpoint is
pulled from a job-wide tier into an empty tier 1, verified; it never replaces or races a
rank's own pull of the same step."""

from __future__ import annotations

import os
import threading
import time

from llmtrain_contract.config import TrainerConfig
from llmtrain_store import manifest as mf
from llmtrain_store.directory import DirTier

from llmtrain_store import prefetching

from llmtrain_trainer.launch import prefetch
from store.helpers import save_pieces


def _cfg(tmp_path) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "runDir": str(tmp_path / "run"), "checkpoint": {"tiers": [
            {"name": "local", "uri": str(tmp_path / "tier1")}, {"name": "shared", "uri": str(tmp_path / "shared")}]},
    })


def _tiers(tmp_path):
    return [DirTier("local", tmp_path / "tier1"), DirTier("shared", tmp_path / "shared", content_addressed=True)]


def _shared_step(tmp_path, cfg, step: int, state: bytes) -> None:
    shared = DirTier("shared", tmp_path / "shared", content_addressed=True)
    rng = {f"rng/rank-{r:05d}.llmt": os.urandom(100) for r in range(2)}
    save_pieces(shared, step, {"state.llmt": state, **rng}, nodes=2, piece=1 << 20)
    # The helper's meta names another config: stamp this config's hash on the copy.
    folder = shared.final(step)
    import json

    from llmtrain_store.tier import digest_bytes
    man = json.loads((folder / mf.MANIFEST).read_text())
    man["config_hash"] = cfg.config_hash()
    text = json.dumps(man).encode()
    (folder / mf.MANIFEST).write_bytes(text)
    (folder / mf.COMMITTED).write_text(digest_bytes(text) + "\n")


def test_an_empty_tier_1_gets_the_newest_step_every_file_verified(tmp_path):
    cfg = _cfg(tmp_path)
    state = os.urandom(3 << 20)
    _shared_step(tmp_path, cfg, 10, os.urandom(3 << 20))
    _shared_step(tmp_path, cfg, 20, state)
    said = prefetch.run(cfg, _tiers(tmp_path))
    assert said.startswith("prefetched step 20 from the shared tier into tier 1"), said
    local = DirTier("local", tmp_path / "tier1")
    (copy,) = local.list()
    assert copy.step == 20 and copy.complete and copy.manifest["format"] == mf.FORMAT_VERSION
    assert (tmp_path / "tier1" / mf.step_dir(20) / "state.llmt").read_bytes() == state
    assert local.verify(copy, None, mf.ENGINE_FILES["ddp"]) is None
    assert not list((tmp_path / "tier1").glob(prefetching.MARK + "*")), "the mark goes when the prefetch ends"
    assert "holds the newest checkpoint already" in prefetch.run(cfg, _tiers(tmp_path))


def test_a_step_of_another_config_or_an_older_one_is_not_pulled(tmp_path):
    cfg = _cfg(tmp_path)
    _shared_step(tmp_path, cfg, 10, os.urandom(1 << 20))
    other = TrainerConfig.model_validate({**cfg.model_dump(by_alias=True), "seed": 99})
    assert "there is none" in prefetch.run(other, _tiers(tmp_path))
    local = DirTier("local", tmp_path / "tier1")
    assert local.list() == []


def test_a_corrupt_piece_fails_the_prefetch_and_leaves_nothing_committed(tmp_path):
    cfg = _cfg(tmp_path)
    _shared_step(tmp_path, cfg, 10, os.urandom(2 << 20))
    victim = sorted((tmp_path / "shared" / "pieces").iterdir())[0]
    data = bytearray(victim.read_bytes())
    data[5] ^= 0xFF
    victim.write_bytes(bytes(data))
    said = prefetch.run(cfg, _tiers(tmp_path))
    assert said.startswith("prefetch of step 10 from the shared tier failed") and "the restore pulls on demand" in said, said
    assert DirTier("local", tmp_path / "tier1").list() == []
    assert not list((tmp_path / "tier1").glob(mf.STAGING_PREFIX + "*")), "its staging folder is removed"


def test_a_rank_that_pulls_the_same_step_waits_for_the_prefetch_and_takes_its_copy(tmp_path):
    local = DirTier("local", tmp_path / "tier1")
    (tmp_path / "tier1").mkdir()
    mark = prefetching.mark(local)  # a prefetch runs

    def finish() -> None:
        time.sleep(0.4)
        staging = local.staging(10)
        (staging / "state.llmt").write_bytes(b"x")
        local.write_part(10, 0, {"files": {"state.llmt": {"size": 1, "hash": "h"}}})
        local.commit(10, {"world_size": 1}, {0}, {0}, 5)
        mark.unlink()

    thread = threading.Thread(target=finish)
    thread.start()
    began = time.monotonic()
    assert prefetching.wait_for(local, 10, timeout=10)
    thread.join()
    assert 0.3 < time.monotonic() - began < 5


def test_a_dead_prefetchs_mark_is_not_waited_for(tmp_path):
    local = DirTier("local", tmp_path / "tier1")
    (tmp_path / "tier1").mkdir()
    prefetching.marker(local).write_text("999999999")
    began = time.monotonic()
    assert not prefetching.wait_for(local, 10, timeout=10)
    assert time.monotonic() - began < 1


def test_commit_unless_present_never_replaces_a_committed_copy(tmp_path):
    local = DirTier("local", tmp_path / "tier1")
    for content in (b"first", b"second"):
        (local.staging(10) / "state.llmt").write_bytes(content)
        local.write_part(10, 0, {"files": {"state.llmt": {"size": len(content), "hash": content.decode()}}})
        placed = local.commit_unless_present(10, {"world_size": 1}, {0}, {0}, 5)
        assert (placed is None) == (content == b"second")
    assert (local.final(10) / "state.llmt").read_bytes() == b"first"
    assert not list((tmp_path / "tier1").glob(mf.STAGING_PREFIX + "*")), "the losing copy is dropped"


def test_the_config_is_found_in_the_torchrun_command():
    assert prefetch.config_of(["python", "-m", "torch.distributed.run", "--nnodes=2", "-m", "llmtrain_trainer",
                               "--config", "/etc/llmtrain/trainer.yaml"]) == "/etc/llmtrain/trainer.yaml"
    assert prefetch.config_of(["torchrun", "-m", "llmtrain_trainer", "--config=/c.yaml"]) == "/c.yaml"
    assert prefetch.config_of(["torchrun", "train.py", "--config", "/c.yaml"]) is None, "a user's script: no prefetch"


def test_the_launcher_marks_tier_1_before_it_returns_and_the_mark_goes_when_the_prefetch_ends(tmp_path, monkeypatch):
    """The ranks start after ``start`` returns: the mark must already be there, or a rank
    that looks early pulls the same step beside the prefetch (seen on a loaded machine)."""
    import yaml

    cfg = _cfg(tmp_path)
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True)))
    listed = threading.Event()
    monkeypatch.setattr(prefetch, "newest", lambda cfg, tiers: (listed.wait(10), None)[1])
    handle = prefetch.start(["python", "-m", "llmtrain_trainer", "--config", str(path)])
    assert handle is not None
    local = DirTier("local", tmp_path / "tier1")
    assert prefetching.marker(local).exists(), "marked before start returned"
    listed.set()
    handle.thread.join(10)
    assert not prefetching.marker(local).exists()
    assert "holds the newest checkpoint already" in handle.outcome
