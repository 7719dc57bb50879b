"""The built images, run by a real container runtime (`make test-images`; needs root:
hack/images/build.sh starts Debian's dockerd when none runs and builds both images).

What only a runtime shows: the images' user and file ownership, a read-only root with
only the volumes the pods mount writable, no capabilities, no network, and the trainer
image's own entry points (launcher -> torchrun -> rank) training to its checkpoints."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.specs import ROOT

pytestmark = pytest.mark.images

DOCKER = "/usr/bin/docker"
VERSION = next(line.split(":", 1)[1].strip().strip('"') for line in (ROOT / "charts/llmtrain-operator/Chart.yaml").read_text().splitlines()
               if line.startswith("appVersion:"))
OPERATOR = f"ghcr.io/llmtrain/operator:{VERSION}"
TRAINER = f"ghcr.io/llmtrain/trainer:{VERSION}"
# What the operator's pods ask of the runtime (operator/llmtrain_operator/api/pods): uid
# 65532, a read-only root, no capabilities, no privilege escalation; /tmp a volume.
HARDENED = ["--user", "65532:65532", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--tmpfs", "/tmp:rw,exec,size=512m"]


@pytest.fixture(scope="module", autouse=True)
def images() -> None:
    result = subprocess.run(["bash", "hack/images/build.sh"], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-3000:]


def run(image: str, *args: str, flags: list[str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, "run", "--rm", "--network", "none", *(flags or []), image, *args],
                          capture_output=True, text=True, timeout=timeout)


def inspect(image: str) -> dict:
    return json.loads(subprocess.run([DOCKER, "image", "inspect", image], capture_output=True, text=True, check=True).stdout)[0]


@pytest.mark.parametrize("image", [OPERATOR, TRAINER])
def test_each_image_runs_as_uid_65532_which_cannot_change_the_system_or_the_venv(image):
    assert inspect(image)["Config"]["User"] == "65532:65532"
    probe = "import os; print(os.getuid()); [print(p, os.access(p, os.W_OK)) for p in ('/usr', '/opt/venv', '/opt/venv/lib', '/etc')]"
    result = run(image, "-c", probe, flags=["--entrypoint", "python"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "65532"
    assert all(line.endswith("False") for line in lines[1:] if line), result.stdout


@pytest.mark.parametrize("image", [OPERATOR, TRAINER])
def test_the_images_user_is_in_the_password_database(image):
    """kopf's peering names its identity from getpass.getuser(): with no entry for the uid
    it raises KeyError and the operator crash-loops (what the first real kubelet showed)."""
    probe = "import getpass; from kopf._core.engines import peering; print(getpass.getuser(), peering.detect_own_id(manual=False))"
    if image == TRAINER:
        probe = "import getpass, os, pwd; print(getpass.getuser(), pwd.getpwuid(os.getuid()).pw_dir)"
    result = run(image, "-c", probe, flags=["--entrypoint", "python", *HARDENED])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "llmtrain", result.stdout


def test_the_operator_image_has_no_torch_and_its_entry_point_runs():
    result = run(OPERATOR, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)", flags=["--entrypoint", "python"])
    assert result.stdout.strip() == "True", result.stderr
    result = run(OPERATOR, "--help", flags=["--entrypoint", "kopf", *HARDENED])
    assert result.returncode == 0 and "run" in result.stdout, result.stderr
    result = run(OPERATOR, "-c", "import llmtrain_operator.handlers", flags=["--entrypoint", "python", *HARDENED])
    assert result.returncode == 0, result.stderr


def test_the_trainer_images_entry_point_is_the_launcher_which_prints_its_usage_read_only():
    result = run(TRAINER, "--help", flags=HARDENED)
    assert result.returncode == 64, result  # EX_USAGE: the launcher needs `-- torchrun ...`
    assert "usage: python -m llmtrain_trainer.launch.launcher" in result.stderr and "--run-dir" in result.stderr


def test_a_trainer_job_trains_and_checkpoints_in_the_image_under_a_hardened_runtime(tmp_path: Path):
    """The store and one node (launcher -> torchrun -> one rank, the fork server on), as
    the operator's pods run them, in one container: uid 65532, read-only root, no
    capabilities, no network but loopback; the run dir and tier 1 on a volume."""
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    config = {
        "jobName": "image", "maxSteps": 6, "globalBatchSize": 4, "microBatchSize": 2, "logIntervalSteps": 1,
        "data": {"seqLen": 16, "vocabSize": 128}, "model": {"preset": "tiny"},
        "optimizer": {"lr": 0.002, "warmupSteps": 1},
        "checkpoint": {"intervalSteps": 3, "tiers": [{"name": "local", "uri": "/work/ckpt", "keep": 2}]},
        "faultTolerance": {"hangTimeoutSeconds": 60, "collectiveTimeoutSeconds": 30},
        "metrics": {"port": 0, "host": "127.0.0.1"}, "runDir": "/work/run",
    }
    (work / "config.json").write_text(json.dumps(config))
    driver = textwrap.dedent("""
        import subprocess, sys
        from llmtrain_contract.command import store_command, torchrun_args, trainer_program, worker_command
        py = sys.executable
        store = subprocess.Popen(store_command(py, 29400, "127.0.0.1"))
        flags = torchrun_args(nnodes_min=1, nnodes_max=1, nproc_per_node=1, rdzv_endpoint="127.0.0.1:29400",
                              rdzv_id="image", max_restarts=0, join_timeout_seconds=60, last_call_seconds=1)
        code = subprocess.call(worker_command(py, "/work/run", flags, trainer_program("/work/config.json"), "/work/termination-log"))
        store.terminate(); store.wait()
        sys.exit(code)
    """)
    # torchrun's agent advertises its host name: a kubelet's /etc/hosts maps it to the pod's
    # address; with no network here, to loopback.
    result = run(TRAINER, "-c", driver, flags=["--entrypoint", "python", *HARDENED, "-v", f"{work}:/work",
                                              "--hostname", "node0", "--add-host", "node0:127.0.0.1",
                                              "-e", "TORCH_EXTENSIONS_DIR=/tmp/torch_extensions"], timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    steps = sorted(p.name for p in (work / "ckpt").glob("step-*"))
    assert steps == ["step-00000003", "step-00000006"], (steps, output[-2000:])
    manifest = json.loads((work / "ckpt" / "step-00000006" / "manifest.json").read_text())
    assert manifest["step"] == 6
    owners = {p.stat().st_uid for p in (work / "ckpt").rglob("*")}
    assert owners == {65532}, owners
