"""Every implementation of the trainer's and the store's protocols implements all of it,
with the protocol's parameters: checkpointing on and off (``Checkpoints``), both engines
(``Engine``), both tiers (``Tier``). A stand-in that lacks a method fails here, not at step
1 of a job (a built-in job with checkpoints off once crashed on ``writing()``)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from llmtrain_store.directory import DirTier
from llmtrain_store.s3 import S3Tier
from llmtrain_store.tier import Tier
from llmtrain_trainer.checkpoint.manager import CheckpointManager
from llmtrain_trainer.checkpoint.off import NoCheckpoints
from llmtrain_trainer.checkpoint.protocol import Checkpoints
from llmtrain_trainer.engines.base import Engine
from llmtrain_trainer.engines.ddp import DDPEngine
from llmtrain_trainer.engines.deepspeed import DeepSpeedEngine
from llmtrain_trainer.train.metrics import NullMetrics
from llmtrain_trainer.world import DistInfo


def _members(protocol: type) -> dict[str, Any]:
    """The protocol's methods and attributes, its bases' included (not ``object``'s or
    ``Protocol``'s own)."""
    out: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object,) or klass.__module__ == "typing":
            continue
        out.update({name: value for name, value in vars(klass).items() if not name.startswith("_")})
        out.update({name: None for name in getattr(klass, "__annotations__", {})})
    return out


def _parameters(function: Any) -> list[str]:
    func = function.__func__ if isinstance(function, (staticmethod, classmethod)) else function
    return [p for p in inspect.signature(func).parameters if p not in ("self", "cls")]


def _gaps(protocol: type, implementation: Any) -> list[str]:
    gaps = []
    klass = implementation if isinstance(implementation, type) else type(implementation)
    declared = {name for k in klass.__mro__ for name in getattr(k, "__annotations__", {})}
    for name, member in _members(protocol).items():
        if not hasattr(implementation, name) and not (isinstance(implementation, type) and name in declared):
            gaps.append(f"{name} is missing")
            continue
        if callable(member) or isinstance(member, (staticmethod, classmethod)):
            want = _parameters(member)
            have = _parameters(inspect.getattr_static(klass, name))
            if have[: len(want)] != want:
                gaps.append(f"{name}{tuple(have)} differs from the protocol's {tuple(want)}")
    return gaps


def _manager(tmp_path: Path) -> CheckpointManager:
    info = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, restart_count=0, backend="gloo")
    return CheckpointManager([DirTier("local", tmp_path)], info, DDPEngine, {"config_hash": "x", "strategy": "ddp"},
                             commit_timeout=5, metrics=NullMetrics(), heartbeat=lambda: None)


def test_checkpointing_on_and_off_implement_every_member_the_loop_uses(tmp_path: Path):
    manager = _manager(tmp_path)
    try:
        for implementation in (manager, NoCheckpoints()):
            assert _gaps(Checkpoints, implementation) == [], type(implementation).__name__
    finally:
        manager.close()


def test_checkpoints_off_saves_nothing_and_restores_nothing():
    off = NoCheckpoints()
    assert off.restore_point(False, lambda o: [o]) is None
    assert off.save(5, 40, ({}, {})) == 0.0
    assert off.rescue(5, 40, 5, ({}, {}), 0.0) == "checkpointing is off"
    assert (off.busy(), off.writing(), off.tiers_busy(), off.newest_local()) == (False, False, [], None)
    assert off.durable(5) == (True, False), "a run without checkpoints is as durable as it asked to be"


@pytest.mark.parametrize("engine", [DDPEngine, DeepSpeedEngine])
def test_both_engines_implement_the_engine_protocol(engine: type):
    assert _gaps(Engine, engine) == []


@pytest.mark.parametrize("tier", [DirTier, S3Tier])
def test_both_tiers_implement_the_tier_protocol(tier: type):
    assert _gaps(Tier, tier) == []


def test_a_stand_in_without_a_method_is_caught():
    class Incomplete:
        last_committed: dict[str, int] = {}
        costs: list[Any] = []

    gaps = _gaps(Checkpoints, Incomplete())
    assert "writing is missing" in gaps and "save is missing" in gaps
