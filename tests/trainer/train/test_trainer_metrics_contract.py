"""The trainer's metrics endpoint, as the operator's probe reads it: the real registry of
each side, no hand-written exposition text."""

from __future__ import annotations

from llmtrain_contract.cadence import interval
from llmtrain_operator.probe import parse
from llmtrain_trainer.train.metrics import TrainerMetrics
from prometheus_client import generate_latest


def test_the_probe_reads_what_the_trainer_exports():
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    m.started(world_size=2, restarts=3, failed_attempts={"crash": 1, "hang": 1, "victim": 1, "preempted": 0, "permanent": 0, "gpu_oom": 2})
    m.step(step=41, samples=328, loss=2.6, seconds=0.5, node_tokens=512)
    m.step(step=42, samples=336, loss=2.5, seconds=0.5, node_tokens=512)
    m.checkpoint_committed("local", 40, 0.1, 1000)
    m.checkpoint_committed("shared", 30, 0.3, 1000)
    for tier in ("local", "shared", "s3"):
        m.tier_health(tier, None)
    text = generate_latest(m.registry).decode()
    assert "llmtrain_trainer_tokens_total 1024.0" in text  # a counter: every step adds the node's tokens
    probe = parse(text)
    assert (probe.step, probe.world_size, probe.restarts) == (42, 2, 3)
    assert probe.failed_attempts == {"crash": 1, "hang": 1, "victim": 1, "preempted": 0, "permanent": 0, "gpu_oom": 2}
    assert probe.last_checkpoint == {"local": 40, "shared": 30}
    assert probe.last_step_time is not None
    assert probe.tier_degraded == {} and probe.cost_seconds is None and probe.mtbf_seconds is None, "unset reads as absent"
    assert probe.loss == 2.5 and probe.tokens_per_second is None, "no throughput until the trainer reports one"
    assert probe.rank == 0 and parse(generate_latest(TrainerMetrics(rank=3, strategy="ddp", config_hash="a", job="j").registry)
                                     .decode()).rank == 3
    m.throughput(2048.0)
    assert parse(generate_latest(m.registry).decode()).tokens_per_second == 2048.0


def test_a_non_finite_loss_is_left_out_quietly_and_a_bad_throughput_is_named():
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    m.step(step=13, samples=104, loss=float("nan"), seconds=0.5, node_tokens=512)
    m.throughput(-5.0)
    probe = parse(generate_latest(m.registry).decode())
    assert probe.loss is None, "bad numerics are the trainers' to handle (a rollback), not an unusable value"
    assert probe.tokens_per_second is None and any("tokens_per_second" in r for r in probe.rejected), probe.rejected
    assert not any("loss" in r for r in probe.rejected), probe.rejected


def test_tier_health_and_the_cadence_reach_the_probe_and_a_recovered_tier_leaves_no_reason():
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    m.checkpoint_failed("s3", "Unreachable")
    m.checkpoint_failed("s3", "CredentialsRefused")  # only the current reason stays
    m.checkpoint_failed("local", "NoSpace")
    m.cadence(25, interval(1.5, 900.0, 2.0, 1, 1000, latency_seconds=3.0))
    text = generate_latest(m.registry).decode()
    probe = parse(text)
    assert probe.tier_degraded == {"s3": "CredentialsRefused", "local": "NoSpace"}
    assert (probe.interval_steps, probe.cost_seconds, probe.mtbf_seconds, probe.step_seconds) == (25, 1.5, 900.0, 2.0)
    assert probe.latency_seconds == 3.0
    assert 'llmtrain_trainer_checkpoint_failures_total{reason="Unreachable",tier="s3"} 1.0' in text
    m.tier_health("s3", None)
    assert parse(generate_latest(m.registry).decode()).tier_degraded == {"local": "NoSpace"}


def test_rollbacks_and_skipped_windows_reach_the_probe():
    from llmtrain_trainer.train.numerics import DataPosition

    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    assert parse(generate_latest(m.registry).decode()).skipped == ()
    pos = DataPosition()
    pos.skip(10, 13, 8, "the loss is nan")
    pos.skip(20, 21, 8, "spike")
    m.data_position(pos)
    probe = parse(generate_latest(m.registry).decode())
    assert probe.rollbacks == 2
    assert probe.skipped == ((11, 13, 80, 104), (21, 21, 184, 192))  # the second after the first offset of 3
    assert probe.heals == 0


def test_the_job_s_heals_travel_with_the_data_position_and_reach_the_probe():
    from llmtrain_trainer.train.numerics import DataPosition

    pos = DataPosition(rollbacks=1)
    pos.heals += 3
    wire = pos.to_wire()
    assert DataPosition.from_wire(wire) == pos  # as a checkpoint or a heal's transfer carries it
    assert DataPosition.from_wire({k: v for k, v in wire.items() if k != "heals"}).heals == 0  # a checkpoint from before
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    m.data_position(DataPosition.from_wire(wire))
    assert parse(generate_latest(m.registry).decode()).heals == 3


def test_stragglers_of_the_node_reach_the_probe_and_leave_when_cleared():
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    m.stragglers({1: 5.234}, set())
    assert parse(generate_latest(m.registry).decode()).stragglers == {1: 5.23}
    m.stragglers({}, {1})
    assert parse(generate_latest(m.registry).decode()).stragglers == {}


def test_heals_are_counted_and_timed_by_role():
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="abc", job="j")
    m.healed("survivor", 0.4)
    m.healed("survivor", 2.0)
    m.healed("replacement", 3.5)
    text = generate_latest(m.registry).decode()
    assert 'llmtrain_trainer_heals_total{role="survivor"} 2.0' in text
    assert 'llmtrain_trainer_heals_total{role="replacement"} 1.0' in text
    assert 'llmtrain_trainer_heal_seconds_sum{role="survivor"} 2.4' in text
    assert 'llmtrain_trainer_heal_seconds_bucket{le="0.5",role="survivor"} 1.0' in text
