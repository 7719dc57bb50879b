"""The three tiers under faults, with real torchrun processes and a real S3 server (MinIO):
restores fall back to the tier that still has a verified copy, and training goes on
while a tier is down, full or refusing the credentials, catching up once it works."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from llmtrain_contract.exitcodes import ExitCode
from support.elastic import ElasticJob, base_config, run_job
from support.waiting import wait_for

from s3server import MinioServer

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

CFG = base_config(maxSteps=20, checkpoint={"intervalSteps": 5})
PACED = {"LLMTRAIN_FAULT_INJECT": "slow@step=1,seconds=0.25,steps=100000"}
"""Steps of >= 0.25 s, so that a test can act while the job runs."""


def s3_tier(prefix: str, **extra) -> dict:
    return {"name": "s3", "uri": f"s3://ckpt/{prefix}", "keep": 3, **extra}


def committed_s3_steps(server: MinioServer, prefix: str) -> list[int]:
    return sorted(int(k.split("/")[-2].split("-")[1]) for k in server.keys("ckpt", prefix + "/") if k.endswith("/COMMITTED"))


def newest_step(job: ElasticJob) -> int:
    steps = job.steps()
    return steps[-1]["step"] if steps else 0


@pytest.mark.tools  # MinIO (the minio fixture)
def test_local_and_shared_wiped_restores_from_s3_through_tier_1(tmp_path, minio):
    job, codes = run_job(tmp_path, CFG, nodes=2, shared_tier=True, extra_tiers=[s3_tier("wiped")], env=minio.env())
    assert codes == [0, 0], job.logs()
    assert committed_s3_steps(minio, "wiped")[-1] == 20
    manifest = json.loads(minio.client().get_object(Bucket="ckpt", Key="wiped/step-00000020/manifest.json")["Body"].read())
    assert manifest["format"] == 3, "the S3 tier stores pieces by content"
    stored = minio.keys("ckpt", "wiped/pieces/")
    refs = {p["ref"] for p in manifest["files"]["state.llmt"]["slices"]}
    assert refs and all(any(k.startswith(f"wiped/pieces/{ref}") for k in stored) for ref in refs), \
        "every piece of the replicated state is stored, once for the job"
    for folder in [tmp_path / "shared", tmp_path / "node0" / "ckpt", tmp_path / "node1" / "ckpt"]:
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    # The rank's own pull (the launcher's prefetch would pull the step first at pod
    # start: test_prefetch_restore.py).
    job2, codes = run_job(tmp_path, dict(CFG, maxSteps=22), nodes=2, shared_tier=True, extra_tiers=[s3_tier("wiped")],
                          env={**minio.env(), "LLMTRAIN_PREFETCH": "0"})
    assert codes == [0, 0], job2.logs()
    logs = job2.logs()
    assert "resumed from step 20 (s3 tier" in logs
    assert "pulled step 20 from the s3 tier into tier 1" in logs, "pulls from S3 land in tier 1 first"
    assert (tmp_path / "node0" / "ckpt" / "step-00000020" / "COMMITTED").exists()
    assert [r["step"] for r in job2.steps()][-3:] == [20, 21, 22], "resumed at 21, nothing redone"


def test_s3_down_while_training_goes_on_and_s3_catches_up(tmp_path):
    with MinioServer(tmp_path / "s3") as server:
        server.make_bucket("ckpt")
        cfg = dict(CFG, maxSteps=70)
        job = ElasticJob(tmp_path, cfg, extra_tiers=[s3_tier("outage")], env={**server.env(), **PACED}).start()
        try:
            wait_for(lambda: committed_s3_steps(server, "outage"), timeout=120, what="a first S3 commit")
            server.stop()
            down_at = newest_step(job)
            wait_for(lambda: newest_step(job) >= down_at + 20, timeout=120, what="20 steps while S3 is down")
            server.start()
            codes = job.wait(timeout=240)
        finally:
            job.kill()
        assert codes == [0], job.logs()
        logs = job.logs()
        assert "s3 tier degraded: the endpoint cannot be reached" in logs
        assert "s3 tier healthy again" in logs
        assert committed_s3_steps(server, "outage")[-1] == 70, "S3 caught up with the final step"
        local = sorted(p.name for p in (tmp_path / "node0" / "ckpt").glob("step-*"))
        assert local[-1] == "step-00000070"


def _mount_tmpfs(path: Path, size: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def test_a_full_tier_1_disk_training_goes_on_through_the_shared_tier_and_tier_1_catches_up(tmp_path):
    probe, codes = run_job(tmp_path / "probe", dict(CFG, maxSteps=5))
    assert codes == [0], probe.logs()
    one = sum(f.stat().st_size for f in (tmp_path / "probe" / "node0" / "ckpt" / "step-00000005").rglob("*") if f.is_file())
    small = tmp_path / "tiny-disk"
    _mount_tmpfs(small, int(one * 1.5) // 4096 * 4096)  # room for one checkpoint, not two
    try:
        job = ElasticJob(tmp_path, dict(CFG, maxSteps=40), shared_tier=True, shared_keep=20, local_dirs={0: small},
                           env=PACED).start()
        wait_for(lambda: "local tier degraded: the filesystem is full" in job.logs(), timeout=120, what="tier 1 full")
        full_at = newest_step(job)
        subprocess.run(["mount", "-o", f"remount,size={one * 8}", str(small)], check=True)  # the disk is freed
        codes = job.wait(timeout=240)
        assert codes == [0], job.logs()
        logs = job.logs()
        assert "unexpected pos" not in logs and "iostream error" not in logs
        shared = sorted(p.name for p in (tmp_path / "shared").glob("step-*"))
        assert "step-00000040" in shared, shared
        assert any(int(name[5:]) > 5 and int(name[5:]) <= full_at + 5 for name in shared), \
            f"checkpoints taken while tier 1 was full reached the shared tier: {shared}"
        assert "local tier healthy again" in logs
        assert (small / "step-00000040" / "COMMITTED").exists()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.mark.tools  # MinIO (the minio fixture)
def test_wrong_s3_credentials_degrade_the_tier_naming_the_cause_and_never_the_secret(tmp_path, minio):
    secret = "wrong-secret-" + "7" * 24
    job, codes = run_job(tmp_path, CFG, extra_tiers=[s3_tier("creds")], env=minio.env(secret=secret))
    assert codes == [0], job.logs()
    logs = job.logs()
    assert "s3 tier degraded: the credentials were refused (check the credentials Secret)" in logs
    assert secret not in logs
    assert committed_s3_steps(minio, "creds") == []
    assert (tmp_path / "node0" / "ckpt" / "step-00000020" / "COMMITTED").exists(), "tier 1 went on"


def _tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # inside the payload: still a valid archive, wrong bytes
    path.write_bytes(bytes(data))


def _shared_pieces(tier: Path, step: str, prefix: str) -> list[Path]:
    """The content-addressed objects holding a step's files whose names start with ``prefix``."""
    manifest = json.loads((tier / step / "manifest.json").read_text())
    found = {f"{p['ref']}{'.zst' if p.get('codec') else ''}" for name, record in manifest["files"].items()
             if name.startswith(prefix) for p in record["slices"]}
    assert found, f"no pieces of {prefix} in {step}"
    return [tier / "pieces" / name for name in sorted(found)]


