"""Bring-your-own workloads end to end (docs/custom-scripts.md): example 03 as written,
the same job with a rank SIGKILLed mid-run, scripts written only against torchrun's env
contract, a script reporting progress from an image without this project, and a
script's own exit code deciding the job's fate."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml
from support.specs import ROOT
from support.waiting import wait_for

from .jobs import event_messages, get, pods, wait_status

pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).with_name("scripts")
EXAMPLE = ROOT / "examples" / "03-custom-torchrun-script.yaml"
USER_IMAGE = "localcluster.local/python-torch:1"
"""Python and torch, no copy of this project (hack/localcluster/images.py)."""
NS = "e2e-scripts"
"""The namespace of the jobs that run side by side (``script_jobs``)."""


def _example(bed, ns: str, name: str | None = None, steps: str | None = None) -> tuple[dict, dict]:
    """Example 03's ConfigMap and job, unchanged but for what the arguments name."""
    config_map, job = yaml.safe_load_all(EXAMPLE.read_text())
    if name:
        job["metadata"]["name"] = name
    if steps:
        job["spec"]["env"] = [{"name": "STEPS", "value": steps}]
    bed.kubectl("create", "namespace", ns, check=False)
    bed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all([config_map, job]))
    return config_map, job


def _script_job(name: str, command: list[str], image: str = "ghcr.io/llmtrain/trainer:0.1.0", working_dir: str | None = None,
                env: dict[str, str] | None = None) -> dict:
    container = {"name": "trainer", "volumeMounts": [{"name": "scripts", "mountPath": "/scripts"}]}
    if working_dir:
        container["workingDir"] = working_dir
    spec = {
        "image": image,
        "replicas": {"min": 2, "max": 2},
        "trainer": {"command": command},
        "checkpoint": {"enabled": False},
        "faultTolerance": {"maxRestarts": 3},
        "scheduling": {"nodeSelector": {"llmtrain.io/pool": "gpu"}},
        "podTemplate": {"spec": {"volumes": [{"name": "scripts", "configMap": {"name": "user-scripts", "items": [
            {"key": key, "path": key.replace("__", "/", 1) if key.startswith("pkg__") else key}
            for key in _script_files()]}}], "containers": [container]}},
    }
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {"apiVersion": "llmtrain.io/v1alpha1", "kind": "LLMTrainJob", "metadata": {"name": name}, "spec": spec}


def _script_files() -> dict[str, Path]:
    """ConfigMap key -> file; a package's files as ``pkg__<file>`` (keys hold no ``/``)."""
    files = {p.name: p for p in SCRIPTS.glob("*.py")}
    files.update({f"pkg__{p.name}": p for p in (SCRIPTS / "pkg").glob("*.py")})
    return files


def _finished(bed, ns: str, name: str, timeout: float = 300) -> dict:
    return wait_status(bed, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), timeout, f"{name} finished")


def _worker_log(bed, ns: str, name: str) -> str:
    return "\n".join(bed.pod_log(ns, p["metadata"]["name"]) for p in pods(bed, ns, name))


def _rank_pid(pod_name: str, rank: int) -> int | None:
    """The rank's process on the local cluster's host: torchrun's RANK and the pod's
    POD_NAME in its environment, the script runner in its command line."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            env = dict(item.split("=", 1) for item in (proc / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in item)
        except OSError:
            continue
        if env.get("POD_NAME") == pod_name and env.get("RANK") == str(rank) and any(a.endswith(b"script.py") for a in cmdline):
            return int(proc.name)
    return None


@pytest.fixture(scope="module")
def script_jobs(operator):
    """Several jobs at once: example 03 as written (``custom-script``); scripts that know
    only torchrun's env contract (DDP on the default backend, MASTER_ADDR by hand, ``-m``
    with torch's ``@record``); a progress-reporting script in an image without this
    project; a script that exits 64. Each job's checks are a test of their own. The
    progress job's test comes first: it watches that job while it runs."""
    bed = operator
    _example(bed, NS)
    args = [f"--from-file={key}={path}" for key, path in _script_files().items()]
    bed.kubectl("create", "configmap", "user-scripts", "-n", NS, *args)
    jobs = {
        "ddp": _script_job("ddp", ["/scripts/ddp_linear.py"]),
        "env": _script_job("env", ["/scripts/env_check.py"]),
        "module": _script_job("module", ["-m", "pkg.train"], working_dir="/scripts"),
        "progress": _script_job("progress", ["/scripts/progress.py"], image=USER_IMAGE, env={"STEPS": "40"}),
        "bad-config": _script_job("bad-config", ["/scripts/bad_config.py"], image=USER_IMAGE),
    }
    jobs["env"]["spec"]["trainer"]["args"] = ["--flag", "value"]
    bed.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(list(jobs.values())))
    yield
    for name in ("custom-script", *jobs):
        bed.kubectl("delete", "ltj", name, "-n", NS, "--wait=false", check=False)


