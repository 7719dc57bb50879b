"""The launcher's supervisor, against real processes: a rank that is stopped, one that
spins holding the GIL, one stuck outside a collective and one waiting inside it; and a
stopped torchrun agent. Each rank is a real child process publishing a real heartbeat
file; the supervisor judges it from /proc, writes its exit record and kills it."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from llmtrain_contract.exitcodes import ExitCode
from llmtrain_trainer.pod import exitrecord
from llmtrain_trainer.pod import heartbeat
from llmtrain_trainer.pod.heartbeat import Heartbeat, State
from llmtrain_trainer.launch.launcher import decide
from llmtrain_trainer.launch.supervisor import Supervisor, proc_info, serve_health
from llmtrain_trainer.train.watchdog import Watchdog, first_step_limit
from support.waiting import wait_for

TIMEOUT = 1.0

RANK = textwrap.dedent("""
    import os, re, signal, sys, time
    from pathlib import Path
    from llmtrain_trainer.pod.heartbeat import Heartbeat, State
    run_dir, local, behaviour = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    hb = Heartbeat(run_dir, rank=10 + local, local_rank=local, attempt=0, timeout_seconds={timeout})
    hb.set_state(State.STEPPING)
    for step in range(1, 4):
        hb.beat(step)
        time.sleep(0.05)
    if behaviour in ("collective", "rescuer", "slow-rescuer"):
        hb.set_state(State.COLLECTIVE)
    if behaviour == "rescuing-busy":
        hb.set_state(State.RESCUING)
    if behaviour in ("rescuer", "slow-rescuer"):
        hb.offer_rescue(1.0)  # a victim that can save its last step within a second
    print("ready", flush=True)
    sys.stdin.readline()  # every rank of the test started: their limits run from here, together
    hb.beat(4)
    print("going", flush=True)
    if behaviour == "rescuer":
        while not hb.rescue_requested():
            time.sleep(0.02)
        (run_dir / f"rescued-{local}").write_text("ok")
        os._exit(83)
    if behaviour == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif behaviour in ("gil", "rescuing-busy"):
        re.match(r"(a+)+$", "a" * 40 + "b")
    elif behaviour == "healthy":
        step = 3
        while True:
            step += 1
            hb.beat(step)
            time.sleep(0.1)
    time.sleep(3600)
