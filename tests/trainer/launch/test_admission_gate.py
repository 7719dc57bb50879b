"""torchrun_agent's first-step gate: a re-formed group admits a waiting node only after it
has finished a step, read from its ranks' heartbeat files."""

from __future__ import annotations

import subprocess
import sys
import time

from llmtrain_trainer.pod import heartbeat
from llmtrain_trainer.launch import torchrun_agent
from llmtrain_trainer.pod.heartbeat import Heartbeat
from llmtrain_trainer.launch.torchrun_agent import FirstStepGate


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def gate_over(run_dir, clock: Clock, limit: float = 60.0) -> FirstStepGate:
    return FirstStepGate(lambda: [b.first_step for b in heartbeat.read_all(run_dir)], clock, limit)


def test_the_gate_holds_from_the_rendezvous_until_a_rank_of_that_group_stamps_its_first_step(tmp_path):
    gate = gate_over(tmp_path, heartbeat.clock)
    assert not gate.holds(), "no group formed yet: torchrun's own rule"
    old = Heartbeat(tmp_path, rank=0, local_rank=0, attempt=0, timeout_seconds=70)
    old.mark_first_step()  # the previous group's rank, stamped before the new rendezvous
    time.sleep(0.01)
    gate.formed()
    assert gate.holds(), "the earlier group's stamp does not open it"
    new = Heartbeat(tmp_path, rank=0, local_rank=0, attempt=1, timeout_seconds=70)
    assert gate.holds(), "the new rank runs, no step yet"
    new.beat()  # progress inside the first step is not a finished step
    assert gate.holds()
    new.mark_first_step()
    assert not gate.holds()
    time.sleep(0.01)
    gate.formed()  # the next group (the one with the newcomer) starts held again
    assert gate.holds()


def test_the_gate_lets_a_node_in_after_its_limit_even_without_a_step(tmp_path):
    clock = Clock(heartbeat.clock())
    gate = gate_over(tmp_path, clock, limit=30)
    gate.formed()
    Heartbeat(tmp_path, rank=0, local_rank=0, attempt=1, timeout_seconds=70)  # stuck before its first step
    clock.now += 29.9
    assert gate.holds()
    clock.now += 0.1
    assert not gate.holds(), "a group stuck before its first step keeps nobody out longer than the limit"


def test_the_patched_agent_reports_no_waiting_node_until_the_first_step(tmp_path):
    # torch's two methods stand replaced by stubs *before* the patch, so that the probe
    # checks the wiring: the rendezvous arms the gate, the waiting count goes through it.
    probe = f"""
import sys
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
SimpleElasticAgent._rendezvous = lambda self, group: "formed"
DynamicRendezvousHandler.num_nodes_waiting = lambda self: 2
from llmtrain_trainer.launch import torchrun_agent
from llmtrain_trainer.pod.heartbeat import Heartbeat
assert torchrun_agent.admit_after_first_step({str(tmp_path)!r}) is not None
print(DynamicRendezvousHandler.num_nodes_waiting(None))
assert SimpleElasticAgent._rendezvous(None, None) == "formed"
print(DynamicRendezvousHandler.num_nodes_waiting(None))
hb = Heartbeat({str(tmp_path)!r}, 0, 0, 1, 70)
print(DynamicRendezvousHandler.num_nodes_waiting(None))
hb.mark_first_step()
print(DynamicRendezvousHandler.num_nodes_waiting(None))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "0", "0", "2"], out.stdout
    assert out.stderr.count("2 node(s) waiting to join; admitted once this group has finished a step") == 1, out.stderr
    assert "admitting 2 waiting node(s)" in out.stderr


def test_the_launcher_and_the_agent_name_the_same_variable():
    from llmtrain_contract.names import Env

    assert torchrun_agent.ADMIT_AFTER_FIRST_STEP == Env.ADMIT_AFTER_FIRST_STEP
