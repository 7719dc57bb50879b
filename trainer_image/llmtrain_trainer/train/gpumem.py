"""A rank out of GPU memory: CUDA's caching allocator refused an allocation
(``torch.OutOfMemoryError``). Without a name of its own it exits 1 like any exception,
and the job's status says ``Crash``; named, it exits ``GPU_OUT_OF_MEMORY`` with the GPU's
figures, its failed attempt counts as ``gpu_oom``, and the operator charges
``GPUOutOfMemory`` (docs/exit-codes.md).

Used by the built-in trainer, which adds its memory plan (``train/main.py``), and by the
script runner for a user's script, so both name the same exceptions alike. torch is not
imported here: the script runner loads this module before the script imports torch, and
an exception from torch means the process already imported it.
"""

from __future__ import annotations

import re
import sys

from llmtrain_contract import oom

CHAIN_DEPTH = 16
"""How far down an exception's causes to look (a wrapper's ``raise ... from err``)."""


def out_of_memory(err: BaseException) -> BaseException | None:
    """The ``torch.OutOfMemoryError`` that ``err`` is or was raised from (its cause or
    context, as an engine's wrapper re-raises it); None for any other failure."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    kinds = tuple(kind for kind in (getattr(torch, "OutOfMemoryError", None),
                                    getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None))
                  if isinstance(kind, type))
    current: BaseException | None = err
    for _ in range(CHAIN_DEPTH):
        if current is None:
            break
        if kinds and isinstance(current, kinds):
            return current
        current = current.__cause__ or current.__context__
    return None


def figures(err: BaseException) -> oom.GpuMemory | None:
    """The figures of the GPU that refused (torch's message names it: "GPU 3 has a total
    capacity of ...", as this process numbers its devices; a script may allocate on
    ``cuda:N`` without making it current), or of the current one; now, after the failed
    allocation, so the peak includes everything up to it. None without CUDA, or when CUDA
    cannot answer."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        named = re.search(r"\bGPU (\d{1,4})\b", str(err))
        index = int(named.group(1)) if named else torch.cuda.current_device()
        if not 0 <= index < torch.cuda.device_count():
            index = torch.cuda.current_device()
        return oom.GpuMemory(index, torch.cuda.get_device_name(index), torch.cuda.get_device_properties(index).total_memory,
                             torch.cuda.max_memory_allocated(index), torch.cuda.memory_reserved(index))
    except Exception:  # noqa: BLE001 - a device lost with the error: the message says there are no figures
        return None


def message(rank: int, err: BaseException, gpu: oom.GpuMemory | None, plan: str | None = None) -> str:
    return oom.gpu_message(rank, f"{type(err).__name__}: {err}", gpu, plan)
