"""The checkpoint API for a user's script (``llmtrain_trainer.checkpoints``), one rank
without a process group: the built-in trainer's tiers for any state dict, restored
verified, from a slower tier when the node's disk is new, never executing a forged file.
Two ranks under a real torchrun: ``tests/trainer/runs/test_script_checkpoints.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from llmtrain_contract.config import CheckpointTierConfig
from llmtrain_trainer import checkpoints
from llmtrain_trainer.checkpoint.restore import NoLoadableCheckpoint


def tiers(root: Path, shared: bool = True) -> list[CheckpointTierConfig]:
    out = [CheckpointTierConfig(name="local", uri=str(root / "local"), keep=2)]
    if shared:
        out.append(CheckpointTierConfig(name="shared", uri=str(root / "shared"), keep=3))
    return out


def store(root: Path, shared: bool = True, compat: str = "", allow_fresh_start: bool = False) -> checkpoints.ScriptCheckpoints:
    return checkpoints.ScriptCheckpoints(tiers(root, shared), checkpoints.dist_info(), False, compat, allow_fresh_start,
                                         timeout=30)


def state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "data": {"epoch": 2, "offset": seed}}


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def committed_steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*") if (p / "manifest.json").exists())


def test_a_fresh_start_then_the_newest_step_restored_with_its_random_state(tmp_path):
    first = store(tmp_path)
    assert first.restore() == (0, None)
    first.save(5, state(5))
    first.save(10, state(10), sync=True)
    after_save = torch.rand(3)  # what the next draw was when step 10 was saved
    first.close()
    assert committed_steps(tmp_path / "local") == [5, 10] and 10 in committed_steps(tmp_path / "shared")
    torch.manual_seed(1234)
    again = store(tmp_path)
    step, restored = again.restore()
    drawn = torch.rand(3)
    assert step == 10 and same(restored, state(10))
    assert torch.equal(drawn, after_save), "the rank's RNG state came back with the step"
    again.close()


def test_a_new_nodes_empty_disk_restores_from_the_shared_tier_and_a_corrupt_copy_is_passed_over(tmp_path):
    first = store(tmp_path)
    first.restore()
    first.save(3, state(3), sync=True)
    first.save(6, state(6), sync=True)
    first.close()
    for path in (tmp_path / "local").iterdir():  # the replacement node's disk
        if path.is_dir():
            for item in sorted(path.rglob("*"), reverse=True):
                item.unlink() if item.is_file() else item.rmdir()
            path.rmdir()
    step, restored = store(tmp_path).restore()
    assert step == 6 and same(restored, state(6))
    # A flipped byte in the node's copy of step 6: the shared tier's copy serves instead.
    flip(next((tmp_path / "local").glob("step-*6/script-state.pt")))
    step, restored = store(tmp_path).restore()
    assert step == 6 and same(restored, state(6))
    # Both copies of step 6 bad (the shared tier's state piece too): step 3.
    flip(next((tmp_path / "local").glob("step-*6/script-state.pt")))
    stored = json.loads(next((tmp_path / "shared").glob("step-*6/manifest.json")).read_text())
    flip(tmp_path / "shared" / "pieces" / (stored["files"]["script-state.pt"]["slices"][0]["ref"] + ".zst"))
    step, restored = store(tmp_path).restore()
    assert step == 3 and same(restored, state(3))


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


class Planted:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_forged_state_that_verifies_is_refused_by_name_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    first = store(tmp_path, shared=False)
    first.restore()
    first._checked = True  # a forger writes the file and its manifest himself: the save's own check is not there
    first.save(4, {"payload": Planted(marker)}, sync=True)  # written through the store, so its hashes match
    first.close()
    assert not marker.exists()
    with pytest.raises(checkpoints.UnusableCheckpoint, match="step 4: the state verifies against its manifest but does not load"):
        store(tmp_path, shared=False).restore()
    assert not marker.exists(), "the pickle's code ran"


def test_a_step_saved_under_another_compat_is_never_restored(tmp_path):
    first = store(tmp_path, shared=False, compat="gpt-124m")
    first.restore()
    first.save(2, state(2), sync=True)
    first.close()
    with pytest.raises(NoLoadableCheckpoint, match="written by another config"):
        store(tmp_path, shared=False, compat="gpt-350m").restore()
    assert store(tmp_path, shared=False, compat="gpt-350m", allow_fresh_start=True).restore() == (0, None)


def test_save_before_restore_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="restore\\(\\) first"):
        store(tmp_path).save(1, {})


def test_the_tiers_come_from_the_operators_variable_or_the_local_folder_and_a_bad_value_names_it(tmp_path):
    wire = [{"name": "local", "uri": str(tmp_path), "keep": 2}, {"name": "s3", "uri": "s3://b/p", "keep": 4, "intervalSteps": 50,
                                                                "endpoint": "http://minio:9000"}]
    found = checkpoints.tiers_from_env({"LLMTRAIN_CHECKPOINT_TIERS": json.dumps(wire)})
    assert [(t.name, t.keep, t.interval_steps) for t in found] == [("local", 2, 0), ("s3", 4, 50)]
    assert [t.name for t in checkpoints.tiers_from_env({"LLMTRAIN_CHECKPOINT_DIR": str(tmp_path)})] == ["local"]
    for bad in ("{", "[]", '[{"name": "nfs", "uri": "/x"}]'):
        with pytest.raises(ValueError, match="LLMTRAIN_CHECKPOINT_TIERS"):
            checkpoints.tiers_from_env({"LLMTRAIN_CHECKPOINT_TIERS": bad})
    with pytest.raises(ValueError, match="checkpoint.enabled"):
        checkpoints.tiers_from_env({})


def test_a_final_save_of_the_step_saved_last_gives_it_to_the_tiers_that_skipped_it_and_writes_it_once(tmp_path):
    layout = [CheckpointTierConfig(name="local", uri=str(tmp_path / "local")),
              CheckpointTierConfig(name="shared", uri=str(tmp_path / "shared"), interval_steps=10)]
    first = checkpoints.ScriptCheckpoints(layout, checkpoints.dist_info(), False, "", False, timeout=30)
    first.restore()
    first.save(8, state(8))  # the loop's last periodic save: the shared tier's first is due at step 10
    first.wait()
    written = json.loads(next((tmp_path / "local").glob("step-*8/manifest.json")).read_text())["time"]
    first.save(8, state(8), sync=True)
    assert committed_steps(tmp_path / "shared") == [8]
    again = json.loads(next((tmp_path / "local").glob("step-*8/manifest.json")).read_text())["time"]
    assert again == written, "tier 1 committed the step a second time"
    with pytest.raises(ValueError, match="step 7 is older than the last saved step 8"):
        first.save(7, state(7))
    first.close()
    assert committed_steps(tmp_path / "local") == [8]


def test_a_sharded_state_is_a_file_a_rank_and_the_layout_is_part_of_what_must_match(tmp_path):
    layout = tiers(tmp_path, shared=False)
    sharded = checkpoints.ScriptCheckpoints(layout, checkpoints.dist_info(), True, "", False, timeout=30)
    sharded.restore()
    sharded.save(3, state(3), sync=True)
    sharded.close()
    assert [p.name for p in (tmp_path / "local").glob("step-*3/script-*")] == ["script-rank-00000.pt"]
    step, restored = checkpoints.ScriptCheckpoints(layout, checkpoints.dist_info(), True, "", False, timeout=30).restore()
    assert step == 3 and same(restored, state(3))
    with pytest.raises(NoLoadableCheckpoint, match="written by another config"):
        store(tmp_path, shared=False).restore()  # replicated: no such file


def test_a_state_a_weights_only_restore_would_refuse_is_refused_at_the_first_save_naming_the_type(tmp_path):
    import numpy as np

    first = store(tmp_path, shared=False)
    first.restore()
    with pytest.raises(checkpoints.CheckpointRefused, match="step 1 not saved: rank 0: the state holds numpy"):
        first.save(1, {"loss": np.float64(1.5), "rng": np.random.get_state()})
    first.save(1, {"loss": 1.5, "weights": torch.ones(2)}, sync=True)  # the store goes on
    first.close()
    assert committed_steps(tmp_path / "local") == [1]


def test_close_finishes_the_slower_tiers(tmp_path):
    first = store(tmp_path)
    first.restore()
    first.save(1, state(1))
    first.close()
    assert committed_steps(tmp_path / "shared") == [1]


def test_open_without_the_process_group_of_a_multi_rank_job_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LLMTRAIN_CHECKPOINT_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="init_process_group\\(\\) first"):
        checkpoints.open()
