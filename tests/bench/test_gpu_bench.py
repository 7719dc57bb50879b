"""bench/gpu.py's own logic (the GPU runs themselves are in docs/benchmarks.md): budgets,
failures recorded section by section, the RESULT line; and the whole script on CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.specs import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu


def test_the_supported_torch_range():
    assert gpu.torch_in_range("2.11.0+cu130") and gpu.torch_in_range("2.13.0")
    assert not gpu.torch_in_range("2.10.1") and not gpu.torch_in_range("3.0.0")


def test_a_section_is_skipped_when_the_budget_is_short_and_a_failure_does_not_stop_the_next(tmp_path):
    run = gpu.Run(tmp_path, budget=10, quick=True, cpu=True)
    run.section("mfu", 60, lambda r: {"never": 1})

    def boom(r):
        raise RuntimeError("CUDA error: resource already mapped")

    run.section("resume", 0, boom)
    run.section("env", 0, lambda r: {"torch": "x"})
    saved = json.loads((tmp_path / "gpu.json").read_text())
    assert "skipped" in saved["mfu"] and "needs 60s" in saved["mfu"]["skipped"]
    assert saved["resume"]["error"] == "RuntimeError: CUDA error: resource already mapped"
    assert "Traceback" in saved["resume"]["traceback"]
    assert saved["env"]["torch"] == "x"
    assert gpu.summary(saved)["failed_sections"] == "resume"


def test_the_summary_carries_each_sections_headline():
    figures = {
        "resume": {"all_ok": True},
        "first_step": {"no_compilation": True, "ddp": {"first_step_seconds": 13.7}, "deepspeed-zero1": {"first_step_seconds": 19.3}},
        "mfu": {"worst_ratio": 0.9011},
        "memory": {"worst_abs_error": 0.0581},
        "checkpoint": {"gpt-1.3b": {"stall_reduction": 97.4, "stall_vs_dcp": 0.017}},
    }
    out = gpu.summary(figures)
    assert out == {"resume_exact": 1, "no_compilation": 1, "first_step_worst_s": 19.3, "mfu_ratio_worst": 0.901,
                   "memplan_worst_error": 0.058, "stall_reduction_gpt-1.3b": 97.4, "stall_vs_dcp_gpt-1.3b": 0.017,
                   "failed_sections": "none"}


def test_a_failure_deep_in_a_section_marks_the_section_failed():
    figures = {"checkpoint": {"disk": "/var/tmp", "gpt2-124m": {"error": "AcceleratorError: ..."}},
               "memory": {"rows": [{"row": "a", "relative_error": 0.01}, {"row": "b", "failed": "OOM"}]},
               "resume": {"ddp-nccl": {"ok": True}, "zero3": {"ok": False}, "all_ok": False}, "mfu": {"worst_ratio": 0.95}}
    assert gpu.summary(figures)["failed_sections"] == "checkpoint,memory,resume"
    assert gpu.summary({"memory": {"rows": [{"row": "a", "relative_error": 0.01}]}})["failed_sections"] == "none"


def test_an_unknown_section_is_refused():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--only", "mfu,warp"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "unknown sections ['warp']" in out.stderr


@pytest.mark.slow
def test_the_script_runs_on_cpu_and_ends_with_its_result_line(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--cpu", "--only", "env,mfu,checkpoint,memory",
                          "--budget", "300", "--out", str(tmp_path)], capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ") and "failed_sections=none" in last, last
    figures = json.loads((tmp_path / "gpu.json").read_text())
    assert figures["mfu"]["tiny"]["ratio"] > 0.5  # the trainer's step against a bare loop's, same model
    row = figures["checkpoint"]["tiny"]
    assert row["state_bytes"] > 0 and len(row["ours"]["pairs"]) == 2 and row["sync_save_s"]
    assert "no GPU" in figures["memory"]["skipped"]
