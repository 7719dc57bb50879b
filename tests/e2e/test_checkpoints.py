"""Checkpoints on the cluster: a job restored from S3 after every other copy is gone, a
missing credentials Secret named in the status until it exists, a tier with refused
credentials shown as degraded (naming the cause, never the secret), and the adaptive
interval shortened by failures, visible in the status."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from support.waiting import wait_for

from s3server import MinioServer

from .jobs import GANG, PVC, create, events, job_manifest, wait_status
from .matrix import check_counters

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def s3(operator, tmp_path_factory):
    with MinioServer(tmp_path_factory.mktemp("minio-e2e"), host="0.0.0.0") as server:
        server.make_bucket("ckpt")
        yield server


def _secret(bed, namespace: str, name: str, env: dict[str, str]) -> None:
    bed.kubectl("create", "namespace", namespace, check=False)
    bed.kubectl("delete", "secret", name, "-n", namespace, check=False)
    bed.kubectl("create", "secret", "generic", name, "-n", namespace,
                f"--from-literal=AWS_ACCESS_KEY_ID={env['AWS_ACCESS_KEY_ID']}",
                f"--from-literal=AWS_SECRET_ACCESS_KEY={env['AWS_SECRET_ACCESS_KEY']}")


def _s3_spec(bed, server: MinioServer, secret: str) -> dict:
    """The bucket as the pods reach this host's MinIO."""
    return {"bucket": "ckpt", "endpoint": f"http://{bed.host_address}:{server.port}", "credentialsSecret": {"name": secret}}


def _worker_logs(bed, namespace: str, name: str) -> str:
    out = bed.kubectl("get", "pods", "-n", namespace, "-l", f"llmtrain.io/job={name},llmtrain.io/role=worker", "-o", "json")
    return "\n".join(bed.pod_log(namespace, p["metadata"]["name"]) for p in json.loads(out.stdout)["items"])


def test_every_copy_but_s3_wiped_the_job_resumes_from_s3_through_tier_1(operator, s3, prometheus):
    bed, ns, name = operator, "e2e-s3", "from-s3"
    _secret(bed, ns, "s3-creds", s3.env())
    bed.kubectl("apply", "-n", ns, "-f", "-", input=PVC)
    spec = {"spec.trainer.builtin.maxSteps": 40, "spec.checkpoint.intervalSteps": 10,
            "spec.checkpoint.shared": {"claimName": "ckpt-shared"}, "spec.checkpoint.s3": _s3_spec(bed, s3, "s3-creds")}
    create(bed, ns, job_manifest(name, spec))
    done = wait_status(bed, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "first run finished")
    assert done["phase"] == "Succeeded", json.dumps(done)[:2000]
    tiers = {t["name"]: t for t in done["checkpointTiers"]}
    assert tiers["s3"]["healthy"] and tiers["s3"]["lastStep"] == 40, tiers
    keys = s3.keys("ckpt", f"llmtrain/{ns}/{name}/step-00000040/")
    assert f"llmtrain/{ns}/{name}/step-00000040/COMMITTED" in keys

    # Every copy but S3's goes: the job (its pods and their node-local tier 1) and the
    # shared volume's folder. The same job again, asked for more steps.
    bed.kubectl("delete", "ltj", name, "-n", ns, "--wait=true")
    wait_for(lambda: not json.loads(bed.kubectl("get", "pods", "-n", ns, "-l", f"llmtrain.io/job={name}", "-o", "json").stdout)["items"],
             120, what="the first run's pods gone")
    shutil.rmtree(bed.state / "pvs" / f"pv-{ns}-ckpt-shared" / ns / name, ignore_errors=True)
    create(bed, ns, job_manifest(name, {**spec, "spec.trainer.builtin.maxSteps": 50}))
    again = wait_status(bed, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "second run finished")
    assert again["phase"] == "Succeeded", json.dumps(again)[:2000]
    logs = _worker_logs(bed, ns, name)
    assert "resumed from step 40 (" in logs, logs[-3000:]
    # Through tier 1: each new pod's launcher pulls the step there at pod start (the
    # prefetch), and the ranks read it from there, pulling nothing themselves.
    assert "llmtrain launcher: prefetched step 40 from the s3 tier into tier 1" in logs, logs[-3000:]
    assert "pulled step 40" not in logs
    # Both runs succeeded and neither was charged a restart (as Prometheus scraped it).
    check_counters(prometheus, ns, by_reason={}, succeeded=2)
    assert prometheus.query(f'sum(llmtrain_operator_jobs_restarted_total{{namespace="{ns}"}})') in (None, 0.0)


