"""Rescue checkpoints under real torchrun: when a peer freezes, the survivor's replica
still holds the last step; it saves that step into its tier 1 and the restarted group
resumes there, so no step is trained twice (the periodic checkpoint is further back).

The crash case (the survivor's all-reduce raises at once) is in test_exact_resume.py,
which also shows the rescued run's losses are the uninterrupted run's."""

from __future__ import annotations

import json
import re

import pytest
from support.elastic import ElasticJob, base_config, losses_by_step, run_job
from support.waiting import wait_for

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

# Not shorter: beside the cluster suites a step here once took more than 8 s (a burst of
# 42 runnable processes on two cores), judged a second hang after the real one was
# rescued, and the run resumed from step 17 (make test at bf0f8af).
HANG_TIMEOUT = 20
# Periodic checkpoints every 10 steps; the fault comes at the start of step 17, so the
# newest periodic one is step 10 and the survivor holds step 16.
CFG = base_config(maxSteps=24, checkpoint={"intervalSteps": 10},
                  faultTolerance={"hangTimeoutSeconds": HANG_TIMEOUT, "collectiveTimeoutSeconds": 60})


def _rescued(root, node: int) -> dict:
    return json.loads((root / f"node{node}" / "ckpt" / "step-00000016" / "manifest.json").read_text())


def _check_resumed_at_16(job) -> None:
    logs = job.logs()
    resumed = [int(m) for m in re.findall(r"resumed from step (\d+) ", logs)]
    assert resumed and resumed[-1] == 16, f"resumed from {resumed}\n{logs}"
    assert "rescue checkpoint of step 16 saved into tier 1" in logs, logs
    seen = losses_by_step(job.steps())
    assert sorted(seen) == list(range(1, 25))
    assert not [s for s, losses in seen.items() if len(losses) > 1], "steps were trained twice"


def test_a_frozen_peer_on_another_node_costs_no_step(tmp_path):
    """Two nodes, one rank each; rank 1 is SIGSTOPped. Its node's supervisor kills it (the
    cause); rank 0 is saved by its own supervisor's request or by its all-reduce failing
    once rank 1 is gone, whichever comes first."""
    job, codes = run_job(tmp_path, CFG, nodes=2, max_restarts=2, env={"LLMTRAIN_FAULT_INJECT": "stop@step=17,rank=1"})
    assert codes == [0, 0], job.logs()
    _check_resumed_at_16(job)
    holders = [n for n in (0, 1) if (tmp_path / f"node{n}" / "ckpt" / "step-00000016").exists()]
    assert holders, "no node holds the rescued step"
    manifest = _rescued(tmp_path, holders[0])
    assert manifest["rescue"] is True and manifest["world_size"] == 2


def test_the_supervisor_asks_the_victim_for_its_rescue_checkpoint(tmp_path):
    """One node, two ranks: the supervisor judges both in one pass, kills the frozen cause
    and asks the victim (the node leader, which holds the replicated state) for a rescue
    checkpoint instead of killing it."""
    job, codes = run_job(tmp_path, CFG, nodes=1, procs_per_node=2, max_restarts=2,
                         env={"LLMTRAIN_FAULT_INJECT": "stop@step=17,rank=1"})
    assert codes == [0], job.logs()
    assert re.search(r"asked rank 0 \(pid \d+\) for a rescue checkpoint \(its last finished step: 16;", job.logs()), job.logs()
    _check_resumed_at_16(job)
    manifest = _rescued(tmp_path, 0)
    # Rank 1 was the frozen one: only the leader's part (the state and its RNG) is in it.
    assert manifest["rescue"] is True and manifest["ranks"] == [0], manifest
    exits = json.loads((tmp_path / "node0" / "run" / "exit" / "attempt-0" / "local-0.json").read_text())
    assert exits["message"].startswith("victim: rank 0 "), exits


def test_a_victim_whose_cause_lives_on_saves_its_rescue_checkpoint_on_request(tmp_path):
    """The cause is never killed (its node's launcher, and so its supervisor, is frozen
    too, as in a partition): the victim's all-reduce just waits. Its supervisor asks it for
    the rescue checkpoint, which its watchdog thread saves while the training thread stays
    blocked; it ends, and its node trains on alone."""
    job = ElasticJob(tmp_path, CFG, nodes=2, min_nodes=1, max_restarts=2,
                     node_env={1: {"LLMTRAIN_FAULT_INJECT": "stop@step=17,target=launcher;stop@step=17"}}).start()
    try:
        # Whichever node and rank the rendezvous gave the victim, its tier 1 holds the
        # rescue; read it before node 1 goes (its loss is a peer failure too, rescued in
        # turn, and tier 1's retention may then drop step 16).
        (holder,) = wait_for(lambda: _rescue_holder(tmp_path), 120, 0.2, "a node's tier 1 holds the rescued step 16")
        rescued = _rescued(tmp_path, holder)
        wait_for(lambda: re.search(r"resumed from step \d+ ", job.logs()), 120, 0.5, "the group resumed")
    except BaseException:
        job.kill()  # every node and the store: nothing outlives a failed test
        raise
    job.kill_node(1)
    codes = job.wait(300)
    assert codes[0] == 0, job.logs()
    victim = job.running[holder].output()
    assert "the supervisor judged this rank a victim of a peer that stopped; rescue checkpoint of step 16 saved" in victim, victim
    assert "resumed from step 16 " in job.logs(), job.logs()
    assert rescued["rescue"] is True


def _rescue_holder(root) -> tuple[int] | None:
    """(the node whose tier 1 holds a committed rescue checkpoint of step 16,), if any (a
    tuple: node 0 must not read as "not yet")."""
    for node in (0, 1):
        folder = root / f"node{node}" / "ckpt" / "step-00000016"
        if (folder / "COMMITTED").exists() and _rescued(root, node).get("rescue"):
            return (node,)
    return None


def test_a_peer_stopped_after_its_update_leaves_the_victim_one_step_further_and_that_step_is_rescued(tmp_path):
    """Rank 1 stops after step 17's optimizer update, before the per-step agreement: rank 0
    applied the same update and blocks in the agreement. Its state is step 17's, whose loss
    the ranks never agreed on; its own loss passes the loss guard and every parameter is
    finite, so it saves step 17, and the next attempt starts at step 18."""
    job, codes = run_job(tmp_path, CFG, nodes=1, procs_per_node=2, max_restarts=2,
                         env={"LLMTRAIN_FAULT_INJECT": "stop@step=17,rank=1,at=agree"})
    assert codes == [0], job.logs()
    logs = job.logs()
    assert "rescue checkpoint of step 17 saved into tier 1" in logs, logs
    resumed = [int(m) for m in re.findall(r"resumed from step (\d+) ", logs)]
    assert resumed and resumed[-1] == 17, f"resumed from {resumed}"
    seen = losses_by_step(job.steps())
    # Step 17 was trained once; its loss was never agreed, so no rank logged it.
    assert sorted(seen) == [s for s in range(1, 25) if s != 17], sorted(seen)
    assert not [s for s, losses in seen.items() if len(losses) > 1], "steps were trained twice"
