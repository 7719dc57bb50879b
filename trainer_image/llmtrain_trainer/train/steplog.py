"""Rank 0's record of every step: a JSON line per step in ``<runDir>/steps.jsonl`` (what
``llmtrain run`` plots and the tests read), and a progress line on stdout every
``logIntervalSteps``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TextIO

from llmtrain_contract.config import TrainerConfig

from llmtrain_trainer.engines.schedule import lr_at
from llmtrain_trainer.train.numerics import DataPosition


class StepLog:
    def __init__(self, cfg: TrainerConfig, run_dir: Path, world_size: int, accum: int, attempt: int):
        self.cfg = cfg
        self.world_size = world_size
        self.accum = accum
        self.attempt = attempt
        self._file: TextIO | None = (run_dir / "steps.jsonl").open("a")

    def record(self, step: int, loss: float, seconds: float, position: DataPosition, newest_checkpoint: int | None) -> None:
        """Step ``step`` (1-based: the optimizer steps taken) finished with ``loss`` in
        ``seconds``."""
        if self._file is None:
            return
        cfg = self.cfg
        taken = step - 1  # the schedule and the data are indexed by the step being taken
        data_step = position.data_step(taken)
        lr = lr_at(taken, cfg.optimizer, cfg.max_steps)
        record = {
            "step": step, "loss": loss, "samples": step * cfg.global_batch_size, "world": self.world_size,
            "accum": self.accum, "lr": lr, "attempt": self.attempt, "seconds": seconds, "time": time.time(),
            "data_samples": [data_step * cfg.global_batch_size, (data_step + 1) * cfg.global_batch_size],
        }
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if step % cfg.log_interval_steps == 0 or step == cfg.max_steps:
            tokens = cfg.global_batch_size * cfg.data.seq_len
            print(
                f"step {step:>6}/{cfg.max_steps} | loss {loss:.4f} | lr {lr:.2e} | "
                f"{tokens / seconds:,.0f} tok/s | world {self.world_size} x accum {self.accum}"
                + (f" | ckpt@{newest_checkpoint}" if newest_checkpoint else ""),
                flush=True,
            )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
