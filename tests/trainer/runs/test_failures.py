"""Hangs, SIGTERM and bad input: each ends with its documented exit code; a node lost
whole leaves the rendezvous through its lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from llmtrain_contract.exitcodes import ExitCode
from support.elastic import ElasticJob, base_config, free_port, run_job
from support.waiting import wait_for

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

HANG_TIMEOUT = 8


def test_injected_hang_is_detected_within_timeout_plus_5s(tmp_path):
    cfg = base_config(maxSteps=40, faultTolerance={"hangTimeoutSeconds": HANG_TIMEOUT, "collectiveTimeoutSeconds": 60})
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=2, env={"LLMTRAIN_FAULT_INJECT": "hang@step=6,rank=1"})
    assert codes == [ExitCode.HANG], job.logs()
    fired = float((tmp_path / "faults" / "faults" / "fault-0-rank-1.fired").read_text())
    record = json.loads((tmp_path / "node0" / "run" / "exit" / "attempt-0" / "local-1.json").read_text())
    assert record["code"] == ExitCode.HANG
    # The watchdog counts from the last heartbeat (the end of the last step), which comes
    # a moment before the fault fires at the start of the next one: the lower bound is
    # measured from that step, the upper bound (what a user waits) from the fault. Rank 0
    # logs the step a few milliseconds after rank 1's heartbeat, hence the small slack.
    last_step = job.steps()[-1]
    assert last_step["step"] == 5
    assert HANG_TIMEOUT - 0.25 <= record["time"] - last_step["time"], (record["time"], last_step)
    assert record["time"] - fired <= HANG_TIMEOUT + 5, record["time"] - fired
    logs = job.logs()
    # The launcher's supervisor saw it first, from outside: rank 1 blocked outside any
    # collective is the cause, rank 0 waiting for it in a collective is the victim.
    assert record["message"].startswith("cause (stuck): rank 1 "), record
    victim = json.loads((tmp_path / "node0" / "run" / "exit" / "attempt-0" / "local-0.json").read_text())
    assert victim["code"] == ExitCode.COLLECTIVE_TIMEOUT and victim["message"].startswith("victim: rank 0 "), victim
    assert "stacks of rank 1 (py-spy" in logs and "_fire (" in logs, logs
    assert job.termination(0)["reason"] == "Hang" and job.termination(0)["rank"] == 1


FROZEN_CASES = {
    # kind: (the fault, the verdict, a function the cause's stack must show)
    "stop": ("stop@step=6,rank=1", "frozen", "_fire ("),
    "gil": ("gil@step=6,rank=1", "spinning", "match ("),
}


@pytest.mark.parametrize("case", sorted(FROZEN_CASES))
def test_a_frozen_or_gil_holding_rank_is_blamed_from_outside_and_its_peer_is_a_victim(tmp_path, case):
    """The rank's own watchdog thread cannot act here (stopped with its process, or starved
    of the GIL): the launcher's supervisor does, within the timeout plus 5 s."""
    fault, verdict, frame = FROZEN_CASES[case]
    cfg = base_config(maxSteps=40, faultTolerance={"hangTimeoutSeconds": HANG_TIMEOUT, "collectiveTimeoutSeconds": 60})
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=2, env={"LLMTRAIN_FAULT_INJECT": fault})
    assert codes == [ExitCode.HANG], job.logs()
    fired = float((tmp_path / "faults" / "faults" / "fault-0-rank-1.fired").read_text())
    folder = tmp_path / "node0" / "run" / "exit" / "attempt-0"
    cause = json.loads((folder / "local-1.json").read_text())
    victim = json.loads((folder / "local-0.json").read_text())
    assert cause["code"] == ExitCode.HANG and cause["message"].startswith(f"cause ({verdict}): rank 1 "), cause
    assert victim["code"] == ExitCode.COLLECTIVE_TIMEOUT and victim["message"].startswith("victim: rank 0 "), victim
    assert cause["time"] - fired <= HANG_TIMEOUT + 5, cause["time"] - fired
    logs = job.logs()
    assert "stacks of rank 1 (py-spy" in logs and frame in logs, logs
    termination = job.termination(0)
    assert termination["reason"] == "Hang" and termination["rank"] == 1 and verdict in termination["message"]


