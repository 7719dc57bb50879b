"""A straggler among real torchrun ranks: the existing ``slow@`` fault paces one rank;
the ranks agree it straggles, log it, and its node's metrics endpoint reports it (what
the operator's probe reads)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from llmtrain_operator.probe import parse
from support.elastic import ElasticJob, base_config

pytestmark = pytest.mark.slow  # real multi-process torchrun runs


def test_a_rank_paced_by_slow_is_reported_as_a_straggler(tmp_path):
    cfg = base_config(maxSteps=40, faultTolerance={"hangTimeoutSeconds": 60, "collectiveTimeoutSeconds": 30,
                                                   "stragglers": {"factor": 2, "steps": 5}})
    job = ElasticJob(tmp_path, cfg, nodes=1, procs_per_node=2,
                     env={"LLMTRAIN_FAULT_INJECT": "slow@step=3,rank=1,seconds=0.3,steps=100"}).start()
    run = tmp_path / "node0" / "run"
    seen, last_error = None, None
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and seen is None:
            time.sleep(0.5)
            try:
                steps = job.steps()
                if not steps or steps[-1]["step"] < 12:
                    continue
                port = json.loads((run / "metrics-local-rank-0.json").read_text())["port"]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    probe = parse(resp.read().decode())
            except (OSError, ValueError) as err:  # a line being written, a server between attempts
                last_error = err
                continue
            seen = probe.stragglers or None
    finally:
        codes = job.wait(240)
    assert codes == [0], job.logs()
    assert seen is not None and set(seen) == {1} and seen[1] > 2, (seen, last_error)
    assert "straggler: rank 1's local step time has been" in job.logs()
    assert "straggler: rank 0" not in job.logs()
