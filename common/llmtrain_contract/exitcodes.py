"""The exit-code contract between the trainer and the operator.

One table, imported by both sides: the trainer exits with these codes, and the
operator's classifier maps a pod's exit code (plus the kubelet's reason) to what it
should do. Import-light on purpose: the operator image has no torch.

Codes 64-78 follow BSD ``sysexits.h`` where a meaning exists; 80-89 are our own.
Anything else is treated as a crash (retryable), including torchrun's own ``1``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    SUCCESS = 0
    """Training reached ``maxSteps`` and the final checkpoint is committed."""

    CONFIG_ERROR = 64
    """Bad config or usage (EX_USAGE). Permanent: a restart would fail the same way."""

    DATA_ERROR = 65
    """Missing or unreadable training data (EX_DATAERR). Permanent."""

    TRANSIENT = 75
    """A transient failure the trainer recognised, e.g. storage briefly unavailable
    (EX_TEMPFAIL). Retryable."""

    HANG = 80
    """The hang watchdog saw no step progress for ``hangTimeoutSeconds``; the stacks of
    all threads were dumped to stderr first. Retryable."""

    PREEMPTED = 81
    """SIGTERM received (eviction, preemption, scale-down); an emergency checkpoint was
    attempted within the budget. Retryable and counted as a disruption."""

    CORRUPT_CHECKPOINT = 82
    """Checkpoints exist but none verifies, and starting over would silently discard
    committed progress. Permanent: needs a human (or ``checkpoint.allowFreshStart``)."""

    COLLECTIVE_TIMEOUT = 83
    """A collective or the rendezvous timed out because a peer vanished. Retryable."""

    WORLD_SIZE_INVALID = 84
    """The world size cannot keep the fixed global batch. Permanent (config error)."""

    BAD_NUMERICS = 85
    """A non-finite or spiking loss after ``maxRollbacks`` rollbacks: the run diverges
    whatever data it skips. Permanent: needs a human (a lower learning rate, a fix)."""

    STORAGE_FULL = 86
    """Training finished but no tier has room for the final checkpoint (every tier that
    failed it is full or over its quota). Permanent: a retry would redo the steps since the
    newest committed checkpoint and fail the same way; the newest committed one is kept."""

    PREFLIGHT_FAILED = 87
    """The launcher's pre-flight check found this node's network below
    ``faultTolerance.preflightMinMbps`` before the pod joined. The node's fault, not the
    job's: counted as a disruption; the operator keeps the job off the node."""

    GPU_OUT_OF_MEMORY = 88
    """CUDA's caching allocator refused an allocation (``torch.OutOfMemoryError``): the
    rank's GPU figures (the allocator's peak, what it reserved, the GPU's size) and, for
    the built-in trainer, its memory plan are in the message. Retryable, and charged: a
    fragmented allocator or a larger world (a smaller ZeRO share) may fit the next time;
    one that never fits ends the job when the budget does, named so."""


class FailureClass(enum.StrEnum):
    SUCCEEDED = "Succeeded"
    RETRYABLE = "Retryable"
    """Replace or restart, and count it against the restart budget."""
    DISRUPTION = "Disruption"
    """Replace, counted as a disruption (eviction/preemption), not as a crash."""
    PERMANENT = "Permanent"
    """Fail the job with the reason; retrying cannot help."""


@dataclass(frozen=True)
class Classification:
    failure_class: FailureClass
    reason: str
    """A CamelCase reason for conditions and Events, e.g. ``Hang`` or ``OOMKilled``."""


_BY_CODE: dict[int, Classification] = {
    ExitCode.SUCCESS: Classification(FailureClass.SUCCEEDED, "Completed"),
    ExitCode.CONFIG_ERROR: Classification(FailureClass.PERMANENT, "ConfigError"),
    ExitCode.DATA_ERROR: Classification(FailureClass.PERMANENT, "DataError"),
    ExitCode.TRANSIENT: Classification(FailureClass.RETRYABLE, "TransientError"),
    ExitCode.HANG: Classification(FailureClass.RETRYABLE, "Hang"),
    ExitCode.PREEMPTED: Classification(FailureClass.DISRUPTION, "Preempted"),
    ExitCode.CORRUPT_CHECKPOINT: Classification(FailureClass.PERMANENT, "CorruptCheckpoint"),
    ExitCode.COLLECTIVE_TIMEOUT: Classification(FailureClass.RETRYABLE, "CollectiveTimeout"),
    ExitCode.WORLD_SIZE_INVALID: Classification(FailureClass.PERMANENT, "WorldSizeInvalid"),
    ExitCode.BAD_NUMERICS: Classification(FailureClass.PERMANENT, "BadNumerics"),
    ExitCode.STORAGE_FULL: Classification(FailureClass.PERMANENT, "StorageFull"),
    ExitCode.PREFLIGHT_FAILED: Classification(FailureClass.DISRUPTION, "PreflightFailed"),
    ExitCode.GPU_OUT_OF_MEMORY: Classification(FailureClass.RETRYABLE, "GPUOutOfMemory"),
}


SIGNAL_MAX = 64
"""Linux's highest signal number (SIGRTMAX): 128 + N above it is no signal."""
CONTAINER_LOST_REASONS = frozenset({"Unknown", "ContainerStatusUnknown"})
"""The kubelet's ``state.terminated.reason`` for a container whose end nobody saw: the
runtime lost it with its node (a node restarted under it: containerd's unknown exit
status, 255) or could not find it (``ContainerStatusUnknown``, 137). Its exit code is the
kubelet's placeholder, not the process's."""
CONTAINER_LOST = "ContainerLost"


def classify_exit(exit_code: int, reason: str | None = None) -> Classification:
    """Classify a container's termination.

    ``reason`` is the kubelet's ``state.terminated.reason`` (``OOMKilled``, ``Error``,
    ``Completed`` ...). OOMKilled wins over the exit code because the kernel's SIGKILL
    would otherwise look like any other signal kill; a container the runtime lost
    (``CONTAINER_LOST_REASONS``) is named so, whatever placeholder code it carries.
    """
    if reason == "OOMKilled":
        return Classification(FailureClass.RETRYABLE, "OOMKilled")
    if reason in CONTAINER_LOST_REASONS:
        return Classification(FailureClass.RETRYABLE, CONTAINER_LOST)
    if exit_code in _BY_CODE:
        return _BY_CODE[exit_code]
    if 128 < exit_code <= 128 + SIGNAL_MAX:
        # 128+N: killed by signal N (SIGKILL from a node agent, the OOM killer, a user).
        return Classification(FailureClass.RETRYABLE, f"Signal{exit_code - 128}")
    if -SIGNAL_MAX <= exit_code < 0:
        # Python's subprocess reports -N for signal N.
        return Classification(FailureClass.RETRYABLE, f"Signal{-exit_code}")
    return Classification(FailureClass.RETRYABLE, "Crash")


def table() -> list[tuple[int, str, str, str]]:
    """(code, name, class, reason) rows, for docs and ``llmtrain exit-codes``."""
    return [
        (int(code), code.name, _BY_CODE[code].failure_class.value, _BY_CODE[code].reason)
        for code in ExitCode
    ]