def test_the_launcher_reports_in_place_hang_and_gpu_oom_restarts_and_the_restarted_trainer_agrees(tmp_path):
    """torchrun restarts the group after the hang: the launcher counts the failed attempt
    as soon as the next one starts (the operator reads it there, before the restarted
    trainer is up), and the trainer, once up, reports the same count. Then a rank runs out
    of GPU memory (torch's own error, raised in the step: this machine has no GPU): it
    exits 88 with its memory plan, and the attempt counts as ``gpu_oom``, not a crash."""
    from llmtrain_operator.probe import scrape, scrape_launcher
    from llmtrain_trainer.pod import exitrecord

    cfg = base_config(maxSteps=24, faultTolerance={"hangTimeoutSeconds": HANG_TIMEOUT, "collectiveTimeoutSeconds": 60})
    faults = "hang@step=4,rank=1;gpu_oom@step=12,rank=0;slow@step=1,seconds=0.3,steps=400"
    job = ElasticJob(tmp_path, cfg, nodes=1, procs_per_node=2, max_restarts=2, health_port=free_port(),
                     env={"LLMTRAIN_FAULT_INJECT": faults}).start()
    try:
        launcher = f"http://127.0.0.1:{job.health_port}/metrics"
        counted = lambda: (report := scrape_launcher(launcher)) and report.failed  # noqa: E731
        wait_for(lambda: (counted() or {}).get("hang") == 1, 120, 0.2, "the launcher counting the hang")
        # No gpu_oom yet, and none reported at 0 (an older operator refuses the cause).
        assert counted() == {"crash": 0, "hang": 1, "victim": 0, "preempted": 0, "permanent": 0}, counted()
        assert job.running[0].proc.poll() is None, "counted while the pod runs on"
        wait_for(lambda: (counted() or {}).get("gpu_oom") == 1, 120, 0.2, "the launcher counting the GPU OOM")
        assert counted() == {"crash": 0, "hang": 1, "victim": 0, "preempted": 0, "permanent": 0, "gpu_oom": 1}, counted()

        def trainer_count():
            endpoint = json.loads((tmp_path / "node0" / "run" / "metrics-local-rank-0.json").read_text())
            probe = scrape(f"http://{endpoint['host']}:{endpoint['port']}/metrics", timeout=1)
            return probe is not None and probe.restarts == 2 and probe.failed_attempts.get("gpu_oom") == 1 and probe
        probe = wait_for(trainer_count, 120, 0.2, "the restarted trainer reporting both")
        assert probe.failed_attempts == counted(), probe.failed_attempts
    finally:
        codes = job.wait()
    assert codes == [0], job.logs()
    records = {r["rank"]: r for r in exitrecord.read_attempt(tmp_path / "node0" / "run", 1)}
    assert records[0]["code"] == ExitCode.GPU_OUT_OF_MEMORY, records
    message = records[0]["message"]
    assert message.startswith("rank 0 ran out of GPU memory: OutOfMemoryError: CUDA out of memory. Tried to allocate"), message
    import torch

    figures = "the allocator's peak" if torch.cuda.is_available() else "no CUDA figures"
    assert figures in message and "the memory plan at world size 2: peak " in message, message
    assert exitrecord.attempt_cause(tmp_path / "node0" / "run", 1, 2) == "gpu_oom", "its peer's end does not outrank it"


def test_a_stopped_torchrun_agent_ends_the_pod_with_the_hang_code(tmp_path):
    cfg = base_config(maxSteps=400, faultTolerance={"hangTimeoutSeconds": HANG_TIMEOUT, "collectiveTimeoutSeconds": 60})
    faults = "stop@step=6,rank=0,target=agent;slow@step=1,seconds=0.3,steps=400"
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=2, env={"LLMTRAIN_FAULT_INJECT": faults})
    fired = float((tmp_path / "faults" / "faults" / "fault-0-rank-0.fired").read_text())
    assert codes == [ExitCode.HANG], job.logs()
    termination = job.termination(0)
    assert termination["reason"] == "Hang" and "torchrun agent" in termination["message"], termination
    assert job.steps()[-1]["step"] < 400, "the pod was ended, not left to finish without its agent"
    assert (tmp_path / "node0" / "termination-log").stat().st_mtime - fired <= HANG_TIMEOUT + 5 + 3


