"""The launcher's termination message: the pod's exit code and reason from the ranks' exit
records, and the newest committed step per tier (the final checkpoint is committed after
the last metrics scrape the operator could see)."""

from __future__ import annotations

import json
from pathlib import Path

from llmtrain_trainer.pod import exitrecord
from llmtrain_trainer.launch.launcher import agent_command, agent_error, decide


def test_a_success_reports_the_newest_commit_per_tier_over_the_local_ranks(tmp_path):
    exitrecord.write(tmp_path, 0, 0, 0, 0, "success", 40, {"local": 40, "s3": 40, "shared": 30})
    exitrecord.write(tmp_path, 0, 1, 1, 0, "success", 40, {"local": 30})
    exitrecord.write(tmp_path, 0, 2, 2, 0, "success", 40)
    code, message = decide(0, exitrecord.read_attempt(tmp_path, 0))
    assert code == 0
    assert message == {"code": 0, "reason": "Completed", "checkpoints": {"local": 40, "s3": 40, "shared": 30}}


def test_a_failure_keeps_its_cause_and_reports_the_commits_too(tmp_path):
    exitrecord.write(tmp_path, 1, 3, 0, 80, "no step progress for 31.0s", 17, {"local": 10})
    code, message = decide(1, exitrecord.read_attempt(tmp_path, 1))
    assert code == 80 and message["rank"] == 3 and message["step"] == 17
    assert message["checkpoints"] == {"local": 10}


def test_the_last_step_and_its_loss_come_from_the_rank_furthest_along(tmp_path):
    exitrecord.write(tmp_path, 0, 0, 0, 0, "success", 40, loss=2.5)
    exitrecord.write(tmp_path, 0, 1, 1, 0, "success", 39, loss=2.75)
    exitrecord.write(tmp_path, 0, 2, 2, 0, "success", 41, loss=float("nan"))  # never written
    exitrecord.write(tmp_path, 0, 3, 3, 1, "crash", None)  # before its first step
    assert "loss" not in json.loads((tmp_path / "exit" / "attempt-0" / "local-2.json").read_text())
    _, message = decide(0, exitrecord.read_attempt(tmp_path, 0))
    assert message["lastStep"] == {"step": 40, "loss": 2.5}
    _, without = decide(0, [{"rank": 0, "code": 0, "step": 40}])
    assert "lastStep" not in without


def test_without_records_nothing_is_invented():
    assert decide(0, []) == (0, {"code": 0, "reason": "Completed"})
    code, message = decide(-9, [])
    assert code == 137 and "checkpoints" not in message


def test_torchruns_own_error_names_every_cause_when_no_rank_wrote_a_record(tmp_path):
    # What torch's @record writes for an agent that could not reach the rendezvous store.
    stack = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    connect()\n"
             "torch.distributed.DistNetworkError: The client socket has timed out while trying to connect to (10.0.0.9, 29400).\n\n"
             "The above exception was the direct cause of the following exception:\n\nTraceback (most recent call last):\n"
             "  File \"y.py\", line 2, in g\n    raise RendezvousConnectionError(msg) from e\n"
             "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed.\n")
    error = tmp_path / "torchrun-error.json"
    error.write_text(json.dumps({"message": {"message": "RendezvousConnectionError: The connection to the C10d store has failed.",
                                             "extraInfo": {"py_callstack": stack, "timestamp": "1"}}}))
    said = agent_error(error)
    assert said == ("DistNetworkError: The client socket has timed out while trying to connect to (10.0.0.9, 29400). <- "
                    "RendezvousConnectionError: The connection to the C10d store has failed.")
    code, message = decide(1, [], torchrun_error=said)
    assert code == 1 and message["message"] == f"torchrun exited without an exit record: {said}"
    # One exception, no chain: its own message.
    error.write_text(json.dumps({"message": {"message": "RendezvousClosedError: ", "extraInfo": {"py_callstack": "Traceback ...\n"}}}))
    assert agent_error(error) == "RendezvousClosedError:"
    for broken in ("", "{", "[]", '{"message": 3}'):
        error.write_text(broken)
        assert agent_error(error) in (None, "3")
    assert agent_error(tmp_path / "absent.json") is None


def test_the_launcher_runs_torchrun_as_the_agent_that_leaves_the_rendezvous_open():
    torchrun = ["/usr/bin/python3", "-m", "torch.distributed.run", "--nnodes=1:2", "-m", "llmtrain_trainer"]
    command = agent_command(torchrun)
    assert command[0] == "/usr/bin/python3" and command[2:] == torchrun[3:]
    assert Path(command[1]).name == "torchrun_agent.py" and Path(command[1]).is_file()
    other = ["/usr/bin/python3", "train.py"]
    assert agent_command(other) == other


def test_a_rank_the_oom_killer_ended_names_the_pods_end_with_the_peak_and_the_limit(tmp_path):
    from llmtrain_trainer.pod.memcg import Memory

    # Local rank 1 died without a record; rank 0 then timed out in a collective (a victim).
    exitrecord.write(tmp_path, 2, 0, 0, 83, "collective timed out", 30, {"local": 20})
    records = exitrecord.read_attempt(tmp_path, 2)
    code, message = decide(1, records, oom=(1, Memory(1, 3 << 30, 4 << 30)))
    assert code == 137 and message["reason"] == "OOMKilled"
    assert message["oom"] == {"kills": 1, "peakBytes": 3 << 30, "limitBytes": 4 << 30}
    assert "memory peak 3.0 GiB of its limit 4.0 GiB" in message["message"] and "resources.limits.memory" in message["message"]
    assert message["checkpoints"] == {"local": 20}
    # No limit: the node ran out; no peak known (v2 before Linux 5.19).
    _, unlimited = decide(1, [], oom=(2, Memory(5, None, None)))
    assert "2 kills" in unlimited["message"] and "peak unknown (it has no limit" in unlimited["message"]
    # A permanent error or a hang explains the failure better than a kill; no kill, no claim.
    exitrecord.write(tmp_path, 3, 1, 1, 80, "no step progress", 31)
    assert decide(1, exitrecord.read_attempt(tmp_path, 3), oom=(1, Memory(1, 1, 2)))[1]["reason"] == "Hang"
    assert "oom" not in decide(1, records, oom=(0, Memory(0, 1, 2)))[1]
