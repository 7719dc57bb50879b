"""The DDP engine's gradient buckets do not depend on when it was wrapped: three ranks that
re-wrap in the middle of a run (as a heal does; a restart wraps anew too) end with the same
bytes as three that never did. DDP rebuilds its buckets after a wrapper's first step, and
from three ranks on the layout decides the order of a ring all-reduce's additions
(``DDPEngine._wrap``)."""

from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from llmtrain_contract.config import TrainerConfig
from llmtrain_trainer.engines.data import build_source, micro_batch_indices
from llmtrain_trainer.engines.ddp import DDPEngine
from llmtrain_trainer.world import DistInfo

WORLD = 3
STEPS = 6
REWRAP_BEFORE = 3
GLOBAL_BATCH = 6
MICRO = 2


def _train(rank: int, rewrap: bool) -> dict[str, torch.Tensor]:
    cfg = TrainerConfig(model={"preset": "tiny"}, data={"seqLen": 32, "vocabSize": 256},
                        global_batch_size=GLOBAL_BATCH, micro_batch_size=MICRO)
    info = DistInfo(rank=rank, world_size=WORLD, local_rank=rank, local_world_size=WORLD, node_rank=0,
                    restart_count=0, backend="gloo")
    engine = DDPEngine(cfg, info)
    source = build_source(cfg.data, cfg.seed, cfg.model.shape(cfg.data.seq_len).vocab_size)
    for step in range(STEPS):
        if rewrap and step == REWRAP_BEFORE:
            engine.unwrap()
            engine.rewrap()
        engine.train_step(step, [source.batch(micro_batch_indices(step, 0, rank, WORLD, GLOBAL_BATCH, MICRO))])
    return {n: p.detach().clone() for n, p in engine.named}


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)  # three ranks on a machine of two cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        # One run after the other in the same group: the same seed builds the same model.
        runs = {"went on": _train(rank, rewrap=False), "rewrapped": _train(rank, rewrap=True)}
        if rank == 0:
            torch.save(runs, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_three_ranks_that_rewrap_mid_run_end_with_the_bytes_of_three_that_did_not(tmp_path):
    out = tmp_path / "params.pt"
    mp.spawn(_rank, args=(_free_port(), str(out)), nprocs=WORLD)
    runs = torch.load(out)
    went_on, rewrapped = runs["went on"], runs["rewrapped"]
    assert went_on.keys() == rewrapped.keys()
    differ = [n for n in went_on if not torch.equal(went_on[n], rewrapped[n])]
    worst = max((float((went_on[n] - rewrapped[n]).abs().max()) for n in differ), default=0.0)
    assert not differ, f"{len(differ)} of {len(went_on)} parameters differ (at most by {worst:.3g}): {differ[:5]}"
