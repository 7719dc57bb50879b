"""In-process healing (``faultTolerance.inProcessHealing``) under the real launcher,
torchrun and rendezvous store: a rank that crashes is restarted in place by its node's
torchrun agent, its peers keep their processes and their step, the replacement gets the
state from a peer (not from storage), and the losses are those of a run that never failed;
on nodes of two ranks, the failed rank's node restarts both, which heal from the other
node. Three nodes: from three ranks on, the order of an all-reduce's additions depends on DDP's
bucket layout, which a new wrapper must not change (``DDPEngine._wrap``)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from llmtrain_contract.names import Metric
from llmtrain_trainer.pod import heartbeat
from prometheus_client.parser import text_string_to_metric_families
from support.elastic import ElasticJob, base_config, losses_by_step
from support.waiting import wait_for

pytestmark = pytest.mark.slow  # real torchrun runs


def _config() -> dict:
    # A global batch that one, two and three ranks keep.
    return base_config(maxSteps=16, globalBatchSize=12, faultTolerance={"inProcessHealing": True})


def test_a_crashed_rank_is_restarted_in_place_and_its_peers_keep_their_processes_and_losses(tmp_path):
    reference = ElasticJob(tmp_path / "reference", _config(), nodes=3).start()
    assert reference.wait(300) == [0, 0, 0], reference.logs()
    # Rank 1 crashes at the start of step 7, then rank 0 (rank 0 writes the step log, and
    # the donor is then rank 1) at the start of step 12.
    # Every rank then waits at the start of step 16 (40 s, well under the hang timeout, or until
    # the test writes ``go``), while the test reads their metrics.
    job = ElasticJob(tmp_path / "healed", _config(), nodes=3, max_restarts=3,
                     env={"LLMTRAIN_FAULT_INJECT": "crash@step=7,rank=1;crash@step=12,rank=0;slow@step=16,seconds=40,until=go"}).start()
    try:
        heals = wait_for(lambda: (found := _heals(job)) == _HEALS and found, 300, 0.5, "the heals in the ranks' metrics")
        job_heals = _job_heals(job)
    finally:
        for node in job.running:
            (node.run_dir / "go").touch()
    assert job.wait(300) == [0, 0, 0], job.logs()
    assert heals == _HEALS
    # The job's count, the same on every rank, the restarted ones included (it came with the state).
    assert job_heals == {0: 2, 1: 2, 2: 2}, job_heals
    logs = job.logs()
    # Each crash: the dead rank's agent restarted it in place, its peers healed in their
    # own processes, with the state of the step before the crash sent by a survivor.
    assert len(re.findall(r"restarting them in place, their peers heal in process", logs)) == 2, logs
    healed = re.findall(r"\[rank (\d)\] .* healed in process \(pid (\d+) kept\): round \d+ formed in [\d.]+s, restarted "
                        r"rank\(s\) \[(\d)\], the state from rank (\d) at step (\d+)", logs)
    # In time order, then by rank (the logs come node by node, and any node may hold rank 0).
    healed.sort(key=lambda found: (int(found[4]), found[0]))
    assert [(rank, dead, donor, step) for rank, _, dead, donor, step in healed] == [
        ("0", "1", "0", "6"), ("2", "1", "0", "6"), ("1", "0", "1", "11"), ("2", "0", "1", "11")], logs
    # Nothing restored from storage: the new rank 1 took step 6 from rank 0, the new rank 0
    # step 11 from rank 1.
    assert "resumed from step" not in logs, logs
    replaced = re.findall(r"\[rank (\d)\] .* restarted in process: step (\d+) from rank (\d)'s memory, [\d.]+s after the round "
                          r"formed \(the group and set-up [\d.]+s, the engine and its DDP wrapper [\d.]+s, the state [\d.]+s\)", logs)
    assert sorted(replaced, key=lambda found: int(found[1])) == [("1", "6", "0"), ("0", "11", "1")], logs
    assert len(re.findall(r"healed in [\d.]+s: the round formed after [\d.]+s, the group and the DDP wrapper took [\d.]+s, "
                          r"the state [\d.]+s", logs)) == 4, logs
    # Rank 2 healed both times in one process; it and rank 1, the survivors of the second
    # crash, finished in the processes they healed in: a rank's heartbeat (written by the
    # process that ran the last step) carries that pid.
    pids = {rank: {int(pid) for r, pid, _, _, step in healed if r == rank} for rank in ("1", "2")}
    assert len(pids["2"]) == 1, healed
    for rank, (pid,) in pids.items():
        beats = [b for node in job.running for b in heartbeat.read_all(node.run_dir) if b.rank == int(rank)]
        assert [(b.pid, b.step) for b in beats] == [(pid, 16)], (rank, beats, healed)
    # Every step's loss, bit for bit, as in the run that never failed.
    assert losses_by_step(job.steps()) == {step: [loss] for step, [loss] in losses_by_step(reference.steps()).items()}


def test_a_crash_on_a_node_of_two_ranks_restarts_that_node_s_ranks_which_heal_from_the_other_node(tmp_path):
    """torch stops a node's other ranks when one fails and restarts them together: the
    agent counts both restarts first, the stopped rank gives up its round and ends without
    a rescue checkpoint, and both get the state from the other node, whose ranks keep their
    processes (before: every survivor waited 5 s for a restart nobody had counted)."""
    cfg = base_config(maxSteps=12, globalBatchSize=16, faultTolerance={"inProcessHealing": True})
    reference = ElasticJob(tmp_path / "reference", cfg, nodes=2, procs_per_node=2).start()
    assert reference.wait(300) == [0, 0], reference.logs()
    job = ElasticJob(tmp_path / "healed", cfg, nodes=2, procs_per_node=2, max_restarts=3,
                     env={"LLMTRAIN_FAULT_INJECT": "crash@step=7,rank=3"}).start()
    assert job.wait(300) == [0, 0], job.logs()
    logs = job.logs()
    assert re.findall(r"rank\(s\) \[2, 3\] failed \(exit \[[-\d, ]+\]\); restarting them in place", logs), logs
    assert re.findall(r"\[rank 2\] .* round \d+: this rank's agent restarts it and stopped it \(SIGTERM\) first", logs), logs
    healed = re.findall(r"\[rank (\d)\] .* healed in process \(pid (\d+) kept\): round \d+ formed in [\d.]+s, restarted "
                        r"rank\(s\) \[2, 3\], the state from rank 0 at step 6", logs)
    assert {rank for rank, _ in healed} == {"0", "1"}, logs
    replaced = re.findall(r"\[rank (\d)\] .* restarted in process: step 6 from rank 0's memory", logs)
    assert sorted(replaced) == ["2", "3"], logs
    # Nothing restored from storage, and the stopped rank saved no rescue checkpoint.
    assert "resumed from step" not in logs and "rescue checkpoint of step" not in logs, logs
    for rank, pid in dict(healed).items():  # the survivors finished in the processes they healed in
        beats = [b for node in job.running for b in heartbeat.read_all(node.run_dir) if b.rank == int(rank)]
        assert [(b.pid, b.step) for b in beats] == [(int(pid), 12)], (rank, beats)
    assert losses_by_step(job.steps()) == {step: [loss] for step, [loss] in losses_by_step(reference.steps()).items()}


_HEALS = {0: {"replacement": 1}, 1: {"replacement": 1, "survivor": 1}, 2: {"survivor": 2}}
"""What each rank's process counts (``Metric.HEALS``, and as many ``HEAL_SECONDS``): rank 1
restarted in place, ranks 0 and 2 healing around it; then rank 0 restarted (its new process
counts only that), ranks 1 and 2 healing around it."""


def _page(node) -> list:
    port = json.loads((node.run_dir / "metrics-local-rank-0.json").read_text())["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        return [s for family in text_string_to_metric_families(resp.read().decode()) for s in family.samples]


def _job_heals(job: ElasticJob) -> dict[int, int]:
    """Rank -> the job's heals as its page says (``Metric.HEAL_ROUNDS``)."""
    out = {}
    for node in job.running:
        samples = _page(node)
        rank = next(int(s.labels["rank"]) for s in samples if s.name == Metric.INFO)
        out[rank] = next(int(s.value) for s in samples if s.name == Metric.HEAL_ROUNDS)
    return out


