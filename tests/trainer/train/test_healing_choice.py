"""Whether a rank heals in process (``train/main._healing``): when asked for, under the
launcher (which names the store), with DDP; a rank of several on a node too. And the
restart count an agent writes is the one the ranks read (a "//" in the ranks' keys once
hid every count from them)."""

from __future__ import annotations

import datetime
import json

import pytest
import torch.distributed as dist
from llmtrain_contract.names import Env
from llmtrain_trainer.launch.torchrun_agent import restart_key, seat_prefix
from llmtrain_trainer.train import main
from llmtrain_trainer.train.heal import Healing
from llmtrain_trainer.train.main import HealingUnsupported, _healing
from support.elastic import base_config


def _cfg(**overrides):
    return main.TrainerConfig.model_validate(base_config(faultTolerance={"inProcessHealing": True}, **overrides))


@pytest.fixture
def launched(monkeypatch):
    """The environment the launcher and torchrun give a rank, with a real store."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    for key, value in {Env.HEAL_STORE: f"127.0.0.1:{server.port}/run", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    return server


def test_one_rank_per_node_heals_in_process(launched):
    assert isinstance(_healing(_cfg()), Healing)


def test_one_of_several_ranks_on_a_node_heals_in_process_too(launched, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    healing = _healing(_cfg())
    assert isinstance(healing, Healing) and healing.rank == 1


def test_not_asked_or_not_under_the_launcher_or_not_ddp(launched, monkeypatch):
    assert _healing(main.TrainerConfig.model_validate(base_config())) is None
    with pytest.raises(HealingUnsupported, match="needs strategy 'ddp'"):
        _healing(_cfg(strategy={"kind": "deepspeed", "zeroStage": 2}))
    monkeypatch.delenv(Env.HEAL_STORE)
    assert _healing(_cfg()) is None


def test_the_restart_count_an_agent_writes_is_the_one_the_ranks_read(launched):
    healing = _healing(_cfg())
    assert isinstance(healing, Healing)
    launched.add(restart_key("run", "127.0.0.1", 29500, 2, 1), 1)  # the agent of rank 1 restarts it
    assert [healing.rounds._restarts(rank) for rank in (0, 1)] == [0, 1]


def test_the_seat_an_agent_records_is_the_one_the_ranks_read(launched):
    healing = _healing(_cfg())
    assert isinstance(healing, Healing)
    seat = {"group": 1, "holder": "node-b/7/1", "ranks": [1], "groups": 2, "min_groups": 2}
    launched.set(f"{seat_prefix('run', '127.0.0.1', 29500, 2)}/seat/1", json.dumps(seat))
    assert healing.store.check(["seat/1"]) and json.loads(healing.store.get("seat/1")) == seat
