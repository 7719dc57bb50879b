"""DeepSpeed's checkpoint files read with ``torch.load(weights_only=True)``.

DeepSpeed asks ``torch.load`` for its own files with weights-only turned off: full pickle, which runs
whatever a file names. Those files come from the checkpoint tiers, which whoever can write
the shared PVC or the S3 prefix can also write (the manifest's hashes are unkeyed: a
forged file comes with a matching manifest). While DeepSpeed restores, ``torch.load`` is
made to read tensors, plain containers and the few DeepSpeed types its checkpoints hold
(``ALLOWED``); a file naming anything else is refused, naming it, and nothing runs.
DeepSpeed's universal-checkpoint converter runs in a subprocess started through
``python -m llmtrain_trainer.engines.safeload MODULE ARGS``, under the same rule.
"""

from __future__ import annotations

import contextlib
import importlib
import runpy
import sys
from collections.abc import Iterator
from typing import Any

ALLOWED = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
"""The DeepSpeed types found in its ZeRO 1-3 checkpoints (and universal ones) beside
tensors and containers; every other global is refused."""


REFUSED = 3
"""``main``'s exit code when a file was refused (not 1, a crash; not 2, a usage error)."""


class UnsafeCheckpoint(RuntimeError):
    """A checkpoint file names something a weights-only load does not build."""


def _resolve(name: str) -> Any | None:
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None  # a DeepSpeed without that type: its files cannot hold it either


@contextlib.contextmanager
def weights_only() -> Iterator[None]:
    """Within: every ``torch.load`` in this process is weights-only, ``ALLOWED`` added."""
    import torch  # noqa: PLC0415 - the rank side has torch; the module is imported early by path users too

    original = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        try:
            return original(*args, **kwargs)
        except Exception as err:
            if "Weights only load failed" in str(err) or "Unsupported global" in str(err):
                where = args[0] if args else kwargs.get("f", "?")
                raise UnsafeCheckpoint(f"{where}: refused: it holds more than tensors and DeepSpeed's own types "
                                       f"({_first_line(err)})") from err
            raise

    allowed = [obj for obj in map(_resolve, ALLOWED) if obj is not None]
    with torch.serialization.safe_globals(allowed):
        torch.load = load
        try:
            yield
        finally:
            torch.load = original


def _first_line(err: BaseException) -> str:
    for line in str(err).splitlines():
        if "Unsupported global" in line or "GLOBAL" in line:
            return line.strip()
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def main(argv: list[str]) -> int:
    """``python -m llmtrain_trainer.engines.safeload MODULE ARGS``: run MODULE as
    ``python -m MODULE ARGS`` would, every ``torch.load`` weights-only."""
    if not argv:
        print("usage: python -m llmtrain_trainer.engines.safeload MODULE [ARGS]", file=sys.stderr)
        return 64
    sys.argv = argv
    with weights_only():
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        except UnsafeCheckpoint as err:
            print(f"llmtrain: {err}", file=sys.stderr)
            return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
