"""A rank's pull of the agreed step into tier 1 (``pull.py``) beside the pod's prefetch:
a copy the prefetch committed after the agreement listed tier 1 is taken when it
verifies, and replaced when it does not; a pull waits for a prefetch in progress."""

from __future__ import annotations

import os

from llmtrain_store import manifest as mf
from llmtrain_store import prefetching
from llmtrain_store.directory import DirTier

from llmtrain_trainer.checkpoint.health import Health
from llmtrain_trainer.checkpoint.protocol import Choice
from llmtrain_trainer.checkpoint.pull import Puller
from llmtrain_trainer.train.metrics import NullMetrics
from llmtrain_trainer.world import DistInfo
from store.helpers import flip_byte, save_dir

ALLOWED = mf.ENGINE_FILES["ddp"]
INFO = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, restart_count=0, backend="gloo")


def _setup(tmp_path):
    shared = DirTier("shared", tmp_path / "shared")
    state = os.urandom(3 << 20)
    source = save_dir(shared, 10, {"state.llmt": state, "rng/rank-00000.llmt": b"r"})
    local = DirTier("local", tmp_path / "tier1")
    puller = Puller(local, INFO, ALLOWED, Health(NullMetrics(), ["local", "shared"]), NullMetrics(), 10, lambda: None)
    choice = Choice(10, "local", 80, 1, source, "shared", names=["state.llmt", "rng/rank-00000.llmt"])
    return shared, local, puller, choice, state


def test_a_copy_the_prefetch_committed_after_the_agreement_is_read_not_pulled_again(tmp_path, caplog):
    shared, local, puller, choice, state = _setup(tmp_path)
    save_dir(local, 10, {"state.llmt": state, "rng/rank-00000.llmt": b"r"})  # the prefetch's copy
    inode = (local.final(10) / "state.llmt").stat().st_ino
    caplog.set_level("INFO", "llmtrain.checkpoint")
    assert puller.localize(choice, 10) == local.final(10)
    assert (local.final(10) / "state.llmt").stat().st_ino == inode, "the prefetched copy stays"
    assert "was prefetched into tier 1" in caplog.text and "pulled step" not in caplog.text


def test_a_copy_that_fails_its_check_is_replaced_by_the_pull(tmp_path, caplog):
    shared, local, puller, choice, state = _setup(tmp_path)
    save_dir(local, 10, {"state.llmt": state, "rng/rank-00000.llmt": b"r"})
    flip_byte(local.final(10) / "state.llmt")
    caplog.set_level("INFO", "llmtrain.checkpoint")
    puller.localize(choice, 10)
    assert "pulled step 10 from the shared tier" in caplog.text
    assert (local.final(10) / "state.llmt").read_bytes() == state


def test_with_no_copy_and_no_prefetch_the_rank_pulls(tmp_path, caplog):
    shared, local, puller, choice, state = _setup(tmp_path)
    prefetching.marker(local).parent.mkdir(parents=True, exist_ok=True)
    prefetching.marker(local).write_text("999999999")  # a dead launcher's mark: not waited for
    caplog.set_level("INFO", "llmtrain.checkpoint")
    puller.localize(choice, 10)
    assert "pulled step 10 from the shared tier" in caplog.text
    assert (local.final(10) / "state.llmt").read_bytes() == state
