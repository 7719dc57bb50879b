"""The pod's fork server (``llmtrain_trainer.launch.zygote``) under real torchrun runs: the ranks
are forked children of the server, a rank restarted in place is forked again, and the
process torchrun started stands in for its rank both ways (signals in, exit out)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from llmtrain_contract.names import Env
from llmtrain_trainer.launch import attempts
from llmtrain_trainer.pod import heartbeat
from support.elastic import ElasticJob, base_config
from support.waiting import wait_for

pytestmark = pytest.mark.slow  # real multi-process torchrun runs

PACE = "slow@step=1,seconds=0.2,steps=100000"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[1])


def _ranks(run_dir: Path) -> dict[int, int]:
    """Local rank -> pid of the live rank processes, from their heartbeat files."""
    return {b.local_rank: b.pid for b in heartbeat.read_all(run_dir) if Path(f"/proc/{b.pid}").exists()}


def _stand_in(agent: int, local_rank: int) -> int:
    for pid in attempts.children(agent):
        if (attempts.environ(pid) or {}).get("LOCAL_RANK") == str(local_rank):
            return pid
    raise AssertionError(f"no process of torchrun's for local rank {local_rank}")


def _agent(launcher: int) -> int:
    return next(p for p in attempts.children(launcher) if "llmtrain_trainer.launch.zygote" not in _cmdline(p))


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_forked_ranks_die_with_their_stand_in_or_their_server_and_start_alone_without_one(tmp_path):
    job = ElasticJob(tmp_path, base_config(maxSteps=100000), nodes=1, procs_per_node=2, max_restarts=2,
                     env={"LLMTRAIN_FAULT_INJECT": PACE}).start()
    run_dir = job.running[0].run_dir
    try:
        ranks = wait_for(lambda: len(_ranks(run_dir)) == 2 and _ranks(run_dir), 120, 0.2, "two ranks beating")
        for pid in ranks.values():
            assert "llmtrain_trainer.launch.zygote" in _cmdline(_parent(pid)), (pid, _cmdline(_parent(pid)))
        agent = _agent(job.running[0].proc.pid)
        stand_in = _stand_in(agent, 1)
        assert stand_in != ranks[1] and "llmtrain_trainer" in _cmdline(stand_in)

        # torchrun ends a worker by its process group; the stand-in dies with SIGKILL.
        os.kill(stand_in, signal.SIGKILL)
        wait_for(lambda: _gone(ranks[1]), 10, 0.1, "the rank of the killed stand-in to be killed too")
        # torchrun saw a failed worker and restarted the group in place: forked again.
        fresh = wait_for(lambda: (r := _ranks(run_dir)) and len(r) == 2 and set(r.values()).isdisjoint(ranks.values()) and r,
                         120, 0.2, "the restarted ranks")
        for pid in fresh.values():
            assert "llmtrain_trainer.launch.zygote" in _cmdline(_parent(pid))

        # The server killed: its ranks die with it (PR_SET_PDEATHSIG), their stand-ins fail,
        # torchrun restarts the group, and with no server answering each rank starts on its own.
        server = _parent(fresh[0])
        os.kill(server, signal.SIGKILL)
        wait_for(lambda: all(_gone(pid) for pid in fresh.values()), 10, 0.1, "the forked ranks to die with their server")
        alone = wait_for(lambda: (r := _ranks(run_dir)) and len(r) == 2 and set(r.values()).isdisjoint(fresh.values()) and r,
                         120, 0.2, "ranks started without a server")
        for pid in alone.values():
            assert _parent(pid) == agent, _cmdline(_parent(pid))
    finally:
        job.kill()


def test_a_killed_rank_exits_its_stand_in_by_the_same_signal_and_the_run_recovers(tmp_path):
    cfg = base_config(maxSteps=14, checkpoint={"intervalSteps": 5})
    # One rank, so that torchrun's report is about the killed rank and not a peer it took along.
    job = ElasticJob(tmp_path, cfg, nodes=1, procs_per_node=1, max_restarts=1,
                     env={"LLMTRAIN_FAULT_INJECT": "crash@step=8,rank=0;" + PACE}).start()
    codes = job.wait(timeout=300)
    log = job.logs()
    assert codes == [0], log
    # The rank SIGKILLed itself; torchrun learnt it from the stand-in's own end.
    assert "exitcode: -9" in log and "resumed from step 5 " in log, log
    restarted = [line for line in log.splitlines() if "start-up phases" in line]
    assert len(restarted) == 2, restarted  # both attempts trained
    assert [r["step"] for r in job.steps()][-1] == 14


def test_with_the_server_turned_off_every_rank_is_torchruns_own_child(tmp_path):
    job = ElasticJob(tmp_path, base_config(maxSteps=100000), nodes=1, procs_per_node=2,
                     env={"LLMTRAIN_FAULT_INJECT": PACE, Env.ZYGOTE: "0"}).start()
    run_dir = job.running[0].run_dir
    try:
        ranks = wait_for(lambda: len(_ranks(run_dir)) == 2 and _ranks(run_dir), 120, 0.2, "two ranks beating")
        for pid in ranks.values():
            assert _parent(pid) == _agent(job.running[0].proc.pid), _cmdline(_parent(pid))
        assert not any("llmtrain_trainer.launch.zygote" in _cmdline(p) for p in attempts.children(job.running[0].proc.pid))
    finally:
        job.kill()
    wait_for(lambda: all(_gone(pid) for pid in ranks.values()), 10, 0.1, "the ranks to die with their node")


def _hang_up_mid_request(port: int) -> None:
    """A scraper that sends its request and hangs up before the answer: what a
    Prometheus scrape or the operator's probe does when its timeout expires. The rank's
    server then writes the headers (answered by a reset) and the body into a closed
    socket."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: rank\r\n\r\n")


def test_a_forked_rank_ignores_sigpipe_as_an_exec_started_python_does_so_a_scraper_hanging_up_never_kills_it(tmp_path):
    import json

    job = ElasticJob(tmp_path, base_config(maxSteps=100000), nodes=1, procs_per_node=1,
                     env={"LLMTRAIN_FAULT_INJECT": PACE}).start()
    run_dir = job.running[0].run_dir
    try:
        ranks = wait_for(lambda: len(_ranks(run_dir)) == 1 and _ranks(run_dir), 120, 0.2, "the rank beating")
        rank = ranks[0]
        assert "llmtrain_trainer.launch.zygote" in _cmdline(_parent(rank))
        ignored = int(next(line for line in Path(f"/proc/{rank}/status").read_text().splitlines()
                           if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGPIPE - 1)), f"SIGPIPE is not ignored in the forked rank (SigIgn {ignored:#x})"
        port = json.loads((run_dir / "metrics-local-rank-0.json").read_text())["port"]
        for i in range(300):
            try:
                _hang_up_mid_request(port)
            except ConnectionRefusedError:
                raise AssertionError(f"the rank's metrics endpoint is gone after {i} hang-ups: the rank died "
                                     f"({'exitcode: -13' in job.logs() and 'SIGPIPE' or 'see the log'})") from None
        steps = len(job.steps())
        wait_for(lambda: len(job.steps()) > steps + 2, 60, 0.2, "the rank to go on training")
        assert _ranks(run_dir) == ranks, "the rank was replaced"
        assert "exitcode: -13" not in job.logs()
    finally:
        job.kill()
