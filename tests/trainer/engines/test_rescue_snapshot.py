"""The DDP engine's rescue snapshot (``DDPEngine.rescue_snapshot``): given only for the
state after exactly the step the trainer last finished, and never while another snapshot
holds the memory. A rescue taken after the optimizer moved on would save the next step's
weights under the last step's number."""

from __future__ import annotations

from llmtrain_contract.config import TrainerConfig
from llmtrain_trainer.engines.data import build_source, micro_batch_indices
from llmtrain_trainer.world import DistInfo
from llmtrain_trainer.engines.ddp import DDPEngine


def _engine() -> tuple[DDPEngine, TrainerConfig]:
    cfg = TrainerConfig(model={"preset": "tiny"}, data={"seqLen": 32, "vocabSize": 256}, global_batch_size=4, micro_batch_size=4)
    info = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, restart_count=0, backend="gloo")
    return DDPEngine(cfg, info), cfg


def _step(engine: DDPEngine, cfg: TrainerConfig, step: int) -> None:
    source = build_source(cfg.data, cfg.seed, cfg.model.shape(cfg.data.seq_len).vocab_size)
    engine.train_step(step, [source.batch(micro_batch_indices(step, 0, 0, 1, 4, 4))])


def test_a_rescue_snapshot_is_only_of_the_step_the_trainer_last_finished():
    engine, cfg = _engine()
    assert engine.can_rescue(), "a replicated state in host memory"
    _step(engine, cfg, 0)
    at_one = engine.updates()
    assert at_one == 1
    assert engine.rescue_snapshot(at_one + 1) is None, "the state is not yet at that step"
    _step(engine, cfg, 1)
    assert engine.rescue_snapshot(at_one) is None, "the optimizer moved past the step the trainer finished"
    snap = engine.rescue_snapshot(engine.updates())
    assert snap is not None
    assert engine.rescue_snapshot(engine.updates()) is None, "the memory is held by the first snapshot"
    before = engine.live.views[next(iter(engine.live.views))].clone()
    _step(engine, cfg, 2)  # a step while the rescue is written goes into the spare arena
    assert snap.arena.views[next(iter(snap.arena.views))].equal(before), "the rescued state changed under the write"
    snap.release()
    assert engine.rescue_snapshot(engine.updates()) is not None
