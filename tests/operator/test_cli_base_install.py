"""The CLI as `pip install llmtrain-operator` leaves it: the built wheel in a clean venv
with only the base dependencies (no torch, kopf, prometheus-client, tqdm or boto3).
validate, crd, exit-codes, --help and --version work; the commands that need an extra say which one
instead of a traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.specs import ROOT

pytestmark = pytest.mark.slow  # builds a wheel and installs it with its dependencies from PyPI

EXTRAS_ONLY = ("torch", "kopf", "prometheus_client", "tqdm", "boto3", "matplotlib", "kubernetes")


@pytest.fixture(scope="module")
def base_bin(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("base-install")
    # Built from a copy of what the wheel holds: setuptools leaves a build/ folder in the
    # tree it builds, and a stale one would put deleted modules into the next wheel.
    source = root / "source"
    keep = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for folder in ("common", "operator", "trainer_image"):
        shutil.copytree(ROOT / folder, source / folder, ignore=keep)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(source)],
                   check=True, capture_output=True, text=True)
    (wheel,) = (root / "dist").glob("llmtrain_operator-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, capture_output=True)
    installed = subprocess.run([str(root / "venv" / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return root / "venv" / "bin"


def _llmtrain(bin_dir: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "llmtrain"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_the_venv_holds_only_the_base_dependencies(base_bin):
    probe = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    found = subprocess.run([str(base_bin / "python"), "-c", probe, *EXTRAS_ONLY], capture_output=True, text=True, check=True)
    assert found.stdout.split() == [], "an extra's package is installed: the test would prove nothing"


def test_help_validate_crd_and_exit_codes_work_on_the_base_install(base_bin):
    helped = _llmtrain(base_bin, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "examples:" in helped.stdout and "llmtrain validate" in helped.stdout
    assert "``" not in helped.stdout, "reStructuredText markup in --help"

    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    validated = _llmtrain(base_bin, "validate", *examples)
    assert validated.returncode == 0, validated.stderr
    assert validated.stdout.count(": ok") == len(examples), validated.stdout

    invalid = _llmtrain(base_bin, "validate", str(ROOT / "pyproject.toml"))
    assert invalid.returncode == 1 and "Traceback" not in invalid.stderr, invalid.stderr

    crd = _llmtrain(base_bin, "crd")
    assert crd.returncode == 0 and "kind: CustomResourceDefinition" in crd.stdout, crd.stderr
    codes = _llmtrain(base_bin, "exit-codes")
    assert codes.returncode == 0 and "HANG" in codes.stdout, codes.stderr
    version = _llmtrain(base_bin, "--version")
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version.returncode == 0 and version.stdout.strip() == f"llmtrain {wanted}", (version.stdout, version.stderr)


def test_commands_that_need_an_extra_name_it(base_bin, tmp_path):
    ran = _llmtrain(base_bin, "run", str(ROOT / "examples" / "01-tiny-elastic-cpu.yaml"), "--workdir", str(tmp_path / "run"))
    assert ran.returncode == 1
    assert "needs the 'trainer' extra" in ran.stderr and "pip install 'llmtrain-operator[trainer]'" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr

    listed = _llmtrain(base_bin, "checkpoints", "ls", "s3://ckpt/llmtrain/x")
    assert listed.returncode == 1
    assert "boto3 is not installed (pip install 'llmtrain-operator[operator]')" in listed.stderr, listed.stderr
    assert "Traceback" not in listed.stderr, listed.stderr
