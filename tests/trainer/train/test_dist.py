"""The process group's backends (train/dist.py)."""

from __future__ import annotations

import pytest
from llmtrain_trainer.train import dist as distmod


def test_nccl_gets_gloo_beside_it_for_the_cpu_collectives():
    # The agreement, the restore's choice and host-state broadcasts are CPU tensors: NCCL
    # alone refuses them at world size 2 and more. (On a GPU, bench/gpu.py initialises
    # this same spec; this machine has no GPU to build an NCCL group.)
    assert distmod.backend_spec("nccl") == "cpu:gloo,cuda:nccl"
    assert distmod.backend_spec("gloo") == "gloo"


def test_an_unknown_backend_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("LLMTRAIN_DIST_BACKEND", "mpi")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)  # restored after the test: init would set them for good
    with pytest.raises(ValueError, match="LLMTRAIN_DIST_BACKEND='mpi'"):
        distmod.init(30)
