"""The kind bed's pure parts, on real files: its cluster config, the view that lays the
kind nodes' mounts out as the local cluster's state folder (the tests read pods' volumes
and logs there), and the versions the node image and the config must agree on. The bed
itself runs in `make test`'s last stage and `make test-kind` (hack/kind/)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from kindbed import IN_NODE_PVS, WORKERS, StateView, kind_config, write_config
from support.specs import ROOT


def _shell_vars(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)=([^\s#]+)", path.read_text(), re.M))


def test_the_config_names_the_images_the_node_image_holds_at_the_versions_built():
    """kubeadm would name its own etcd and CoreDNS tags, which no registry serves here:
    the config's tags, the node image's and the Go builds' versions must be one."""
    node_image = _shell_vars(ROOT / "hack/kind/node-image.sh")
    tools = _shell_vars(ROOT / "hack/cluster-tools/build.sh")
    patches = [json.loads(p) for p in json.loads(kind_config(Path("/x")))["kubeadmConfigPatches"]]
    cluster = next(p for p in patches if p["kind"] == "ClusterConfiguration")
    kubelet = next(p for p in patches if p["kind"] == "KubeletConfiguration")
    assert cluster["etcd"]["local"]["imageTag"] == node_image["ETCD_TAG"]
    assert node_image["ETCD_TAG"].startswith(tools["ETCD_VERSION"].removeprefix("v") + "-")
    assert cluster["dns"]["imageTag"] == node_image["COREDNS_TAG"] == tools["COREDNS_VERSION"]
    containerd = (ROOT / "hack/kind/node/files/containerd-config.toml").read_text()
    assert f'sandbox_image = "registry.k8s.io/pause:{node_image["PAUSE_TAG"]}"' in containerd
    assert "restrict_oom_score_adj = true" in containerd, "this VM's root cannot lower OOM scores"
    assert kubelet["failCgroupV1"] is False


def test_the_config_mounts_what_the_view_reads_labels_the_pools_and_keeps_the_local_timings(tmp_path):
    config = json.loads(kind_config(tmp_path))
    control, *workers = config["nodes"]
    assert control["role"] == "control-plane" and len(workers) == len(WORKERS)
    patch = json.loads(control["kubeadmConfigPatches"][0])
    assert patch["controllerManager"]["extraArgs"]["node-monitor-grace-period"] == "16s"
    assert patch["apiServer"]["extraArgs"]["audit-log-path"].startswith("/var/log/kubernetes/audit/")
    assert [w["labels"]["llmtrain.io/pool"] for w in workers] == ["system", "gpu", "gpu", "gpu"]
    for i, worker in enumerate(workers):
        mounts = {m["containerPath"]: m["hostPath"] for m in worker["extraMounts"]}
        assert mounts["/var/lib/kubelet/pods"] == str(tmp_path / "nodes" / f"worker-{i}" / "kubelet-pods")
        assert mounts["/var/log/pods"] == str(tmp_path / "nodes" / f"worker-{i}" / "pod-logs")
        assert mounts[IN_NODE_PVS] == str(tmp_path / "pvs"), "one shared folder in every node"


def test_write_config_creates_every_mounted_folder(tmp_path):
    path = write_config(tmp_path / "bed")
    for node in json.loads(path.read_text())["nodes"]:
        for mount in node["extraMounts"]:
            host = Path(mount["hostPath"])
            assert (tmp_path / "bed").resolve() in host.parents and host.is_dir(), mount
    assert (tmp_path / "bed" / "audit" / "policy.yaml").read_text().startswith("apiVersion: audit.k8s.io/v1")


def _pod(uid: str, namespace: str = "ml", job: str = "tiny") -> dict:
    return {"metadata": {"uid": uid, "namespace": namespace, "name": f"{job}-worker-0"},
            "spec": {"nodeName": "llmtrain-worker2", "containers": [{"name": "trainer", "env": [
                {"name": "LLMTRAIN_JOB", "value": job},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}}


def test_the_view_lays_volumes_logs_and_the_trainer_env_out_as_the_local_cluster_does(tmp_path):
    node = tmp_path / "nodes" / "worker-1"
    run = node / "kubelet-pods" / "u1" / "volumes" / "kubernetes.io~empty-dir" / "run"
    run.mkdir(parents=True)
    (run / "steps.jsonl").write_text('{"step": 1}\n')
    logs = node / "pod-logs" / "ml_tiny-worker-0_u1" / "trainer"
    logs.mkdir(parents=True)
    (logs / "0.log").write_text("2026-11-26T18:00:00.1Z stderr F first attempt\n")
    (logs / "1.log").write_text("2026-11-26T18:00:05.2Z stderr F resumed from step 10 (local tier, x)\n"
                                "2026-11-26T18:00:05.3Z stdout P a partial line\n")
    view = StateView(tmp_path)
    view.refresh([_pod("u1")])
    pod = tmp_path / "pods" / "u1"
    assert (pod / "volumes" / "run" / "steps.jsonl").read_text() == '{"step": 1}\n'
    (pod / "volumes" / "run" / "go").write_text("")  # a test's trigger reaches the pod's volume
    assert (run / "go").exists()
    assert (pod / "trainer.log").read_text().splitlines() == [
        "first attempt", "resumed from step 10 (local tier, x)", "a partial line"]
    env = json.loads((pod / "trainer.json").read_text())["env"]
    assert env == {"LLMTRAIN_JOB": "tiny", "POD_NAMESPACE": "ml"}, "a Secret's value is never copied"


def test_a_deleted_pods_log_and_env_stay_as_the_local_cluster_keeps_them(tmp_path):
    node = tmp_path / "nodes" / "worker-0"
    logs = node / "pod-logs" / "ml_tiny-worker-0_u2" / "trainer"
    logs.mkdir(parents=True)
    (logs / "0.log").write_text("2026-11-26T18:00:00.1Z stderr F saved step 5\n")
    view = StateView(tmp_path)
    view.refresh([_pod("u2")])
    shutil.rmtree(node / "pod-logs" / "ml_tiny-worker-0_u2")  # the kubelet removes a deleted pod's logs
    view.refresh([])  # and the API no longer lists it
    pod = tmp_path / "pods" / "u2"
    assert (pod / "trainer.log").read_text() == "saved step 5\n"
    assert json.loads((pod / "trainer.json").read_text())["env"]["LLMTRAIN_JOB"] == "tiny"
