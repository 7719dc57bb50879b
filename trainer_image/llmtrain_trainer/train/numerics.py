"""Bad numerics: a non-finite loss, or a spike far above the recent losses.

Every rank judges the *global* mean loss of the step (agreed by the per-step all-reduce),
so every rank reaches the same verdict at the same step without another collective.

A bad step rolls the job back to its newest committed checkpoint and skips the samples
the steps since then trained on, as large runs do by hand (PaLM restarted ~100 steps
before a spike and skipped a few hundred batches). The skip is a *data offset*: training
step ``s`` reads the samples of data step ``s + offset``, so no sample is repeated and
none is lost except the skipped window, which is recorded. The offset, the skipped
windows and the rollback count travel in every later checkpoint's manifest (``data``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from llmtrain_contract.config import NumericsRuntime


@dataclass(frozen=True)
class Skip:
    first_step: int
    """The first training step redone after the rollback (1-based, as logged)."""
    last_step: int
    first_sample: int
    end_sample: int
    """Global sample indices ``[first_sample, end_sample)`` never trained on."""
    reason: str

    def to_wire(self) -> dict:
        return {"firstStep": self.first_step, "lastStep": self.last_step, "firstSample": self.first_sample,
                "endSample": self.end_sample, "reason": self.reason}

    @classmethod
    def from_wire(cls, data: dict) -> Skip:
        return cls(int(data["firstStep"]), int(data["lastStep"]), int(data["firstSample"]), int(data["endSample"]),
                   str(data.get("reason", "")))


@dataclass
class DataPosition:
    """Where the data stream is relative to the optimizer steps, and the job's counts that
    travel with it in the checkpoints and in a heal's transfer (rollbacks, heals)."""

    offset: int = 0
    """Data steps skipped so far: step ``s`` reads data step ``s + offset``."""
    skips: list[Skip] = field(default_factory=list)
    rollbacks: int = 0
    heals: int = 0
    """In-process heals over the job (``Metric.HEAL_ROUNDS``)."""

    def data_step(self, step: int) -> int:
        return step + self.offset

    def to_wire(self) -> dict:
        return {"offset": self.offset, "rollbacks": self.rollbacks, "heals": self.heals, "skips": [s.to_wire() for s in self.skips]}

    @classmethod
    def from_wire(cls, data: dict | None) -> DataPosition:
        if not data:
            return cls()
        return cls(int(data.get("offset", 0)), [Skip.from_wire(s) for s in data.get("skips", [])], int(data.get("rollbacks", 0)),
                   int(data.get("heals", 0)))

    def skip(self, restored_step: int, bad_step: int, global_batch: int, reason: str) -> Skip:
        """Roll back from ``bad_step`` (the 1-based step whose loss was bad, trained at
        this position) to ``restored_step``, skipping what steps ``restored_step+1 ..
        bad_step`` read. Call on the position in force when the bad step ran, not on the
        one restored with the checkpoint: windows skipped since then stay skipped."""
        first = self.data_step(restored_step) * global_batch
        skip = Skip(restored_step + 1, bad_step, first, first + (bad_step - restored_step) * global_batch, reason)
        self.offset += bad_step - restored_step
        self.skips.append(skip)
        self.rollbacks += 1
        return skip


class LossGuard:
    """The recent window of good losses, and the verdict on a new one."""

    def __init__(self, cfg: NumericsRuntime):
        self.k = cfg.spike_std_devs
        self.min_rise = cfg.spike_min_rise
        self.window: deque[float] = deque(maxlen=cfg.window_steps)

    def judge(self, loss: float) -> str | None:
        """None for a good loss (remembered); else why it is bad (not remembered)."""
        why = self.verdict(loss)
        if why is None:
            self.window.append(loss)
        return why

    def verdict(self, loss: float) -> str | None:
        """``judge`` without remembering the loss."""
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        if self.k > 0 and len(self.window) == self.window.maxlen:
            mean = sum(self.window) / len(self.window)
            std = math.sqrt(sum((x - mean) ** 2 for x in self.window) / len(self.window))
            # Both rules: deviations alone fire on noise once the window is nearly flat
            # (a memorised or converged loss), a rise alone on a noisy early loss.
            if std > 0 and (loss - mean) / std > self.k and loss - mean >= self.min_rise:
                return (f"the loss {loss:.4g} is {(loss - mean) / std:.1f} standard deviations and {loss - mean:.3g} above "
                        f"the last {len(self.window)} steps' mean {mean:.4g}")
        return None

    def reset(self) -> None:
        self.window.clear()
