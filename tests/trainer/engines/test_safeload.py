"""DeepSpeed's files read weights-only: tensors, containers and DeepSpeed's own types load;
a file naming anything else is refused by name, and nothing runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from llmtrain_trainer.engines import safeload


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_deepspeeds_own_state_loads_and_a_payload_is_refused(tmp_path):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    good = tmp_path / "optim.pt"
    torch.save({"loss_scaler": LossScaler(1.0), "zero_stage": ZeroStageEnum.gradients, "state": {0: torch.ones(3)}}, good)
    bad = tmp_path / "forged.pt"
    marker = tmp_path / "ran"
    torch.save({"optimizer_state_dict": _Payload(marker)}, bad)
    original = torch.load
    with safeload.weights_only():
        loaded = torch.load(good, map_location="cpu", weights_only=False)  # as DeepSpeed asks: made weights-only
        assert torch.equal(loaded["state"][0], torch.ones(3)) and loaded["zero_stage"] == ZeroStageEnum.gradients
        with pytest.raises(safeload.UnsafeCheckpoint, match="forged.pt: refused.*posix.system"):
            torch.load(bad, map_location="cpu", weights_only=False)
    assert torch.load is original, "the patch ends with the restore"
    assert not marker.exists()


def test_the_converter_wrapper_runs_a_module_under_the_rule(tmp_path):
    bad = tmp_path / "forged.pt"
    marker = tmp_path / "ran"
    torch.save(_Payload(marker), bad)
    (tmp_path / "runpy_target.py").write_text(f"import torch\ntorch.load({str(bad)!r}, weights_only=False)\n")
    out = subprocess.run([sys.executable, "-m", "llmtrain_trainer.engines.safeload", "runpy_target"],
                         cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == safeload.REFUSED and "refused" in out.stderr and "posix.system" in out.stderr, out.stderr[-2000:]
    assert not marker.exists()
    assert subprocess.run([sys.executable, "-m", "llmtrain_trainer.engines.safeload"], capture_output=True).returncode == 64
