"""The words for a process the kernel's OOM killer ended (the launcher's termination
message and the operator's in-place restart say the same), and for a rank whose CUDA
allocator ran out of GPU memory (the trainer's and the script runner's exit record)."""

from __future__ import annotations

from dataclasses import dataclass

REASON = "OOMKilled"
"""The kubelet's reason for a container the OOM killer ended, and ours for a rank."""


def gib(value: int | None) -> str:
    """Bytes in words: ``2.9 GiB``, or ``unknown``."""
    return f"{value / (1 << 30):.1f} GiB" if value is not None else "unknown"


ADVICE = ("Raise resources.limits.memory, or lower what a rank holds (micro-batch, sequence length, dataloader workers, "
          "procsPerNode)")


def figures(peak_bytes: int | None, limit_bytes: int | None) -> str:
    """The container's memory peak against its limit, and what to change."""
    limit = f"of its limit {gib(limit_bytes)}" if limit_bytes is not None else "(it has no limit: the node ran out)"
    return f"the container's memory peak {gib(peak_bytes)} {limit}. {ADVICE}"


# --------------------------------------------------------------------- GPU memory

GPU_REASON = "GPUOutOfMemory"
"""Ours for a rank whose CUDA allocator refused an allocation (``ExitCode.GPU_OUT_OF_MEMORY``)."""
GPU_CAUSE = "gpu_oom"
"""Its failed attempt's cause (``names.FAILED_ATTEMPT_CAUSES``)."""
GPU_ADVICE = ("lower the micro-batch or the sequence length, recompute activations (activation checkpointing), or shard "
              "the optimizer state and weights (ZeRO, FSDP)")
"""For a script, whose memory has no plan of ours."""
ERROR_CHARS = 300
"""torch's message runs to several sentences of allocator advice; the first line is the fact."""


@dataclass(frozen=True)
class GpuMemory:
    """A GPU's figures at the moment its allocator refused: ``torch.cuda``'s own counts."""

    index: int
    name: str
    total_bytes: int
    peak_allocated_bytes: int
    """``torch.cuda.max_memory_allocated``: the most the rank's tensors held at once."""
    reserved_bytes: int
    """``torch.cuda.memory_reserved``: what the caching allocator holds from CUDA (the
    tensors, and the free blocks fragmentation keeps)."""

    def describe(self) -> str:
        return (f"GPU {self.index} ({self.name}, {gib(self.total_bytes)}): the allocator's peak "
                f"{gib(self.peak_allocated_bytes)}, {gib(self.reserved_bytes)} reserved")


def gpu_message(rank: int, error: str, gpu: GpuMemory | None, plan: str | None) -> str:
    """What a rank out of GPU memory says: torch's first line, the GPU's figures, and the
    memory plan (the built-in trainer's) or general advice (a script's)."""
    first = (error.strip().splitlines() or [""])[0]
    if len(first) > ERROR_CHARS:
        first = first[:ERROR_CHARS] + "..."
    figures = gpu.describe() if gpu is not None else "no CUDA figures (the rank's CUDA allocator is not initialised)"
    return f"rank {rank} ran out of GPU memory: {first}; {figures}; " + (plan if plan else GPU_ADVICE)