def _heals(job: ElasticJob) -> dict[int, dict[str, int]]:
    """Rank -> role -> heals, from each node's trainer (one rank per node); the heals
    counted must each have a duration counted."""
    found: dict[int, dict[str, int]] = {}
    for node in job.running:
        samples = _page(node)
        rank = next(int(s.labels["rank"]) for s in samples if s.name == Metric.INFO)
        counted = {s.labels["role"]: int(s.value) for s in samples if s.name == Metric.total(Metric.HEALS)}
        timed = {s.labels["role"]: int(s.value) for s in samples if s.name == f"{Metric.HEAL_SECONDS}_count"}
        assert counted == timed, (rank, counted, timed)
        found[rank] = counted
    return found


@pytest.mark.parametrize("procs", [1, 2], ids=["1-rank-nodes", "2-rank-nodes"])
def test_a_node_lost_whole_is_replaced_by_a_node_that_takes_its_seat_and_heals_from_the_survivors(tmp_path, procs):
    """A job that cannot go on without the node (``--nnodes`` 2:2): its survivors keep their
    processes and offer the lost node's seat; the node that replaces it (started 6 s later,
    after the survivors have taken the node for lost) takes the seat instead of joining
    torchrun's rendezvous, and its ranks get the step from a survivor's memory. Nothing
    restored, the survivors' processes finish the run, every loss as in a run that never
    failed."""
    import time

    cfg = base_config(maxSteps=16, globalBatchSize=8, faultTolerance={"inProcessHealing": True})
    reference = ElasticJob(tmp_path / "reference", cfg, nodes=2, procs_per_node=procs).start()
    assert reference.wait(300) == [0, 0], reference.logs()
    job = ElasticJob(tmp_path / "healed", cfg, nodes=2, procs_per_node=procs, max_restarts=3,
                     env={"LLMTRAIN_FAULT_INJECT": "slow@step=1,seconds=0.3,steps=1000"}).start()
    try:
        wait_for(lambda: len(job.steps()) >= 6 or any(n.proc.poll() is not None for n in job.running), 240, 0.2,
                 "six steps")
        job.kill_node(1)
        time.sleep(6)
        job.replace_node(1)
        assert job.wait(300) == [0, 0], job.logs()
    finally:
        job.kill()
    logs = job.logs()
    lost = list(range(procs, 2 * procs))  # node 1's ranks, whichever group rank torchrun gave it
    taken = re.findall(r"took the seat of a lost node \(group rank (\d) of 2, ranks \[([\d, ]+)\]", logs)
    assert len(taken) == 1, logs
    seat_ranks = [int(r) for r in taken[0][1].split(", ")]
    assert re.search(rf"rank\(s\) \[{', '.join(map(str, seat_ranks))}\] are restarted by no agent [\d.]+s after the failure: "
                     rf"their node \(group rank {taken[0][0]}, agent [^)]+\) is taken for lost; its seat is offered", logs), logs
    survivors = sorted(set(range(2 * procs)) - set(seat_ranks))
    assert len(survivors) == procs and len(lost) == procs
    healed = re.findall(r"\[rank (\d)\] .* healed in process \(pid (\d+) kept\): round \d+ formed in [\d.]+s, restarted "
                        rf"rank\(s\) \[{', '.join(map(str, seat_ranks))}\], the state from rank (\d) at step (\d+)", logs)
    assert sorted(int(rank) for rank, *_ in healed) == survivors, logs
    donor, step = healed[0][2], healed[0][3]
    replaced = re.findall(rf"\[rank (\d)\] .* restarted in process: step {step} from rank {donor}'s memory", logs)
    assert sorted(int(r) for r in replaced) == seat_ranks, logs
    assert "resumed from step" not in logs, logs  # nothing restored from storage
    # Nothing re-formed by torchrun: the survivors finished in the processes they healed in.
    for rank, pid, *_ in healed:
        beats = [b for node in job.running for b in heartbeat.read_all(node.run_dir) if b.rank == int(rank)]
        assert [(b.pid, b.step) for b in beats] == [(int(pid), 16)], (rank, beats)
    assert losses_by_step(job.steps()) == {step: [loss] for step, [loss] in losses_by_step(reference.steps()).items()}


