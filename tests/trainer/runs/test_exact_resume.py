"""SIGKILL one rank mid-run; torchrun restarts it; the run reaches the end with the
same loss at every step as an uninterrupted run.

Tolerance: 1e-6 absolute (none for three nodes, below). The runs are deterministic (same
world size, same reduction order, data addressed by global sample index), and nearly
always the losses are bitwise equal. Nearly: once in about a hundred runs on this
machine, two *uninterrupted* runs of the same job part by one float32 ulp at some step
(seen from step 4 on, before any checkpoint; CI at ``62a6fbd``), and this small model's
loss spike at step 16 magnifies that to 1e-3 by the end. Such a pair says nothing about
resuming, so a mismatch is judged before it fails the test (``_judge``): the crashed run
must have matched the reference bit for bit up to the crash, and a second uninterrupted
run must reproduce the first bit for bit; otherwise the trial is void, said so in a
warning, and run again (at most ``TRIALS`` times). A resume that restores anything wrong
(the optimizer's step count, the Adam moments, the RNG, the data position) differs in
every trial and fails.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from support.elastic import ElasticJob, base_config, losses_by_step, run_job

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

TOLERANCE = 1e-6
STEPS = 24
CRASH_STEP = 13
TRIALS = 3

CASES = {
    # DDP across two torchrun agents (nodes), one rank each.
    "ddp": dict(config=base_config(maxSteps=STEPS), nodes=2, procs_per_node=1),
    # Three nodes: from three ranks on, the order of an all-reduce's additions depends on
    # DDP's bucket layout, which the restarted processes' new wrappers must give as the
    # first did (``DDPEngine._wrap``; the in-process heal's test runs three nodes too).
    # Bit for bit: a wrapper that sums otherwise parts by less than the tolerance for
    # steps (without the settling: from step 18 on, by 1.6e-6 only at step 24).
    "ddp-3-nodes": dict(config=base_config(maxSteps=STEPS, globalBatchSize=12), nodes=3, procs_per_node=1, tolerance=0.0),
    # A fine-tune (docs/trainer.md "Fine-tuning"): the frozen base weights are restored from
    # the checkpoint's arena (or the rescue's), where they come first. (``freeze`` alone lays
    # them out the same way; tests/trainer/engines/test_finetune.py resumes it in process.)
    "ddp-lora": dict(config=base_config(maxSteps=STEPS, lora={"rank": 4}), nodes=2, procs_per_node=1),
    # DeepSpeed ZeRO-2 with two ranks on one node.
    "deepspeed-zero2": dict(
        config=base_config(maxSteps=STEPS, strategy={"kind": "deepspeed", "zeroStage": 2}), nodes=1, procs_per_node=2
    ),
    # ZeRO-3: every rank writes its own model-states file beside its optimizer shard.
    "deepspeed-zero3": dict(
        config=base_config(maxSteps=STEPS, strategy={"kind": "deepspeed", "zeroStage": 3}), nodes=1, procs_per_node=2
    ),
    # LoRA under ZeRO-3: the frozen base is partitioned too, and restored from the model states.
    "deepspeed-zero3-lora": dict(
        config=base_config(maxSteps=STEPS, strategy={"kind": "deepspeed", "zeroStage": 3}, lora={"rank": 4}),
        nodes=1, procs_per_node=2
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sigkill_of_one_rank_resumes_with_identical_losses(tmp_path, name):
    void: list[str] = []
    for trial in range(TRIALS):
        why_void = _trial(tmp_path / f"trial-{trial}", name, CASES[name])
        if why_void is None:
            for reason in void:
                warnings.warn(f"void trial of the exact-resume test ({name}): {reason}", stacklevel=1)
            return
        void.append(why_void)
    pytest.fail(f"no valid trial in {TRIALS}: " + "; ".join(void))


def _uninterrupted(root: Path, case: dict[str, Any]) -> dict[int, float]:
    job, codes = run_job(root, case["config"], nodes=case["nodes"], procs_per_node=case["procs_per_node"])
    assert codes == [0] * case["nodes"], job.logs()
    losses = {r["step"]: r["loss"] for r in job.steps()}
    assert sorted(losses) == list(range(1, STEPS + 1))
    # Every pod's termination message carries the last step and its loss, which the
    # operator shows when the job ends between two scrapes.
    for node in range(case["nodes"]):
        assert job.termination(node)["lastStep"] == {"step": STEPS, "loss": losses[STEPS]}, job.termination(node)
    return losses


def _trial(root: Path, name: str, case: dict[str, Any]) -> str | None:
    """One reference run and one crashed run: None when the crashed run's losses match,
    else why the trial is void; fails the test when the resume is what differs."""
    reference = _uninterrupted(root / "reference", case)
    job, codes = run_job(
        root / "faulty", case["config"], nodes=case["nodes"], procs_per_node=case["procs_per_node"],
        max_restarts=3, env={"LLMTRAIN_FAULT_INJECT": f"crash@step={CRASH_STEP},rank=1"},
    )
    assert codes == [0] * case["nodes"], job.logs()
    records = job.steps()
    # The crash, by the time its fault wrote down before the SIGKILL, and the crashed
    # node's torchrun agent restarting its rank (attempt 1 there). Not rank 0's records'
    # attempt: the survivor's agent may re-form its group as a membership change (its rank
    # still saving the rescue when the crashed node rejoins), which torch does not count,
    # so rank 0 can resume at attempt 0 (CI at e5b92fc, two sessions side by side).
    fired = root / "faulty" / "faults" / "faults" / "fault-0-rank-1.fired"
    assert fired.exists(), f"the crash fault never fired\n{job.logs()}"
    crashed_at = float(fired.read_text())
    assert list((root / "faulty").glob("node*/run/exit/attempt-1/local-*.started")), \
        f"the crash should have caused a torchrun restart\n{job.logs()}"
    assert any(r["time"] > crashed_at for r in records), "no step recorded after the crash"
    seen = losses_by_step(records)
    assert sorted(seen) == list(range(1, STEPS + 1))
    replayed = sorted(s for s, losses in seen.items() if len(losses) > 1)
    # Resumed from a committed checkpoint and replayed exactly the steps after it, up to
    # the crash. Which one: a save is due every 5 steps, but when a rank is still writing
    # the previous one every rank defers it to the next step that is free (a loaded machine
    # moves step 10's save to 11 or 12), and one still in flight at the crash is not used.
    resumed = [int(m) for m in re.findall(r"resumed from step (\d+) ", job.logs())]
    assert resumed and 5 <= resumed[-1] <= CRASH_STEP - 1, f"resumed from {resumed}"
    if name.startswith("ddp"):
        # The survivor's replica holds step 12 when its all-reduce fails: it saves a rescue
        # checkpoint of it, and nothing is replayed. (ZeRO shards the optimizer state: the
        # crashed rank's shard is lost, so DeepSpeed resumes from the periodic one.)
        assert resumed[-1] == CRASH_STEP - 1 and f"rescue checkpoint of step {CRASH_STEP - 1} saved" in job.logs(), resumed
    assert replayed == list(range(resumed[-1] + 1, CRASH_STEP)), f"resumed from {resumed}, replayed steps {replayed}"
    differs = _differences(reference, [(r["step"], r["loss"]) for r in records], case.get("tolerance", TOLERANCE))
    if not differs:
        return None
    return _judge(root, case, reference, job, records, differs, crashed_at)


def _differences(reference: dict[int, float], losses: list[tuple[int, float]], tolerance: float = TOLERANCE) -> dict[int, float]:
    """Step -> the largest difference from ``reference`` beyond ``tolerance``."""
    out: dict[int, float] = {}
    for step, loss in losses:
        diff = abs(loss - reference[step])
        if diff > tolerance:
            out[step] = max(diff, out.get(step, 0.0))
    return out


def _judge(root: Path, case: dict[str, Any], reference: dict[int, float], job: ElasticJob,
           records: list[dict[str, Any]], differs: dict[int, float], crashed_at: float) -> str:
    worst = max(differs, key=differs.__getitem__)
    seen = f"largest loss difference {differs[worst]:.3e} at step {worst} (first at step {min(differs)})"
    # Exactly, not within the tolerance: runs that parted by an ulp stay within 1e-6 for
    # a dozen steps (a reference at one thread against two: the first difference above
    # 1e-6 at step 15), and the losses are stored with every bit.
    before_crash = _differences(reference, [(r["step"], r["loss"]) for r in records if r["time"] < crashed_at], 0.0)
    if before_crash:
        return f"{seen}; the runs had already parted at step {min(before_crash)}, before the crash"
    again = _uninterrupted(root / "reference-again", case)
    parted = _differences(reference, sorted(again.items()), 0.0)
    if parted:
        return f"{seen}; two uninterrupted runs parted at step {min(parted)}"
    pytest.fail(f"{seen}: the uninterrupted run reproduces, the crashed run matched it up to the crash, "
                f"and the resumed attempt differs\n{job.logs()}")