""").replace("{timeout}", str(TIMEOUT))


def start_ranks(run_dir: Path, *behaviours: str) -> list[subprocess.Popen]:
    """One rank process per behaviour (local ranks 0, 1 ...), released together once all
    have started: a rank started first must not be stale before the last has imported."""
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(run_dir), str(local), behaviour], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for local, behaviour in enumerate(behaviours)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.stdout.readline().strip() == "going"
    return procs


def supervise_until_acted(sup: Supervisor, deadline: float = 15.0) -> list:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        verdicts = sup.check()
        if verdicts:
            return verdicts
        time.sleep(0.2)
    raise AssertionError("the supervisor never acted")


@pytest.fixture
def ranks(tmp_path):
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_heartbeat_round_trip_and_sections(tmp_path):
    hb = Heartbeat(tmp_path, rank=5, local_rank=1, attempt=2, timeout_seconds=30)
    hb.set_state(State.STEPPING)
    hb.beat(7)
    with hb.section(State.COLLECTIVE):
        (beat,) = heartbeat.read_all(tmp_path)
        assert (beat.rank, beat.local_rank, beat.attempt, beat.step, beat.state, beat.timeout) == (5, 1, 2, 7, State.COLLECTIVE, 30)
    assert heartbeat.read_all(tmp_path)[0].state == State.STEPPING
    hb.close()
    assert heartbeat.read_all(tmp_path)[0].state == State.DONE
    hb.beat(8)  # a writer thread beating after the loop closed the page must not raise
    (tmp_path / "heartbeat" / "local-9.hb").write_bytes(b"garbage")
    assert len(heartbeat.read_all(tmp_path)) == 1


def test_an_attempts_first_step_gets_a_longer_limit_then_the_hang_timeout_applies(tmp_path):
    # The first step carries one-off work (NCCL connecting, warm-up, a loaded machine):
    # the watchdog and, through the heartbeat, the supervisor allow it longer; the first
    # completed step brings both down to hangTimeoutSeconds.
    assert first_step_limit(10) == 70 and first_step_limit(300) == 600
    fired: list[float] = []
    hb = Heartbeat(tmp_path, rank=0, local_rank=0, attempt=0, timeout_seconds=first_step_limit(0.5))
    dog = Watchdog(0.5, fired.append, poll_seconds=0.05, heartbeat=hb).start()
    try:
        time.sleep(1.2)
        assert not fired, "a slow first step is not a hang"
        assert heartbeat.read_all(tmp_path)[0].timeout == first_step_limit(0.5)
        dog.beat()  # progress inside the step (a checkpoint's write) is not a finished step
        assert heartbeat.read_all(tmp_path)[0].timeout == first_step_limit(0.5)
        assert heartbeat.read_all(tmp_path)[0].first_step == 0.0
        before = heartbeat.clock()
        dog.beat(1)
        assert heartbeat.read_all(tmp_path)[0].timeout == 0.5, "the supervisor reads the steady limit from now on"
        stamped = heartbeat.read_all(tmp_path)[0].first_step
        assert before <= stamped <= heartbeat.clock(), "the torchrun agent reads when the first step ended"
        dog.beat(2)
        assert heartbeat.read_all(tmp_path)[0].first_step == stamped, "only the first step is stamped"
        wait_for(lambda: fired, 5, 0.05, "the watchdog firing on the second step")
        assert 0.5 <= fired[0] < 1.5
    finally:
        dog.stop()


@pytest.mark.parametrize("behaviour, kind", [("stop", "frozen"), ("gil", "spinning"), ("sleep", "stuck")])
def test_a_stale_rank_is_the_cause_and_its_peer_in_a_collective_the_victim(tmp_path, ranks, behaviour, kind, capfd):
    ranks += start_ranks(tmp_path, "collective", behaviour, "healthy")
    sup = Supervisor(tmp_path)
    began = time.monotonic()
    verdicts = supervise_until_acted(sup)
    assert time.monotonic() - began <= TIMEOUT + 3
    assert {(v.beat.local_rank, v.cause, v.kind) for v in verdicts} == {(0, False, "victim"), (1, True, kind)}
    for proc in ranks[:2]:
        assert proc.wait(timeout=10) == -signal.SIGKILL
    assert ranks[2].poll() is None, "a rank that makes progress is left alone"
    assert sup.peer_wait() is None, "the cause is this pod's: nobody waits on a peer elsewhere"
    records = {r["local_rank"]: r for r in exitrecord.read_attempt(tmp_path, 0)}
    assert records[1]["code"] == ExitCode.HANG and records[1]["rank"] == 11
    assert records[1]["message"].startswith(f"cause ({kind}): rank 11")
    assert records[0]["code"] == ExitCode.COLLECTIVE_TIMEOUT and records[0]["message"].startswith("victim: rank 10")
    assert exitrecord.attempt_cause(tmp_path, 0, 2) == "hang"
    code, message = decide(1, exitrecord.read_attempt(tmp_path, 0))
    assert code == ExitCode.HANG and message["rank"] == 11, "the pod reports the cause, not the victim"
    err = capfd.readouterr().err
    assert "stacks of rank 11 (py-spy" in err
    if behaviour == "gil":
        assert "<module>" in err and "Thread" in err, err  # py-spy read the spinning process
    assert supervise_again_is_quiet(sup)


def supervise_again_is_quiet(sup: Supervisor) -> bool:
    """An ended rank is judged once: no second record, no second kill."""
    return sup.check() == []


def test_only_victims_in_this_pod_are_reported_as_victims(tmp_path, ranks):
    ranks += start_ranks(tmp_path, "collective", "collective")
    verdicts = supervise_until_acted(Supervisor(tmp_path))
    assert {(v.beat.local_rank, v.cause) for v in verdicts} == {(0, False), (1, False)}
    assert exitrecord.attempt_cause(tmp_path, 0, 2) == "victim"


def test_victims_alone_serve_their_wait_on_a_peer_until_the_pod_trains_again(tmp_path, ranks):
    """Every stale rank of the pod a victim: the cause is another pod's, which may be frozen
    whole and unable to report; the launcher serves how long its ranks have waited (the
    operator's evidence, ``policies/frozen_pods.py``) until a later rank trains again, and
    for ``PEER_WAIT_SHOWN_SECONDS`` at least."""
    import os

    from llmtrain_contract.names import PEER_WAIT_SHOWN_SECONDS
    from llmtrain_operator.probe import scrape_launcher
    from llmtrain_trainer.launch.attempts import AttemptTracker

    ranks += start_ranks(tmp_path, "collective", "collective")
    sup = Supervisor(tmp_path)
    assert sup.peer_wait() is None
    supervise_until_acted(sup)
    server = serve_health(0, sup, AttemptTracker(tmp_path, agent_pid=os.getpid()), host="127.0.0.1")
    try:
        time.sleep(0.3)
        waited = scrape_launcher(f"http://127.0.0.1:{server.server_address[1]}/metrics").peer_wait
        assert waited is not None and 0.3 <= waited < 10, waited
        # The next attempt's rank: in rendezvous and restore (STARTING) it is no progress.
        later = Heartbeat(tmp_path, rank=12, local_rank=2, attempt=1, timeout_seconds=60)
        later.beat()
        sup.check()
        assert sup.peer_wait() is not None
        # In the training loop again, beating: the group formed, but the wait stays served
        # for PEER_WAIT_SHOWN_SECONDS after the verdict, then ends.
        later.set_state(State.STEPPING)
        later.beat(1)
        sup.check()
        assert sup.peer_wait() is not None, "shown for a while, so that the operator's next probe sees it"
        sup.peer_wait_since = heartbeat.clock() - PEER_WAIT_SHOWN_SECONDS - 0.5
        later.beat(2)
        sup.check()
        assert sup.peer_wait() is None
        assert scrape_launcher(f"http://127.0.0.1:{server.server_address[1]}/metrics").peer_wait is None
    finally:
        server.shutdown()


def test_a_heartbeat_older_than_its_pid_is_a_leftover_and_ignored(tmp_path, ranks):
    # An earlier container's file whose pid a newer process now has (pids restart low in a
    # new container): stale, but not that process's heartbeat.
    Heartbeat(tmp_path, 0, 0, 0, TIMEOUT).set_state(State.STEPPING)
    path = tmp_path / "heartbeat" / "local-0.hb"
    data = bytearray(path.read_bytes())
    time.sleep(TIMEOUT + 1.5)
    newer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    ranks.append(newer)
    struct.pack_into("<i", data, 8, newer.pid)  # the pid field
    path.write_bytes(bytes(data))
    assert heartbeat.read_all(tmp_path)[0].pid == newer.pid
    assert Supervisor(tmp_path).check() == []
    assert newer.poll() is None


def start_agent(procs: list[subprocess.Popen]) -> tuple[subprocess.Popen, int]:
    """A stand-in torchrun agent with one worker process: (the agent, the worker's pid)."""
    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(child.pid, flush=True)
        time.sleep(3600)
    """)], stdout=subprocess.PIPE, text=True)
    procs.append(agent)
    return agent, int(agent.stdout.readline())


def ended(pid: int, timeout: float = 10) -> bool:
    """Whether ``pid`` is gone (or a zombie) within ``timeout``."""
    end = time.monotonic() + timeout
    while (info := proc_info(pid)) is not None and info.state != "Z" and time.monotonic() < end:
        time.sleep(0.1)
    return info is None or info.state == "Z"


def test_a_stopped_torchrun_agent_is_ended_with_its_workers(tmp_path, ranks):
    agent, worker = start_agent(ranks)
    Heartbeat(tmp_path, 0, 0, 0, TIMEOUT)  # a rank published its timeout
    sup = Supervisor(tmp_path, agent_pid=agent.pid)
    sup.check()
    assert sup.agent_hang is None
    agent.send_signal(signal.SIGSTOP)
    end = time.monotonic() + 10
    while sup.agent_hang is None and time.monotonic() < end:
        sup.check()
        time.sleep(0.2)
    assert sup.agent_hang is not None and "torchrun agent" in sup.agent_hang
    assert agent.wait(timeout=10) == -signal.SIGKILL
    assert ended(worker), "the agent's workers are ended too"
    code, message = decide(-9, [], sup.agent_hang)
    assert code == ExitCode.HANG and message["reason"] == "Hang" and "torchrun agent" in message["message"]


def test_a_ranks_permanent_exit_record_ends_the_torchrun_agent_and_its_workers(tmp_path, ranks):
    """The backstop for a torch whose agent could not be patched (torchrun_agent's
    stop_on_permanent_exit): the supervisor reads a permanent exit record written after it
    started and kills the agent and its workers; a retryable code, or a permanent one left
    by an earlier container of the pod, leaves the agent running."""
    agent, worker = start_agent(ranks)
    exitrecord.write(tmp_path, 0, rank=3, local_rank=0, code=ExitCode.DATA_ERROR, message="an earlier container", step=None)
    time.sleep(0.05)
    sup = Supervisor(tmp_path, agent_pid=agent.pid)
    exitrecord.write(tmp_path, 1, rank=3, local_rank=0, code=ExitCode.TRANSIENT, message="retryable", step=4)
    sup.check()
    assert sup.permanent is None and agent.poll() is None
    exitrecord.write(tmp_path, 1, rank=4, local_rank=1, code=ExitCode.STORAGE_FULL, message="disk full", step=4)
    sup.check()
    assert sup.permanent is not None and sup.permanent[0] == 1 and sup.permanent[1]["code"] == ExitCode.STORAGE_FULL
    assert agent.wait(timeout=10) == -signal.SIGKILL
    assert ended(worker), "the agent's workers are ended too"


def test_the_supervisor_survives_a_run_dir_without_heartbeats(tmp_path):
    sup = Supervisor(tmp_path / "missing")
    assert sup.check() == [] and sup.agent_hang is None


def test_healthz_answers_while_the_supervisor_checks(tmp_path):
    import urllib.error
    import urllib.request

    sup = Supervisor(tmp_path)
    server = serve_health(0, sup, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        sup.check()
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
            assert resp.status == 200 and resp.read().startswith(b"ok")
        sup.last_check = time.monotonic() - 60  # a supervisor that stopped checking
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/healthz", timeout=5)
        assert err.value.code == 503
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/other", timeout=5)
        assert err.value.code == 404
    finally:
        server.shutdown()


def test_a_health_port_in_use_is_a_clear_config_error(tmp_path, capfd):
    import socket

    from llmtrain_trainer.launch.launcher import main

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["--run-dir", str(tmp_path), "--termination-log", str(tmp_path / "t"), "--health-port", str(port), "--", "true"])
    assert code == ExitCode.CONFIG_ERROR
    assert f"cannot serve /healthz on port {port}" in capfd.readouterr().err


def _worker(attempt: int, local_world_size: int) -> subprocess.Popen:
    """A stand-in for a worker torchrun spawned: a child of this process (the 'agent')
    with torchrun's environment."""
    env = {"TORCHELASTIC_RESTART_COUNT": str(attempt), "LOCAL_WORLD_SIZE": str(local_world_size), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    # Until the child has exec'd, /proc shows this process's environment (a fork's): the
    # tracker would not see the attempt yet. On a loaded machine that window is long.
    marker = f"TORCHELASTIC_RESTART_COUNT={attempt}".encode()
    wait_for(lambda: marker in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"), 10, 0.01, "the worker's exec")
    return proc


def test_the_launcher_counts_an_attempt_failed_when_the_next_starts_and_agrees_with_the_trainer(tmp_path, ranks):
    import os

    from llmtrain_trainer.launch.attempts import AttemptTracker

    # Attempt 0: local rank 1 hung (the supervisor's 80), rank 0 its victim (83).
    # Attempt 1: local rank 0 crashed with an error, rank 1 died of a signal without a record.
    exitrecord.write(tmp_path, 0, 1, 1, ExitCode.HANG, "cause (stuck): rank 1", 6)
    exitrecord.write(tmp_path, 0, 0, 0, ExitCode.COLLECTIVE_TIMEOUT, "victim: rank 0", 6)
    exitrecord.write(tmp_path, 1, 0, 0, 1, "Traceback ...", 9)
    tracker = AttemptTracker(tmp_path, agent_pid=os.getpid())
    assert tracker.failed_attempts() == exitrecord.reported(dict.fromkeys(exitrecord.CAUSES, 0)) and tracker.attempt == 0, "no worker yet"
    ranks.append(_worker(1, 2))
    assert tracker.failed_attempts()["hang"] == 1 and sum(tracker.failed_attempts().values()) == 1
    ranks.append(_worker(2, 2))
    counts = tracker.failed_attempts()
    assert {k: v for k, v in counts.items() if v} == {"hang": 1, "crash": 1} and tracker.attempt == 2
    assert counts == exitrecord.failed_attempts(tmp_path, 2, 2), "the restarted trainer would count the same"
    for proc in ranks:
        proc.kill()
        proc.wait()
    assert tracker.failed_attempts() == counts, "between attempts (no workers) nothing is forgotten"


def test_the_launcher_serves_its_failed_attempts_in_the_form_the_operator_parses(tmp_path, ranks):
    import os
    import urllib.request

    from llmtrain_operator.probe import scrape_launcher
    from llmtrain_trainer.launch.attempts import AttemptTracker

    exitrecord.write(tmp_path, 0, 0, 0, ExitCode.HANG, "cause (frozen): rank 0", 3)
    ranks.append(_worker(1, 1))
    sup = Supervisor(tmp_path)
    server = serve_health(0, sup, AttemptTracker(tmp_path, agent_pid=os.getpid()), host="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        report = scrape_launcher(f"{url}/metrics")
        assert report.failed == {"crash": 0, "hang": 1, "victim": 0, "preempted": 0, "permanent": 0}
        assert report.step is None and report.progress() is None, "no progress file: no step, not step 0"
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            assert "llmtrain_launcher_worker_group_attempt 1.0" in resp.read().decode()
        # Without a tracker (a launcher started without one) there is no such page.
        plain = serve_health(0, sup, host="127.0.0.1")
        assert scrape_launcher(f"http://127.0.0.1:{plain.server_address[1]}/metrics") is None
        plain.shutdown()
    finally:
        server.shutdown()
    assert scrape_launcher("http://127.0.0.1:9/metrics", timeout=1) is None, "an unreachable launcher is no answer, not an error"


def test_a_hung_attempt_with_restarts_left_counts_at_once_and_is_not_counted_again_when_the_next_starts(tmp_path, ranks):
    import os

    from llmtrain_trainer.launch.attempts import AttemptTracker

    tracker = AttemptTracker(tmp_path, agent_pid=os.getpid(), max_restarts=2)
    ranks.append(_worker(0, 2))
    assert tracker.failed_attempts()["hang"] == 0
    exitrecord.write(tmp_path, 0, 0, 0, ExitCode.COLLECTIVE_TIMEOUT, "victim: rank 0", 5)
    assert tracker.failed_attempts()["hang"] == 0, "a victim's record is no cause"
    exitrecord.write(tmp_path, 0, 1, 1, ExitCode.HANG, "cause (frozen): rank 1", 5)
    assert tracker.failed_attempts()["hang"] == 1 and tracker.attempt == 0, "counted while attempt 0 still runs"
    assert tracker.counted_early(0)
    ranks.append(_worker(1, 2))
    counts = tracker.failed_attempts()
    assert tracker.attempt == 1 and counts["hang"] == 1 and sum(counts.values()) == 1, counts
    assert counts == exitrecord.failed_attempts(tmp_path, 1, 2), "the restarted trainer counts the same"
    # Attempt 1 hangs too, and is still below --max-restarts: counted at once as well.
    exitrecord.write(tmp_path, 1, 0, 0, ExitCode.HANG, "cause (stuck): rank 0", 9)
    assert tracker.failed_attempts()["hang"] == 2 and tracker.counted_early(1)


def test_a_hang_counted_at_once_stays_counted_once_when_a_membership_change_restarts_the_group(tmp_path, ranks):
    """The peer pod's victim fails first: torchrun here restarts the group for the new
    membership, with the same restart count, and the new run starts over the hung one's
    record (exitrecord.mark_started keeps it aside)."""
    import os

    from llmtrain_trainer.launch.attempts import AttemptTracker

    tracker = AttemptTracker(tmp_path, agent_pid=os.getpid(), max_restarts=2)
    ranks.append(_worker(0, 1))
    exitrecord.mark_started(tmp_path, 0, 0)
    exitrecord.write(tmp_path, 0, 0, 0, ExitCode.HANG, "cause (frozen): rank 0", 5)
    assert tracker.failed_attempts()["hang"] == 1 and tracker.counted_early(0)
    exitrecord.mark_started(tmp_path, 0, 0)  # the new run, still attempt 0
    counts = tracker.failed_attempts()
    assert tracker.attempt == 0 and counts["hang"] == 1 and sum(counts.values()) == 1, counts
    assert counts == exitrecord.failed_attempts(tmp_path, 0, 1), "the restarted trainer counts the same"
    # Not seen while it ran (no probe in between): counted all the same.
    late = AttemptTracker(tmp_path, agent_pid=os.getpid(), max_restarts=2)
    assert late.failed_attempts()["hang"] == 1


def test_a_hang_in_the_last_allowed_attempt_is_not_counted_in_place(tmp_path, ranks):
    """With no restart left torchrun ends the pod: its exit reports that failure."""
    import os

    from llmtrain_trainer.launch.attempts import AttemptTracker

    tracker = AttemptTracker(tmp_path, agent_pid=os.getpid(), max_restarts=1)
    exitrecord.write(tmp_path, 0, 0, 0, ExitCode.HANG, "cause (frozen): rank 0", 3)
    ranks.append(_worker(1, 1))
    exitrecord.write(tmp_path, 1, 0, 0, ExitCode.HANG, "cause (frozen): rank 0", 7)
    assert tracker.failed_attempts()["hang"] == 1 and not tracker.counted_early(1)
    unknown = AttemptTracker(tmp_path, agent_pid=os.getpid())
    assert unknown.failed_attempts()["hang"] == 1, "without --max-restarts nothing counts early"


@pytest.mark.parametrize("command, expected", [
    (["torchrun", "--nnodes=1:2", "--max-restarts=3", "-m", "x"], 3),
    (["torchrun", "--max_restarts", "5", "-m", "x"], 5),
    (["torchrun", "--max-restarts", "many"], None),
    (["torchrun", "-m", "x"], None),
])
def test_the_launcher_reads_torchruns_max_restarts(command, expected):
    from llmtrain_trainer.launch.launcher import max_restarts

    assert max_restarts(command) == expected


def test_a_pod_ending_with_a_hang_counted_in_place_says_so_in_its_termination_message(tmp_path):
    """The agent (here a script) ends after its rank hung although restarts were left; an
    operator scrape saw the early count meanwhile: the termination message carries it."""
    import json
    import threading

    from llmtrain_operator.probe import scrape_launcher
    from llmtrain_trainer.launch.launcher import main

    from llmtrain_contract.ports import free_ports

    port = free_ports(1)  # below the ephemeral range: no outgoing connection takes it meanwhile
    run_dir = tmp_path / "run"
    agent = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from llmtrain_trainer.pod import exitrecord
        exitrecord.write(Path({str(run_dir)!r}), 0, 0, 0, 80, "cause (frozen): rank 0", 4)
        while not Path({str(tmp_path / "scraped")!r}).exists():
            time.sleep(0.05)
        sys.exit(1)
    """)
    seen: list[dict | None] = []

    def operator() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            report = scrape_launcher(f"http://127.0.0.1:{port}/metrics", timeout=2)
            counts = report.failed if report else None
            if counts and counts["hang"]:
                seen.append(counts)
                break
            time.sleep(0.1)
        (tmp_path / "scraped").write_text("")

    scraper = threading.Thread(target=operator)
    scraper.start()
    code = main(["--run-dir", str(run_dir), "--termination-log", str(tmp_path / "term"), "--health-port", str(port),
                 "--", sys.executable, "-c", agent, "--max-restarts=3"])
    scraper.join()
    assert seen and seen[0]["hang"] == 1, "the operator saw the hang while the attempt ran"
    assert code == ExitCode.HANG
    message = json.loads((tmp_path / "term").read_text())
    assert message["countedInPlace"] == 1, message


def test_a_victim_offering_a_rescue_is_asked_for_it_and_ends_itself_instead_of_being_killed(tmp_path, ranks):
    ranks += start_ranks(tmp_path, "rescuer", "sleep")
    verdicts = supervise_until_acted(Supervisor(tmp_path))
    assert {(v.beat.local_rank, v.kind) for v in verdicts} == {(0, "victim"), (1, "stuck")}
    assert ranks[1].wait(5) == -signal.SIGKILL, "the cause is killed at once"
    assert ranks[0].wait(5) == 83, "the victim saved and exited by itself"
    assert (tmp_path / "rescued-0").read_text() == "ok"
    record = exitrecord.read_attempt(tmp_path, 0)
    assert {r["local_rank"]: r["code"] for r in record} == {0: ExitCode.COLLECTIVE_TIMEOUT, 1: ExitCode.HANG}


def test_a_victim_that_does_not_finish_its_rescue_within_its_budget_is_killed(tmp_path, ranks, capfd):
    ranks += start_ranks(tmp_path, "slow-rescuer", "sleep")
    sup = Supervisor(tmp_path)
    supervise_until_acted(sup)
    asked = time.monotonic()
    assert heartbeat.read_all(tmp_path)[0].rescue_requested
    time.sleep(0.5)
    sup.check()
    assert ranks[0].poll() is None, "killed before its budget ran out"
    wait_for(lambda: sup.check() is not None and ranks[0].poll() is not None, 10, 0.2, "the overdue victim killed")
    assert ranks[0].returncode == -signal.SIGKILL
    assert 1.0 <= time.monotonic() - asked <= 1.0 + 1.0 + 1.5  # budget + slack + polls
    assert "did not finish its rescue checkpoint in time" in capfd.readouterr().err


def test_a_victim_without_a_rescue_offer_is_killed_with_its_cause(tmp_path, ranks):
    ranks += start_ranks(tmp_path, "collective", "sleep")
    supervise_until_acted(Supervisor(tmp_path))
    assert ranks[0].wait(5) == -signal.SIGKILL and ranks[1].wait(5) == -signal.SIGKILL
    assert not heartbeat.read_all(tmp_path)[0].rescue_requested


def test_the_watchdog_answers_a_rescue_request_within_its_poll(tmp_path):
    rescued: list[float] = []
    hb = Heartbeat(tmp_path, rank=0, local_rank=0, attempt=0, timeout_seconds=60)
    dog = Watchdog(60, lambda stale: None, heartbeat=hb, on_rescue=lambda: rescued.append(time.monotonic())).start()
    try:
        dog.offer_rescue(4.5)
        (beat,) = heartbeat.read_all(tmp_path)
        assert beat.rescue_budget == 4.5 and not beat.rescue_requested
        time.sleep(0.6)
        assert not rescued, "no request, no rescue"
        asked = time.monotonic()
        assert heartbeat.request_rescue(tmp_path, beat)
        wait_for(lambda: rescued, 5, 0.02, "the rescue callback")
        assert rescued[0] - asked <= 0.5, "answered within a poll (0.25 s)"
        assert heartbeat.read_all(tmp_path)[0].rescue_requested
    finally:
        dog.stop()


def test_a_rescue_request_for_a_pid_that_moved_on_is_not_written(tmp_path):
    hb = Heartbeat(tmp_path, rank=0, local_rank=0, attempt=0, timeout_seconds=60)
    (beat,) = heartbeat.read_all(tmp_path)
    assert not heartbeat.request_rescue(tmp_path, replace(beat, pid=beat.pid + 1)), "another process's heartbeat file now"
    assert not hb.rescue_requested()
    assert heartbeat.request_rescue(tmp_path, beat) and hb.rescue_requested()
    hb.close()


def test_a_rank_saving_its_rescue_checkpoint_is_a_victim_however_much_cpu_it_burns(tmp_path, ranks):
    """A rank whose collective raised saves its rescue checkpoint (hashing and writing: CPU)
    before it ends; the supervisor must not blame it as spinning, nor charge it a hang."""
    ranks += start_ranks(tmp_path, "rescuing-busy")
    (verdict,) = supervise_until_acted(Supervisor(tmp_path))
    assert (verdict.cause, verdict.kind) == (False, "victim"), verdict
    assert "while saving its rescue checkpoint" in verdict.message()
    (record,) = exitrecord.read_attempt(tmp_path, 0)
    assert record["code"] == ExitCode.COLLECTIVE_TIMEOUT