def test_a_node_lost_with_its_rank_falls_back_to_restarting_and_the_job_finishes_without_it(tmp_path):
    """No agent restarts a rank whose whole node is gone, and the job may go on without it
    (``--nnodes`` 1:2): the survivor gives up on healing after ``ANNOUNCE_SECONDS`` and
    recovers as without healing, at world size 1, sooner than a replacement would come."""
    import json
    import time

    cfg = base_config(maxSteps=40, faultTolerance={"inProcessHealing": True})
    job = ElasticJob(tmp_path / "job", cfg, nodes=2, min_nodes=1, max_restarts=3,
                     env={"LLMTRAIN_FAULT_INJECT": "slow@step=1,seconds=0.3,steps=1000"}).start()
    try:
        deadline = time.monotonic() + 240
        while len(job.steps()) < 6:
            assert time.monotonic() < deadline and all(n.proc.poll() is None for n in job.running), job.logs()
            time.sleep(0.5)
        job.kill_node(1)
        survivor = job.running[0]
        assert survivor.proc.wait(timeout=240) == 0, job.logs()
    finally:
        job.kill()
    log = survivor.output()
    assert re.search(r"healing in process failed: round \d+: rank\(s\) \[\d\] are restarted by no agent", log), log
    assert re.search(r"resumed from step \d+ .*now 1\)", log), log
    steps = [json.loads(line) for line in (survivor.run_dir / "steps.jsonl").read_text().splitlines()]
    assert steps[-1]["step"] == 40, steps[-1]