def test_sigterm_writes_an_emergency_checkpoint_and_the_next_run_loses_at_most_one_step(tmp_path):
    # No regular checkpoint before the signal: whatever resumes came from the emergency save.
    cfg = base_config(maxSteps=400, checkpoint={"intervalSteps": 1000, "sigtermBudgetSeconds": 20})
    job = ElasticJob(tmp_path, cfg, nodes=1, procs_per_node=2).start()
    steps_file = tmp_path / "node0" / "run" / "steps.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        lines = steps_file.read_text().splitlines() if steps_file.exists() else []
        if len(lines) >= 8:
            break
        time.sleep(0.2)
    else:
        job.kill()
        raise AssertionError("no progress:\n" + job.logs())
    last_before = json.loads(steps_file.read_text().splitlines()[-1])["step"]
    os.kill(job.running[0].proc.pid, signal.SIGTERM)  # the launcher, as the kubelet would
    codes = job.wait(timeout=120)
    assert codes == [ExitCode.PREEMPTED], job.logs()
    assert job.termination(0)["reason"] == "Preempted"
    saved = sorted((tmp_path / "node0" / "ckpt").glob("step-*"))
    assert len(saved) == 1 and (saved[0] / "COMMITTED").exists()
    saved_step = int(saved[0].name.split("-")[1])
    assert saved_step >= last_before, (saved_step, last_before)

    job2, codes = run_job(tmp_path, dict(cfg, maxSteps=saved_step + 3), nodes=1, procs_per_node=2)
    assert codes == [0], job2.logs()
    assert f"resumed from step {saved_step} " in job2.logs()
    assert [r["step"] for r in job2.steps()][-3:] == [saved_step + 1, saved_step + 2, saved_step + 3]


def _trainer(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLMTRAIN_RUN_DIR": str(tmp_path / "run")}
    return subprocess.run(
        [sys.executable, "-m", "llmtrain_trainer", "--config", str(config)],
        capture_output=True, text=True, timeout=120, env=env,
    )


def test_an_invalid_config_exits_with_the_permanent_config_code_naming_the_field(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(base_config(maxSteps=-3)))
    result = _trainer(config, tmp_path)
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "maxSteps" in result.stderr and "greater than or equal to 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_config_file_is_a_config_error(tmp_path):
    result = _trainer(tmp_path / "nope.yaml", tmp_path)
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "cannot read config" in result.stderr and "nope.yaml" in result.stderr


def test_a_missing_data_file_exits_with_the_data_code_naming_the_path(tmp_path):
    cfg = base_config(data={"source": "shards", "path": str(tmp_path / "missing-shards"), "seqLen": 32})
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=1)
    assert codes == [ExitCode.DATA_ERROR], job.logs()
    assert f"data path {tmp_path / 'missing-shards'} does not exist" in job.logs()
    assert job.termination(0)["reason"] == "DataError"


def test_a_world_size_that_breaks_the_global_batch_is_a_clear_permanent_error(tmp_path):
    job, codes = run_job(tmp_path, base_config(globalBatchSize=8, microBatchSize=2), nodes=1, procs_per_node=3)
    assert codes == [ExitCode.WORLD_SIZE_INVALID], job.logs()
    assert "world size 3 cannot keep globalBatchSize=8" in job.logs()


def test_the_builtin_shard_trains(tmp_path):
    cfg = base_config(maxSteps=6, data={"source": "shards", "path": "builtin:tiny", "seqLen": 32})
    job, codes = run_job(tmp_path, cfg, nodes=1, procs_per_node=1)
    assert codes == [0], job.logs()
    assert [r["step"] for r in job.steps()] == list(range(1, 7))


def test_a_node_that_dies_whole_leaves_the_rendezvous_through_its_lease_and_the_survivor_trains_on(tmp_path):
    # Two local nodes; the one not holding rank 0 loses its whole process tree (launcher,
    # torchrun, fork server, ranks), as a pod SIGKILLed whole. Its launcher's lease on the
    # store ends with it: the store takes its agent out of the rendezvous while the
    # survivor still runs (the survivor's own lease ends only when it finishes).
    cfg = base_config(maxSteps=40)
    job = ElasticJob(tmp_path, cfg, nodes=2, min_nodes=1, max_restarts=3,
                     env={"LLMTRAIN_FAULT_INJECT": "slow@step=1,seconds=0.3,steps=400"}).start()
    try:
        holder = wait_for(lambda: next((n for n in job.running if (n.run_dir / "steps.jsonl").exists()
                                        and len((n.run_dir / "steps.jsonl").read_text().splitlines()) >= 5), None),
                          240, 0.2, "five steps at world size 2")
        job.kill_node(1 - holder.index)
        wait_for(lambda: "is gone: removed from rendezvous 'test-job'" in job.store_log.read_text(), 10, 0.1,
                 "the killed node's agent released by its lease")
        assert holder.proc.poll() is None, "released while the survivor runs, not at its end"
        codes = [holder.proc.wait(timeout=240)]
    finally:
        job.kill()
    assert codes == [0], job.logs()
    after = [s for s in job.steps() if s["attempt"] >= 1]  # torchrun's restart after the loss
    assert after and all(s["world"] == 1 for s in after), after[:3]
    assert after[-1]["step"] == 40
    # The survivor was the only lease holder left: the store completed its round without
    # the 1 s last call.
    assert "complete: all 1 lease holders joined (1 nodes)" in job.store_log.read_text(), job.store_log.read_text()