def _succeeded(bed, name: str) -> dict:
    done = _finished(bed, NS, name)
    assert done["phase"] == "Succeeded" and done["restarts"] == 0, (name, json.dumps(done)[:2000])
    return done


def test_a_script_in_an_image_without_the_project_reports_progress_while_it_runs(operator, script_jobs):
    """Progress through the contract, while the job runs, from an image without the project."""
    bed = operator
    running = wait_status(bed, NS, "progress", lambda s: s.get("step", 0) >= 5 and s.get("phase") == "Running", 300,
                          "the script's reported step in the status")
    assert running["workers"] == "2/2", "ready through the launcher's /readyz: the script serves nothing"
    worker = pods(bed, NS, "progress")[0]
    assert worker["spec"]["containers"][0]["image"] == USER_IMAGE
    assert [c["name"] for c in worker["spec"]["initContainers"]] == ["llmtrain-runtime"]
    _succeeded(bed, "progress")
    assert get(bed, NS, "progress")["status"]["step"] >= 5


def test_example_03_runs_unchanged(operator, script_jobs):
    bed = operator
    _succeeded(bed, "custom-script")
    log = _worker_log(bed, NS, "custom-script")
    assert "step 4: sum over 2 ranks = 3.0" in log, log[-2000:]


def test_a_ddp_script_on_the_default_backend_runs_unchanged(operator, script_jobs):
    bed = operator
    _succeeded(bed, "ddp")
    assert "ddp: 2 ranks agree after 30 steps" in _worker_log(bed, NS, "ddp")


def test_a_script_that_reads_only_torchruns_env_gets_one_rank_per_pod_and_its_args(operator, script_jobs):
    bed = operator
    _succeeded(bed, "env")
    log = _worker_log(bed, NS, "env")
    assert "env: ranks on ['env-worker-0', 'env-worker-1']" in log, "one rank per pod, by the pods' hostnames"
    assert "argv ['--flag', 'value']" in log


def test_a_script_run_as_a_module_with_torchs_record_runs_unchanged(operator, script_jobs):
    bed = operator
    _succeeded(bed, "module")
    assert "module: all_reduce [3.0, 3.0, 3.0, 3.0]" in _worker_log(bed, NS, "module")


def test_a_scripts_permanent_exit_code_fails_the_job_at_once_with_the_runners_record(operator, script_jobs):
    bed = operator
    done = _finished(bed, NS, "bad-config")
    assert done["phase"] == "Failed", json.dumps(done)[:2000]
    assert done["restarts"] == 0, "a permanent code is not retried"
    assert done["lastFailure"]["reason"] == "ConfigError", done["lastFailure"]
    assert "exited with code 64" in json.dumps(done), "the runner's record reaches the status"


def test_example_03_with_a_rank_sigkilled_mid_run_restarts_and_succeeds(operator):
    bed, ns, name = operator, "e2e-script-crash", "custom-script"
    _example(bed, ns, steps="40000")  # long enough to be killed mid-run; nothing else changed
    wait_for(lambda: "step 2000:" in _worker_log(bed, ns, name), 300, what="the script past step 2000")
    victim = pods(bed, ns, name)[0]["metadata"]["name"]
    pid = wait_for(lambda: _rank_pid(victim, 0) or _rank_pid(victim, 1), 30, what=f"a rank process of {victim}")
    os.kill(pid, signal.SIGKILL)
    done = _finished(bed, ns, name, 600)
    assert done["phase"] == "Succeeded", json.dumps(done)[:2000]
    assert done["restarts"] >= 1 and done["lastFailure"]["pod"] == victim, json.dumps(done)[:2000]
    assert "step 39999: sum over 2 ranks = 3.0" in _worker_log(bed, ns, name)
    assert any(reason == "RestartedInPlace" for reason, _ in event_messages(bed, ns, name))
    bed.kubectl("delete", "ltj", name, "-n", ns, "--wait=false")
