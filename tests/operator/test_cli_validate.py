"""`llmtrain validate` through the installed entry point, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from support.specs import ROOT

LLMTRAIN = str(Path(sys.executable).with_name("llmtrain"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LLMTRAIN, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_every_example_validates():
    examples = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.yaml"))
    assert len(examples) >= 4
    result = run("validate", *examples)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") == len(examples)


def test_a_broken_copy_fails_and_names_the_field(tmp_path):
    source = ROOT / "examples" / "02-three-tier-checkpoints.yaml"
    docs = list(yaml.safe_load_all(source.read_text()))
    job = next(d for d in docs if d["kind"] == "LLMTrainJob")
    job["spec"]["checkpoint"]["shared"]["intervalSteps"] = 25
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(docs))

    result = run("validate", str(source), str(broken))
    assert result.returncode == 1
    assert "02-three-tier-checkpoints.yaml (three-tier): ok" in result.stdout
    assert "broken.yaml (three-tier): INVALID" in result.stderr
    assert ("spec.checkpoint.shared.intervalSteps: checkpoint.shared.intervalSteps must be a multiple of a fixed "
            "checkpoint.intervalSteps (25 % 10 != 0)") in result.stderr


def test_unreadable_and_non_yaml_files_are_reported_not_raised(tmp_path):
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("spec: [unclosed\n")
    result = run("validate", str(tmp_path / "missing.yaml"), str(garbage))
    assert result.returncode == 1
    assert "missing.yaml: cannot read: No such file or directory" in result.stderr
    assert "garbage.yaml: not valid YAML" in result.stderr
    assert "Traceback" not in result.stderr


def test_crd_command_prints_the_committed_crd():
    result = run("crd")
    assert result.returncode == 0
    assert result.stdout == (ROOT / "crds" / "llmtrain.io_llmtrainjobs.yaml").read_text()


def test_a_gpu_job_gets_its_memory_plan_and_a_cpu_job_none():
    result = run("validate", "examples/01-tiny-elastic-cpu.yaml", "examples/04-gpu-zero2.yaml")
    assert result.returncode == 0, result.stderr
    gpu_part = result.stdout.split("04-gpu-zero2.yaml")[1]
    assert "GPU memory per rank at world size 16: peak" in gpu_part
    assert "activations" in gpu_part and "logits" in gpu_part
    assert "memory per rank" not in result.stdout.split("04-gpu-zero2.yaml")[0]


def test_a_plan_that_does_not_fit_the_named_gpu_fails_with_a_change_that_fits():
    small = run("validate", "examples/04-gpu-zero2.yaml", "--gpu-memory", "4")
    assert small.returncode == 1
    assert "does NOT fit a GPU of 4 GiB" in small.stderr and "try microBatchSize: 2" in small.stderr
    large = run("validate", "examples/04-gpu-zero2.yaml", "--gpu-memory", "80")
    assert large.returncode == 0 and "fits a GPU of 80 GiB" in large.stdout


def test_a_misspelt_pod_template_field_is_refused_naming_it_and_the_field_it_meant(tmp_path):
    """podTemplate.spec, scheduling.affinity and env[].valueFrom are checked by the
    upstream Kubernetes schemas (api/coretypes.py): a typo would otherwise pass and be
    dropped, or refused only when the operator creates the pods."""
    source = ROOT / "examples" / "01-tiny-elastic-cpu.yaml"
    docs = list(yaml.safe_load_all(source.read_text()))
    job = next(d for d in docs if d["kind"] == "LLMTrainJob")
    job["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "trainer", "volumeMount": [{"name": "data", "mountPath": "/d"}]}],
                                           "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "lots"}}]}}
    job["spec"].setdefault("scheduling", {})["affinity"] = {"nodeAfinity": {}}
    job["spec"]["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": "yes"}}}]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(docs))

    result = run("validate", str(broken))
    assert result.returncode == 1, result.stdout
    err = result.stderr
    assert "spec.podTemplate.spec: " in err and "containers[0].volumeMount: unknown field (did you mean volumeMounts?)" in err, err
    assert "volumes[0].emptyDir.sizeLimit: 'lots' is not a quantity" in err, err
    assert "spec.scheduling.affinity: " in err and "nodeAfinity: unknown field (did you mean nodeAffinity?)" in err, err
    assert "secretKeyRef.optional: must be a boolean, got str" in err, err