def test_a_missing_credentials_secret_makes_the_job_invalid_naming_it_and_creating_it_lets_the_job_run(operator, s3, prometheus):
    # The chart's cluster-wide operator may not read Secrets: the worker pods are created
    # and wait for the Secret (CreateContainerConfigError), and the status names it.
    bed, ns, name = operator, "e2e-s3-missing", "no-secret"
    bed.kubectl("create", "namespace", ns, check=False)
    bed.kubectl("delete", "secret", "s3-later", "-n", ns, check=False)
    create(bed, ns, job_manifest(name, {"spec.trainer.builtin.maxSteps": 20, "spec.checkpoint.intervalSteps": 10,
                                        "spec.checkpoint.s3": _s3_spec(bed, s3, "s3-later")}))
    invalid = wait_status(bed, ns, name, lambda s: s.get("phase") == "Invalid", 180, "Invalid for the missing Secret")
    condition = next(c for c in invalid["conditions"] if c["type"] == "Invalid")
    assert condition["reason"] == "MissingDependency" and "Secret s3-later" in condition["message"], condition
    assert "MissingDependency" in events(bed, ns, name)
    assert prometheus.wait_value('sum(llmtrain_operator_jobs{phase="Invalid"})', lambda v: v >= 1, 60) >= 1
    _secret(bed, ns, "s3-later", s3.env())
    done = wait_status(bed, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the job ran once the Secret existed")
    assert done["phase"] == "Succeeded", json.dumps(done)[:2000]
    assert not any(c["type"] == "Invalid" and c["status"] == "True" for c in done["conditions"])
    assert {t["name"]: t for t in done["checkpointTiers"]}["s3"]["lastStep"] == 20
    check_counters(prometheus, ns, by_reason={}, succeeded=1)


def test_refused_s3_credentials_degrade_the_tier_in_the_status_naming_the_cause_never_the_secret(operator, s3):
    bed, ns, name = operator, "e2e-s3-creds", "bad-creds"
    secret_value = "not-the-secret-" + "9" * 20
    _secret(bed, ns, "s3-wrong", {**s3.env(), "AWS_SECRET_ACCESS_KEY": secret_value})
    create(bed, ns, job_manifest(name, {"spec.trainer.builtin.maxSteps": 400, "spec.checkpoint.intervalSteps": 10,
                                        "spec.checkpoint.s3": _s3_spec(bed, s3, "s3-wrong"),
                                        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": "slow@step=1,seconds=0.2,steps=400"}]}))
    # The tier is probed before the first step, so the condition can precede the Running phase: training going on
    # is the job reaching Running (its first step) with the condition still set.
    degraded = wait_status(bed, ns, name, lambda s: s.get("phase") in ("Running", "Failed", "Succeeded") and any(
        c["type"] == "CheckpointsDegraded" and c["status"] == "True" for c in s.get("conditions", [])),
        300, "the S3 tier degraded while training goes on")
    condition = next(c for c in degraded["conditions"] if c["type"] == "CheckpointsDegraded")
    assert condition["reason"] == "S3CredentialsRefused", condition
    assert "the credentials were refused (check the credentials Secret)" in condition["message"]
    assert degraded["phase"] == "Running", "training goes on"
    tiers = {t["name"]: t for t in degraded["checkpointTiers"]}
    assert tiers["local"]["healthy"] and not tiers["s3"]["healthy"] and tiers["s3"]["reason"] == "CredentialsRefused"
    assert "CheckpointTierDegraded" in events(bed, ns, name)
    everything = (bed.kubectl("get", "events", "-n", ns, "-o", "json").stdout + json.dumps(degraded)
                  + _worker_logs(bed, ns, name) + "".join(bed.pod_log("llmtrain-system", p["metadata"]["name"]) for p in json.loads(
                      bed.kubectl("get", "pods", "-n", "llmtrain-system", "-o", "json").stdout)["items"]))
    assert secret_value not in everything
    bed.kubectl("delete", "ltj", name, "-n", ns, "--wait=false")


def test_failures_shorten_the_adaptive_interval_visible_in_the_status(operator):
    bed, ns, name = operator, "e2e-cadence", "adaptive"
    create(bed, ns, job_manifest(name, {
        "spec.trainer.builtin.maxSteps": 100000, "spec.checkpoint.intervalSteps": "auto",
        "spec.checkpoint.auto": {"initialSteps": 10, "minSteps": 2, "maxSteps": 5000, "mtbfPriorSeconds": 600},
        "spec.faultTolerance.maxRestarts": 10, **GANG,
        # Steps of >= 0.2 s; four crashes of a rank.
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT",
                      "value": "slow@step=1,seconds=0.2,steps=100000;crash@step=60,rank=1;crash@step=120,rank=0;"
                               "crash@step=180,rank=1;crash@step=240,rank=0"}],
    }))
    seen: list[dict] = []

    def chosen(wanted_failures: int):
        def check(s: dict) -> bool:
            cadence = s.get("checkpointCadence") or {}
            history = cadence.get("history") or {}
            if cadence.get("mtbfSeconds") is not None and cadence.get("costSeconds") and cadence.get("stepSeconds"):
                seen.append({"failures": history.get("failures"), "interval": cadence.get("intervalSteps"),
                             "mtbf": cadence["mtbfSeconds"], "cost": cadence["costSeconds"], "step": cadence["stepSeconds"],
                             "latency": cadence.get("latencySeconds") or 0.0})
            return history.get("failures", 0) >= wanted_failures and any(x["failures"] >= wanted_failures for x in seen)
        return check

    try:
        wait_status(bed, ns, name, chosen(0), 300, "an interval chosen before any failure")

        def shortened(s: dict) -> bool:
            # The operator counts a failure at once; the trainers learn of it when the
            # kubelet refreshes the ConfigMap file beside their config, up to a sync period
            # later. (prior + active seconds) / (1 + failures): once they have, four
            # failures cut the MTBF they use more than three-fold.
            # Two reads in a row alike: the interval rank 0 proposes with a new MTBF is agreed
            # at a later step, and a read in between pairs the new MTBF with the old interval.
            first = [x for x in seen if x["failures"] == 0][-1]
            return (chosen(4)(s) and len(seen) >= 2 and seen[-1] == seen[-2] and seen[-1]["failures"] >= 4
                    and seen[-1]["mtbf"] < first["mtbf"] / 3)
        final = wait_status(bed, ns, name, shortened, 900, "an interval chosen with the MTBF of four failures")
        first = [x for x in seen if x["failures"] == 0][-1]
        later = seen[-1]
        assert final["checkpointCadence"]["mode"] == "auto"
        # The status shows rank 0's inputs as it reported them: the MTBF above is the one
        # the trainers used. The interval in force is sqrt(2 x cost x MTBF) / step time from
        # those inputs (within a step: the status rounds them), and at least twice the
        # write's latency. The cost and the step time vary with the machine's load, so the
        # interval alone can move either way.
        for x in (first, later):
            ideal = max(math.sqrt(2 * x["cost"] * x["mtbf"]) / x["step"], 2 * x["latency"] / x["step"])
            assert abs(x["interval"] - min(5000, max(2, ideal))) <= 1, (x, ideal, seen[-10:])
        assert later["step"] >= 0.2, "the steps are paced at 0.2 s or more"
        assert "CheckpointIntervalChanged" in events(bed, ns, name)
    finally:  # a job of 100000 steps must not outlive a failed test and load the ones after it
        bed.kubectl("delete", "ltj", name, "-n", ns, "--wait=false")
