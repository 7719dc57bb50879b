"""Rescue checkpoints: when a peer fails, a survivor saves the step its replica holds.

Under DDP every rank holds the whole state, and after a finished step that state is
exactly that step's until the optimizer runs again. When a peer fails, a survivor saves
it into tier 1 (synchronously, within ``checkpoint.sigtermBudgetSeconds``) and the next
attempt resumes there, so no step is redone. Three triggers, on two threads:

- the training thread: a collective raised (a dead peer reset the connection);
- the watchdog thread: the launcher's supervisor judged this rank a victim and asked
  through the heartbeat page (the training thread stays blocked in its collective), or
  the unsupervised watchdog fired while the rank waited for a peer.

What is saved is recorded at every step boundary (``at_boundary``: step, optimizer
steps, RNG state, about 45 µs). A peer that stops after its update but before the
step's agreement leaves this rank one step further (``updated``): that step is saved
only if this rank's own loss passes the loss guard and every parameter is finite. The
engine refuses (a sharded state, a state on a device, an update in progress) and says
so; nothing is ever saved twice, and a second trigger waits for the first to finish so
that the process does not end in the middle of the write.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch

from llmtrain_trainer.checkpoint.protocol import Checkpoints
from llmtrain_trainer.engines import rng
from llmtrain_trainer.engines.base import Engine
from llmtrain_trainer.pod.heartbeat import State
from llmtrain_trainer.train.numerics import LossGuard
from llmtrain_trainer.train.watchdog import Watchdog

log = logging.getLogger("llmtrain.trainer")


@dataclass(frozen=True)
class Boundary:
    """The state is exactly this step's: what a rescue saves."""

    step: int
    updates: int
    """The engine's optimizer steps at that step."""
    rng: rng.Raw


@dataclass(frozen=True)
class Updated:
    """A step's optimizer update ran, but the ranks have not agreed on its loss yet."""

    step: int
    updates: int
    local_loss: float


class Rescuer:
    def __init__(self, ckpt: Checkpoints, guard: LossGuard, watchdog: Watchdog, budget_seconds: float,
                 global_batch_size: int, enabled: bool):
        """``enabled``: checkpoints have a tier 1 to save into."""
        self.ckpt = ckpt
        self.guard = guard
        self.watchdog = watchdog
        self.budget = budget_seconds
        self.global_batch_size = global_batch_size
        self.enabled = enabled
        self._engine: Engine | None = None
        self._boundary: Boundary | None = None
        self._updated: Updated | None = None
        self._restored_step = 0
        self._lock = threading.Lock()
        self._started = False
        self._done = threading.Event()

    @property
    def armed(self) -> bool:
        return self._engine is not None

    def arm(self, engine: Engine, step: int) -> None:
        """Training starts (or restarts after a rollback) at ``step`` with ``engine``'s
        state: a rescue needs the whole state in this process's memory (a replicated
        engine on the host) and a tier to save it in."""
        self._engine = engine if self.enabled and engine.can_rescue() else None
        self._restored_step = step
        self._updated = None
        self.at_boundary(step)
        if self._engine is not None:
            self.watchdog.offer_rescue(self.budget)

    def forget(self) -> None:
        """The state is being replaced (a rollback's restore): nothing to rescue until
        ``arm`` is called again."""
        self._boundary = None
        self._updated = None

    def at_boundary(self, step: int) -> None:
        """The state is exactly ``step``'s now (after a step, a restore)."""
        engine = self._engine
        self._boundary = Boundary(step, engine.updates(), rng.raw()) if engine is not None else None

    def updated(self, step: int, local_loss: torch.Tensor) -> None:
        """``step``'s optimizer update ran; its loss is not agreed yet."""
        engine = self._engine
        if engine is not None:
            self._updated = Updated(step, engine.updates(), float(local_loss))

    def judged_bad(self) -> None:
        """The ranks judged the last step's loss bad: it is never rescued."""
        self._updated = None

    def save(self, why: str) -> None:
        """A peer failed (``why``): save the last step into tier 1 if this rank's state
        still is that step's and no checkpoint of it exists yet. Bounded by the budget;
        never raises."""
        with self._lock:
            first, self._started = not self._started, True
        if not first:
            self._done.wait(self.budget)
            return
        # A victim from now on, to the supervisor and this watchdog, however long the save
        # takes or whatever CPU it burns: left in the state the failed section restored, a
        # rank saving after its collective raised was judged stuck and charged a hang.
        self.watchdog.enter(State.RESCUING)
        self.watchdog.beat()
        try:
            self._save(why)
        except Exception as err:  # noqa: BLE001 - the rank is failing already; the rescue only adds
            log.error("%s; the rescue checkpoint failed: %s", why, err)
        finally:
            self._done.set()

    def _save(self, why: str) -> None:
        engine, boundary = self._engine, self._boundary
        if engine is None or boundary is None:
            return
        step, updates, state = boundary.step, boundary.updates, boundary.rng
        updated = self._updated
        if engine.updates() != updates and updated is not None and updated.updates == engine.updates():
            # The optimizer already applied the next step (the peer failed in the
            # agreement): that step's state, if this rank's view of it is sound.
            doubt = self._doubt(engine, updated.local_loss)
            if doubt is not None:
                log.warning("%s; no rescue checkpoint of step %d: %s", why, updated.step, doubt)
                return
            step, updates, state = updated.step, updated.updates, rng.raw()
        newest = max(self.ckpt.newest_saved() or 0, self._restored_step)
        if step <= newest:
            log.warning("%s; step %d is the newest checkpoint already, no rescue checkpoint needed", why, step)
            return
        began = time.monotonic()
        why_not = self.ckpt.rescue(step, step * self.global_batch_size, updates, rng.encode(state), began + self.budget)
        if why_not is None:
            log.warning("%s; rescue checkpoint of step %d saved into tier 1 in %.2fs (the newest checkpoint before it: step %d)",
                        why, step, time.monotonic() - began, newest)
        else:
            log.warning("%s; no rescue checkpoint of step %d: %s", why, step, why_not)

    def _doubt(self, engine: Engine, local_loss: float) -> str | None:
        """Why a step whose loss the ranks never agreed on must not be saved: this rank's
        own loss fails the loss guard (noisier than the global one, so the test is, if
        anything, too strict), or a parameter is not finite (another rank's bad gradient
        reached every replica through the all-reduce)."""
        why = self.guard.verdict(local_loss)
        if why is not None:
            return f"its loss was never agreed, and this rank's {why.removeprefix('the ')}"
        with torch.no_grad():
            if not all(bool(torch.isfinite(p).all()) for p in engine.parameters()):
                return "its loss was never agreed, and a parameter is not finite"
        return None
