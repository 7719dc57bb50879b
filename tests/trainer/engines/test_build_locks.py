"""A killed JIT build's lock (torch waits for it forever) is removed before DeepSpeed loads
its ops; a fresh lock, or one whose folder a build works in, stays."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from llmtrain_trainer.engines import build_locks


def _lock(root, op: str, age: float):
    folder = root / "py311_cpu" / op
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.write_text("")
    then = time.time() - age
    os.utime(lock, (then, then))
    return lock


def test_only_an_old_lock_with_no_build_working_in_its_folder_is_removed(tmp_path, caplog):
    stale = _lock(tmp_path, "deepspeed_shm_comm", age=3600)
    fresh = _lock(tmp_path, "fused_adam", age=5)
    building = _lock(tmp_path, "cpu_adam", age=3600)
    compiler = subprocess.Popen(["sleep", "30"], cwd=building.parent)  # as ninja works in its build folder
    try:
        assert build_locks.clear_stale(tmp_path) == [stale]
    finally:
        compiler.kill()
        compiler.wait()
    assert not stale.exists() and fresh.exists() and building.exists()
    assert "removed a stale build lock" in caplog.text and "deepspeed_shm_comm" in caplog.text
    assert build_locks.clear_stale(tmp_path / "absent") == []


def test_the_build_root_is_torchs(monkeypatch, tmp_path):
    from torch.utils.cpp_extension import _get_build_directory

    from torch.utils.cpp_extension import get_default_build_root

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert build_locks.build_root() == tmp_path
    op = Path(_get_build_directory("op", verbose=False))
    assert op.parent == tmp_path, "torch builds in <TORCH_EXTENSIONS_DIR>/<op>"
    (op / "lock").write_text("")
    os.utime(op / "lock", (0, 0))
    assert build_locks.clear_stale(tmp_path) == [op / "lock"], "that layout is searched too"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert build_locks.build_root() == Path(get_default_build_root())
