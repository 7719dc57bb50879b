"""Preemptive caching with real torchrun processes: a node whose tier 1 was lost (a
replacement node's empty disk) gets the job's newest checkpoint from the shared tier at
pod start, before its rank asks, and the restore reads it from tier 1."""

from __future__ import annotations

import shutil

import pytest
from support.elastic import base_config, run_job

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

CFG = base_config(maxSteps=10, checkpoint={"intervalSteps": 5})


def test_a_node_with_an_empty_tier_1_restores_the_newest_step_from_tier_1(tmp_path):
    """(Without the prefetch, the same node pulls on demand: test_tiers.py's wiped tiers.)"""
    job, codes = run_job(tmp_path, CFG, nodes=2, shared_tier=True)
    assert codes == [0, 0], job.logs()
    shutil.rmtree(tmp_path / "node1" / "ckpt")  # node 1 is a replacement with an empty disk
    job2, codes = run_job(tmp_path, dict(CFG, maxSteps=12), nodes=2, shared_tier=True)
    assert codes == [0, 0], job2.logs()
    node1 = job2.running[1].output()
    assert [r["step"] for r in job2.steps()][-2:] == [11, 12], "resumed at 11"
    assert "llmtrain launcher: prefetched step 10 from the shared tier into tier 1" in node1, node1
    assert "pulled step 10 from the shared tier" not in node1, "the rank found the step in tier 1"
    assert "tier 1 holds the newest checkpoint already" in job2.running[0].output(), "node 0 had it"