def test_a_tampered_rng_file_on_a_rank_that_receives_the_state_by_broadcast_is_not_used(tmp_path):
    job, codes = run_job(tmp_path, dict(CFG, maxSteps=15), nodes=2, shared_tier=True)
    assert codes == [0, 0], job.logs()
    # Node 1 keeps no usable engine state (so it receives it by broadcast), and every RNG
    # file it could take its random state from is tampered: its own tier-1 copy and the
    # shared tier's (whichever rank it gets in the next rendezvous).
    step = "step-00000015"
    for path in [tmp_path / "node1" / "ckpt" / step / "state.llmt", *_shared_pieces(tmp_path / "shared", step, "state.llmt")]:
        _tamper(path)
    for path in [*(tmp_path / "node1" / "ckpt" / step / "rng").glob("*.llmt"), *_shared_pieces(tmp_path / "shared", step, "rng/")]:
        _tamper(path)
    job2, codes = run_job(tmp_path, dict(CFG, maxSteps=17), nodes=2, shared_tier=True)
    assert codes == [0, 0], job2.logs()
    logs = job2.logs()
    assert "resumed from step 15 (local tier, broadcast from rank" in logs
    node1 = job2.running[1].output()
    assert "its saved RNG state of step 15" in node1 and "not usable" in node1, node1
    assert "does not match the manifest's hashes" in node1 or "does not match its manifest" in node1
    assert "no usable saved RNG state of step 15; deriving one" in node1


