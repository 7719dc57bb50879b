"""A corrupt checkpoint is never loaded: restore falls back to an older step or a slower
tier; when nothing verifies, the trainer refuses to silently start over."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmtrain_contract.exitcodes import ExitCode
from support.elastic import base_config, run_job

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

CFG = base_config(maxSteps=15, checkpoint={"intervalSteps": 5})


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("damage, why", [(_flip_a_byte, "state.llmt fails its xxh3-128 check"),
                                         (_truncate, "state.llmt has")], ids=["flipped", "truncated"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_step_and_says_why(tmp_path, damage, why):
    job, codes = run_job(tmp_path, CFG)
    assert codes == [0], job.logs()
    steps = sorted(int(p.name[5:]) for p in (tmp_path / "node0" / "ckpt").glob("step-*"))
    assert len(steps) >= 2 and steps[-1] == 15, steps
    damage(tmp_path / "node0" / "ckpt" / "step-00000015" / "state.llmt")
    job2, codes = run_job(tmp_path, dict(CFG, maxSteps=17))
    assert codes == [0], job2.logs()
    # The previous step: 10, or a later one when the write of step 5 was still in flight.
    assert f"resumed from step {steps[-2]} " in job2.logs()
    assert f"step 15: not using the local tier's copy: {why}" in job2.logs(), "the log says why the newest step was not used"


def test_a_corrupt_local_copy_falls_back_to_the_shared_tier(tmp_path):
    job, codes = run_job(tmp_path, CFG, shared_tier=True)
    assert codes == [0], job.logs()
    assert (tmp_path / "shared" / "step-00000015" / "COMMITTED").exists()
    _flip_a_byte(tmp_path / "node0" / "ckpt" / "step-00000015" / "state.llmt")
    job2, codes = run_job(tmp_path, dict(CFG, maxSteps=17), shared_tier=True)
    assert codes == [0], job2.logs()
    assert "resumed from step 15 (shared tier" in job2.logs()
    assert "step 15: not using the local tier's copy" in job2.logs()
    assert "pulled step 15 from the shared tier into tier 1" in job2.logs(), "a slower tier's copy lands in tier 1 first"


def test_when_nothing_verifies_the_trainer_exits_corrupt_checkpoint_and_keeps_the_files(tmp_path):
    job, codes = run_job(tmp_path, CFG)
    assert codes == [0], job.logs()
    saved = sorted((tmp_path / "node0" / "ckpt").glob("step-*"))
    for folder in saved:
        _flip_a_byte(folder / "state.llmt")
    job2, codes = run_job(tmp_path, dict(CFG, maxSteps=20))
    assert codes == [ExitCode.CORRUPT_CHECKPOINT], job2.logs()
    assert "fails its xxh3-128 check" in job2.logs()
    assert sorted((tmp_path / "node0" / "ckpt").glob("step-*")) == saved, "nothing committed is deleted"


def test_allow_fresh_start_restarts_from_step_zero_instead(tmp_path):
    job, codes = run_job(tmp_path, CFG)
    assert codes == [0], job.logs()
    for folder in (tmp_path / "node0" / "ckpt").glob("step-*"):
        _flip_a_byte(folder / "state.llmt")
    cfg = dict(CFG, maxSteps=3, checkpoint={"intervalSteps": 5, "allowFreshStart": True})
    job2, codes = run_job(tmp_path, cfg)
    assert codes == [0], job2.logs()
    assert "starting from step 0 because checkpoint.allowFreshStart is set" in job2.logs()
    assert [r["step"] for r in job2.steps()][-3:] == [1, 2, 3]


def test_a_checkpoint_of_another_model_config_is_not_resumed(tmp_path):
    job, codes = run_job(tmp_path, CFG)
    assert codes == [0], job.logs()
    other = dict(CFG, seed=999)
    job2, codes = run_job(tmp_path, other)
    assert codes == [ExitCode.CORRUPT_CHECKPOINT], job2.logs()
    assert "was written by another config" in job2.logs()


class _Payload:
    """What a writer of the tier could plant: unpickling it runs a command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_a_forged_deepspeed_file_with_a_matching_manifest_is_refused_with_the_reason_and_runs_nothing(tmp_path):
    """The manifest's hashes guard corruption, not forgery: whoever writes the tier can
    rewrite them. DeepSpeed's files are loaded weights-only (engines/safeload.py), so a
    payload in one is refused by name before it runs, and the trainer exits
    CORRUPT_CHECKPOINT keeping the files."""
    import json

    import torch
    from llmtrain_store import manifest as mf
    from llmtrain_store.fileio import hash_file
    from llmtrain_store.tier import digest_bytes

    cfg = base_config(maxSteps=10, strategy={"kind": "deepspeed", "zeroStage": 2}, checkpoint={"intervalSteps": 5})
    job, codes = run_job(tmp_path, cfg, procs_per_node=2)
    assert codes == [0], job.logs()
    marker = tmp_path / "payload-ran"
    forged = "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    for folder in sorted((tmp_path / "node0" / "ckpt").glob("step-*")):
        torch.save({"optimizer_state_dict": _Payload(marker)}, folder / forged)
        manifest = json.loads((folder / mf.MANIFEST).read_text())
        assert forged in manifest["files"], sorted(manifest["files"])
        size, digest = hash_file(folder / forged)
        manifest["files"][forged] = {"size": size, "hash": digest}
        text = json.dumps(manifest).encode()
        (folder / mf.MANIFEST).write_bytes(text)
        (folder / mf.COMMITTED).write_text(digest_bytes(text))
    job2, codes = run_job(tmp_path, dict(cfg, maxSteps=12), procs_per_node=2)
    assert not marker.exists(), "the planted payload ran"
    assert ExitCode.CORRUPT_CHECKPOINT in codes, (codes, job2.logs()[-3000:])
    assert "refused: it holds more than tensors and DeepSpeed's own types" in job2.logs()
    assert "posix.system" in job2.logs(), "the refusal names what the file asked for"
