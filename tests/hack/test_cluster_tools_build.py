"""hack/cluster-tools/build.sh run concurrently (the suite's early low-priority build and a
fixture that needs one tool): each group is built once, a caller waits only for the
group it asked for, and nobody sees a half-written binary. `go` is a stand-in here that
records its calls; the real build is exercised by every cluster test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from support.specs import ROOT

BUILD = ROOT / "hack" / "cluster-tools" / "build.sh"

FAKE_GO = r"""#!/usr/bin/env bash
# go build ... -o DEST PKG...: DEST is a file, or a directory (ending in /) for several.
set -e
while [ "$1" != "-o" ]; do shift; done
dest=$2; shift 2
echo "start $dest" >> "$GO_CALLS"
sleep "${GO_SECONDS:-1}"
if [[ "$dest" == */ ]]; then
  for pkg in "$@"; do printf '#!/bin/sh\n' > "$dest/${pkg##*/}"; chmod +x "$dest/${pkg##*/}"; done
else
  printf '#!/bin/sh\n' > "$dest"; chmod +x "$dest"
fi
echo "end $dest" >> "$GO_CALLS"
"""


def _env(tmp_path: Path, seconds: float) -> dict[str, str]:
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "go").write_text(FAKE_GO)
    (fake / "go").chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "GO_CALLS": str(tmp_path / "calls"),
            "GO_SECONDS": str(seconds), "LLMTRAIN_CLUSTER_TOOLS": str(tmp_path / "bin")}


def _start(env: dict[str, str], *tools: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(BUILD), *tools], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_concurrent_builds_build_each_group_once_and_a_one_tool_caller_waits_only_for_its_group(tmp_path):
    env = _env(tmp_path, seconds=1.5)
    everything = _start(env)
    time.sleep(0.3)  # the full build holds minio's lock
    started = time.monotonic()
    only_minio = _start(env, "minio")
    out, err = only_minio.communicate(timeout=60)
    minio_wait = time.monotonic() - started
    assert only_minio.returncode == 0, err
    assert out.strip().splitlines()[-1] == str(tmp_path / "bin")
    assert (tmp_path / "bin" / "minio").exists()
    # It returned once minio was built, while the full build went on with the other groups.
    assert everything.poll() is None, "the one-tool caller waited for every group"
    assert minio_wait < 4 * 1.5

    out, err = everything.communicate(timeout=60)
    assert everything.returncode == 0, err
    calls = (tmp_path / "calls").read_text().splitlines()
    starts = [c for c in calls if c.startswith("start")]
    assert len(starts) == 4, calls  # minio, etcd, helm, the Kubernetes binaries: once each
    for tool in ("minio", "etcd", "helm", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"):
        assert os.access(tmp_path / "bin" / tool, os.X_OK), tool
    # Built into a scratch folder and renamed: no binary is ever written in place.
    assert not any(c.split()[1].startswith(str(tmp_path / "bin" / "minio")) for c in starts), calls
    assert not list((tmp_path / "bin").glob(".build-*"))


def test_present_tools_are_reused_without_building(tmp_path):
    env = _env(tmp_path, seconds=0)
    subprocess.run(["bash", str(BUILD)], env=env, check=True, capture_output=True)
    (tmp_path / "calls").unlink()
    again = subprocess.run(["bash", str(BUILD)], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.strip() == str(tmp_path / "bin")
    assert not (tmp_path / "calls").exists()


def test_a_failed_build_exits_non_zero_naming_the_tool_and_leaves_no_binary(tmp_path):
    env = _env(tmp_path, seconds=0)
    (tmp_path / "fakebin" / "go").write_text("#!/bin/sh\necho 'go: module lookup disabled' >&2\nexit 1\n")
    failed = subprocess.run(["bash", str(BUILD), "helm"], env=env, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "building helm" in failed.stderr and "module lookup disabled" in failed.stderr
    assert not (tmp_path / "bin" / "helm").exists()


def test_an_unknown_tool_name_is_refused_naming_it(tmp_path):
    env = _env(tmp_path, seconds=0)
    refused = subprocess.run(["bash", str(BUILD), "minio", "kubeadmm"], env=env, capture_output=True, text=True)
    assert refused.returncode == 64 and "no tool named kubeadmm" in refused.stderr, refused.stderr
    assert not (tmp_path / "calls").exists(), "nothing is built for a bad request"


def test_a_tool_whose_pin_changed_is_rebuilt_in_place(tmp_path):
    """kind, CoreDNS, crictl (and the benchmark tools) are not in the folder's name: their
    wrapper's go.mod and go.sum are recorded beside the binary, and a change rebuilds."""
    env = _env(tmp_path, seconds=0)
    subprocess.run(["bash", str(BUILD), "kind"], env=env, check=True, capture_output=True)
    pin = (tmp_path / "bin" / ".kind.pin").read_text().strip()
    assert len(pin) == 16
    (tmp_path / "calls").unlink()
    subprocess.run(["bash", str(BUILD), "kind"], env=env, check=True, capture_output=True)
    assert not (tmp_path / "calls").exists(), "same pin: reused"
    (tmp_path / "bin" / ".kind.pin").write_text("an older pin\n")  # as a bumped go.mod would leave it
    again = subprocess.run(["bash", str(BUILD), "kind"], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "building kind" in again.stderr
    assert (tmp_path / "bin" / ".kind.pin").read_text().strip() == pin