def test_a_final_checkpoint_no_tier_has_room_for_is_a_permanent_storage_full_failure_saying_why(tmp_path):
    small = tmp_path / "tiny-disk"
    _mount_tmpfs(small, 64 * 1024)
    try:
        job, codes = run_job(tmp_path, dict(CFG, maxSteps=6), local_dirs={0: small}, max_restarts=3)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    assert codes == [ExitCode.STORAGE_FULL], job.logs()
    record = json.loads((tmp_path / "node0" / "run" / "exit" / "attempt-0" / "local-0.json").read_text())
    assert "no tier holds the final checkpoint (local: the filesystem is full" in record["message"], record
    assert "out of space: give it room" in record["message"], record
    # Permanent: torchrun did not start the group again to redo the steps (max_restarts 3).
    assert max(r["attempt"] for r in job.steps()) == 0 and len(job.steps()) == 6


def test_storage_full_holds_with_two_ranks_on_the_node(tmp_path):
    """The non-leader rank writes only its small part and sees no failure of its own: the
    ranks still agree that the tier that failed is full."""
    small = tmp_path / "tiny-disk"
    _mount_tmpfs(small, 64 * 1024)
    try:
        job, codes = run_job(tmp_path, dict(CFG, maxSteps=6), local_dirs={0: small}, procs_per_node=2, max_restarts=3)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    assert codes == [ExitCode.STORAGE_FULL], job.logs()


def test_a_final_checkpoint_a_tier_fails_for_another_reason_stays_retryable(tmp_path):
    readonly = tmp_path / "ro-disk"
    _mount_tmpfs(readonly, 1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(readonly)], check=True)
    try:
        job, codes = run_job(tmp_path, dict(CFG, maxSteps=6), local_dirs={0: readonly})
    finally:
        subprocess.run(["umount", "-l", str(readonly)], check=False)
    assert codes == [ExitCode.TRANSIENT], job.logs()
    record = json.loads((tmp_path / "node0" / "run" / "exit" / "attempt-0" / "local-0.json").read_text())
    assert "no tier holds the final checkpoint (local: " in record["message"] and "out of space" not in record["message"]


def test_a_deepspeed_job_wide_copy_restores_at_another_world_size_through_tier_1(tmp_path):
    """DeepSpeed ZeRO on two nodes: each rank stores its optimizer shard in the shared
    tier, rank 0 the model states; one node alone then restores the universal form of
    that job-wide copy (pulled into its tier 1 first)."""
    cfg = base_config(maxSteps=10, strategy={"kind": "deepspeed", "zeroStage": 1}, checkpoint={"intervalSteps": 5})
    job, codes = run_job(tmp_path, cfg, nodes=2, shared_tier=True, timeout=600)
    assert codes == [0, 0], job.logs()
    shared = tmp_path / "shared" / "step-00000010"
    manifest = json.loads((shared / "manifest.json").read_text())
    assert manifest["ranks"] == [0, 1] and manifest["world_size"] == 2
    assert {"ds/zero_pp_rank_0_mp_rank_00_optim_states.pt", "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt",
            "ds/mp_rank_00_model_states.pt"} <= set(manifest["files"])
    for node in (0, 1):  # only the job-wide copy is left
        subprocess.run(["rm", "-rf", str(tmp_path / f"node{node}" / "ckpt")], check=True)
    job2, codes = run_job(tmp_path, dict(cfg, maxSteps=12), nodes=1, shared_tier=True, timeout=600)
    assert codes == [0], job2.logs()
    logs = job2.logs()
    assert "resumed from step 10 (shared tier, universal, saved at world size 2, now 1)" in logs
    assert "pulled step 10 from the shared tier into tier 1" in logs
