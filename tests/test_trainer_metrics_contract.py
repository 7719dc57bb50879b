"""The trainer's metrics endpoint, as the operator's probe reads it: the real registry of
each side, no hand-written exposition text."""

from __future__ import annotations

from llmtrain_operator.probe import parse
from llmtrain_trainer.metrics import TrainerMetrics
from prometheus_client import generate_latest


def test_the_probe_reads_what_the_trainer_exports():
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    m.started(world_size=2, restarts=3, failed_attempts={"crash": 1, "hang": 1, "victim": 1, "preempted": 0, "permanent": 0})
    m.step(step=42, samples=336, loss=2.5, seconds=0.5, tokens=512)
    m.checkpoint_committed("local", 40, 0.1)
    m.checkpoint_committed("shared", 30, 0.3)
    probe = parse(generate_latest(m.registry).decode())
    assert (probe.step, probe.world_size, probe.restarts) == (42, 2, 3)
    assert probe.failed_attempts == {"crash": 1, "hang": 1, "victim": 1, "preempted": 0, "permanent": 0}
    assert probe.last_checkpoint == {"local": 40, "shared": 30}
    assert probe.last_step_time is not None