def test_a_node_whose_torchrun_gives_up_leaves_the_rendezvous_open_and_the_others_train_on(tmp_path):
    # Node 1's torchrun may not restart its ranks (--max-restarts=0): its rank's crash at
    # step 8 ends its agent with a failure. (The crash is set on node 1, not on a rank: the
    # rendezvous gives either node rank 1, and node 0 would simply restart it in place.) Plain torchrun then marks the job's rendezvous
    # closed, and node 0, re-forming its group after the lost peer, would fail with
    # RendezvousClosedError (as would every replacement node). Run as torchrun_agent.py,
    # the failed agent leaves it open: node 0 goes on alone and finishes.
    cfg = base_config(maxSteps=30)
    pace = "slow@step=1,seconds=0.2,steps=400"
    job = ElasticJob(tmp_path, cfg, nodes=2, min_nodes=1, max_restarts=3, node_max_restarts={1: 0},
                     env={"LLMTRAIN_FAULT_INJECT": pace},
                     node_env={1: {"LLMTRAIN_FAULT_INJECT": f"crash@step=8;{pace}"}}).start()
    try:
        codes = [node.proc.wait(timeout=240) for node in job.running]
    finally:
        job.kill()
    logs = job.logs()
    assert codes[0] == 0 and codes[1] != 0, logs
    assert "RendezvousClosedError" not in logs, logs
    assert "the rendezvous stays open" in job.running[1].output(), logs
    steps = job.steps()
    assert steps[-1]["step"] == 30 and steps[-1]["world"] == 1, steps[-3:]


def test_a_regrouped_survivor_admits_a_replacement_only_after_its_first_step_and_keeps_that_step(tmp_path):
    # Node 1 dies whole at world size 2. Node 0's torchrun re-forms its group alone
    # (attempt 1), whose ranks are held in their start-up (a fault, attempt 1 only) until
    # a replacement node 1 is waiting to join: the test releases them once the agent says
    # it holds the newcomer back (a fixed start-up of 6 s was not enough for the
    # replacement to arrive on a loaded machine: CI at e5b92fc). Plain torchrun restarts
    # the group for the newcomer at once, killing ranks that had not even started (no step at world size 1, one more start-up
    # and restore). The agent holds the newcomer back until the group has finished a step;
    # the restart for it then stops at a step boundary with an emergency checkpoint, so the
    # world-size-2 group goes on from that step.
    cfg = base_config(maxSteps=40)
    # The start-up pause ends at 45 s at the latest, within the agent's 60 s hold.
    faults = "slow@step=1,seconds=0.3,steps=400;slow@step=0,seconds=45,attempt=1,until=admit"
    job = ElasticJob(tmp_path, cfg, nodes=2, min_nodes=1, max_restarts=3, env={"LLMTRAIN_FAULT_INJECT": faults}).start()
    try:
        holder = wait_for(lambda: next((n for n in job.running if (n.run_dir / "steps.jsonl").exists()
                                        and len((n.run_dir / "steps.jsonl").read_text().splitlines()) >= 5), None),
                          240, 0.2, "five steps at world size 2")
        lost = 1 - holder.index
        killed_at = time.time()
        job.kill_node(lost)
        # The survivor's group re-formed: its rank marks itself started in attempt 1.
        wait_for(lambda: (holder.run_dir / "exit" / "attempt-1" / "local-0.started").exists(), 60, 0.1,
                 "the survivor's re-formed group starting")
        job.replace_node(lost)
        # Fails, naming it, when the agent restarts the group for the newcomer at once (or
        # the replacement never came to wait).
        wait_for(lambda: "node(s) waiting to join; admitted once this group has finished a step" in holder.output(),
                 40, 0.1, "the survivor's agent holding the waiting replacement back until a step")
        (holder.run_dir / "admit").touch()
        codes = [node.proc.wait(timeout=240) for node in job.running]
    finally:
        job.kill()
    logs = job.logs()
    assert codes == [0, 0], logs
    after = [s for s in job.steps() if s["time"] > killed_at]
    alone = [s for s in after if s["world"] == 1]
    assert alone, f"no step at world size 1 before the replacement was admitted: {after[:4]}"
    together = [s for s in after if s["world"] == 2 and s["time"] > alone[-1]["time"]]
    assert together and together[0]["step"] == alone[-1]["step"] + 1, (alone, together[:2])
    assert together[-1]["step"] == 40
