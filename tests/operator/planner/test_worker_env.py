"""A worker gets the same environment whether it runs in a pod or under `llmtrain run`:
both are built by one function (planner.environment.worker_env)."""

from __future__ import annotations

from llmtrain_contract.names import Env
from llmtrain_operator.api import parse_job
from llmtrain_operator.localrun.cluster import LocalCluster
from llmtrain_operator.planner.manifests import worker_pod
from llmtrain_operator.planner.tokens import JobToken
from support.planning import job


def test_the_local_runner_and_a_pod_carry_the_same_llmtrain_variables(tmp_path, monkeypatch):
    raw = job({"spec.checkpoint.shared": {"claimName": "ckpt"},
               "spec.checkpoint.s3": {"bucket": "ckpts", "endpoint": "http://127.0.0.1:9000", "credentialsSecret": {"name": "s3"}},
               "spec.env": [{"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "x", "key": "y"}}},
                            {"name": "PLAIN", "value": "1"}]})
    parsed = parse_job({**raw, "status": None})
    token = JobToken("tiny-elastic-rdzv-token-0123456789", "v" * 64)
    pod_env = {e["name"]: e for e in worker_pod(parsed, 0, 0, token=token)["spec"]["containers"][0]["env"]}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local-key")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    cluster = LocalCluster(parsed, tmp_path)
    local_env = cluster.worker_environment("tiny-elastic-worker-0", 0)

    pod_names = {n for n in pod_env if n.startswith(Env.PREFIX)}
    local_names = {n for n in local_env if n.startswith(Env.PREFIX)}
    assert {Env.JOB, Env.RUN_DIR, Env.CHECKPOINT_DIR, Env.SHARED_CHECKPOINT_DIR, Env.S3_URI,
            Env.HANG_TIMEOUT_SECONDS, Env.COLLECTIVE_TIMEOUT_SECONDS} <= pod_names
    assert local_names - pod_names == {Env.FAULT_STATE_DIR}  # the local run's own (test faults)
    assert pod_names <= local_names

    # References are resolved the way the kubelet would, or from this shell.
    assert pod_env[Env.POD_IP]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert local_env[Env.POD_NAME] == "tiny-elastic-worker-0" and local_env[Env.POD_IP] == "127.0.0.1"
    assert pod_env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3"
    assert local_env["AWS_ACCESS_KEY_ID"] == "local-key" and "AWS_SECRET_ACCESS_KEY" not in local_env
    assert local_env["PLAIN"] == "1" and "FROM_SECRET" not in local_env
    # The job's token: a pod reads its Secret, the local run makes its own.
    assert pod_env[Env.RDZV_TOKEN]["valueFrom"]["secretKeyRef"] == {"name": "tiny-elastic-rdzv-token-0123456789", "key": "token"}
    assert local_env[Env.RDZV_TOKEN] == cluster.token and len(cluster.token) == 64
    assert any("AWS_SECRET_ACCESS_KEY" in w for w in cluster.warnings)
    # Paths differ (a pod's mounts vs the workdir), names do not.
    assert pod_env[Env.CHECKPOINT_DIR]["value"] == "/ckpt/local"
    assert local_env[Env.CHECKPOINT_DIR] == str(tmp_path / "node-0" / "ckpt")


def _threads(changes: dict) -> list[str]:
    parsed = parse_job({**job(changes), "status": None})
    return [e["value"] for e in worker_pod(parsed, 0, 0)["spec"]["containers"][0]["env"] if e["name"] == "OMP_NUM_THREADS"]


def test_each_rank_gets_the_pods_cpus_over_its_ranks_as_intra_op_threads_unless_the_user_says_otherwise():
    # Example 01 requests 1 CPU for its 1 rank.
    assert _threads({}) == ["1"]
    # The limit wins over the request; ranks share the pod's CPUs; never below 1.
    assert _threads({"spec.resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "16"}}, "spec.procsPerNode": 2}) == ["8"]
    assert _threads({"spec.resources": {"requests": {"cpu": "7"}}, "spec.procsPerNode": 2}) == ["3"]
    assert _threads({"spec.resources": {"requests": {"cpu": "500m"}}}) == ["1"]
    assert _threads({"spec.resources": {"requests": {"cpu": 12}}, "spec.procsPerNode": 4,
                     "spec.trainer.builtin.globalBatchSize": 16}) == ["3"]
    # No CPU figure: torch's own default.
    assert _threads({"spec.resources": {"requests": {"memory": "2Gi"}}}) == []
    assert _threads({"spec.resources": None}) == []
    # The user's own value is the only one.
    assert _threads({"spec.env": [{"name": "OMP_NUM_THREADS", "value": "6"}]}) == ["6"]


def test_the_local_run_carries_the_same_thread_count(tmp_path):
    parsed = parse_job({**job({"spec.resources": {"requests": {"cpu": "2"}}}), "status": None})
    assert LocalCluster(parsed, tmp_path).worker_environment("tiny-elastic-worker-0", 0)["OMP_NUM_THREADS"] == "2"


def test_a_script_job_gets_its_tiers_for_the_checkpoint_api_as_the_builtin_trainers_config_lists_them(tmp_path):
    import json

    from llmtrain_contract.config import CheckpointTierConfig
    from llmtrain_operator.planner.render import trainer_config

    tiers = {"spec.checkpoint.shared": {"claimName": "ckpt", "keep": 5, "intervalSteps": 20},
             "spec.checkpoint.s3": {"bucket": "ckpts", "endpoint": "http://minio:9000", "credentialsSecret": {"name": "s3"}}}
    builtin = parse_job({**job(tiers), "status": None})
    script = parse_job({**job({**tiers, "spec.trainer": {"command": ["/app/train.py"]}, "spec.image": "example.com/me:1"}),
                        "status": None})
    env = {e["name"]: e.get("value") for e in worker_pod(script, 0, 0)["spec"]["containers"][0]["env"]}
    listed = [CheckpointTierConfig.model_validate(t) for t in json.loads(env[Env.CHECKPOINT_TIERS])]
    assert listed == trainer_config(builtin).checkpoint.tiers
    assert [(t.name, t.keep, t.interval_steps) for t in listed] == [("local", 2, 0), ("shared", 5, 20), ("s3", 5, 0)]
    assert env[Env.JOB_UID] == "uid-1"
    local = LocalCluster(script, tmp_path).worker_environment("tiny-elastic-worker-0", 0)
    assert json.loads(local[Env.CHECKPOINT_TIERS])[0]["uri"] == str(tmp_path / "node-0" / "ckpt"), "the local run's folders"
    # The built-in trainer reads its config file; checkpoints off: no tiers to give.
    assert Env.CHECKPOINT_TIERS not in {e["name"] for e in worker_pod(builtin, 0, 0)["spec"]["containers"][0]["env"]}
    off = parse_job({**job({"spec.trainer": {"command": ["/app/train.py"]}, "spec.image": "example.com/me:1",
                            "spec.checkpoint.enabled": False}), "status": None})
    assert Env.CHECKPOINT_TIERS not in {e["name"] for e in worker_pod(off, 0, 0)["spec"]["containers"][0]["env"]}


def test_in_process_healing_reaches_the_trainers_config_and_is_refused_for_a_zero_job():
    import pytest
    from llmtrain_operator.api.job import SpecInvalid
    from llmtrain_operator.planner.render import trainer_config

    assert trainer_config(parse_job({**job(), "status": None})).fault_tolerance.in_process_healing is False
    healing = parse_job({**job({"spec.faultTolerance.inProcessHealing": True}), "status": None})
    assert trainer_config(healing).fault_tolerance.in_process_healing is True
    with pytest.raises(SpecInvalid, match=r"spec.faultTolerance.inProcessHealing: .* \(strategy 'deepspeed'\)"):
        parse_job({**job({"spec.faultTolerance.inProcessHealing": True,
                          "spec.trainer.builtin.strategy": {"kind": "deepspeed", "zeroStage": 2}}), "status": None})
