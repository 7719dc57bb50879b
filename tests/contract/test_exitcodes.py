"""The exit-code table shared by the trainer and the operator's classifier."""

from __future__ import annotations

import pytest
from llmtrain_contract.exitcodes import ExitCode, FailureClass, classify_exit, table


@pytest.mark.parametrize(
    ("code", "reason", "klass", "why"),
    [
        (0, None, FailureClass.SUCCEEDED, "Completed"),
        (64, None, FailureClass.PERMANENT, "ConfigError"),
        (65, None, FailureClass.PERMANENT, "DataError"),
        (80, None, FailureClass.RETRYABLE, "Hang"),
        (81, None, FailureClass.DISRUPTION, "Preempted"),
        (82, None, FailureClass.PERMANENT, "CorruptCheckpoint"),
        (83, None, FailureClass.RETRYABLE, "CollectiveTimeout"),
        (137, None, FailureClass.RETRYABLE, "Signal9"),
        (137, "OOMKilled", FailureClass.RETRYABLE, "OOMKilled"),
        (-9, None, FailureClass.RETRYABLE, "Signal9"),
        (1, "Error", FailureClass.RETRYABLE, "Crash"),
        (192, None, FailureClass.RETRYABLE, "Signal64"),
        # No signal is numbered above 64: an exit(255) or exit(-1) is a crash, not "Signal127".
        (255, "Error", FailureClass.RETRYABLE, "Crash"),
        (-200, None, FailureClass.RETRYABLE, "Crash"),
        # The runtime lost the container with its node (containerd's unknown exit status),
        # or the kubelet could not find it: named so, whatever placeholder code it carries.
        (255, "Unknown", FailureClass.RETRYABLE, "ContainerLost"),
        (137, "ContainerStatusUnknown", FailureClass.RETRYABLE, "ContainerLost"),
    ],
)
def test_exit_codes_are_classified(code, reason, klass, why):
    got = classify_exit(code, reason)
    assert (got.failure_class, got.reason) == (klass, why)


def test_every_code_is_in_the_table_once():
    codes = [row[0] for row in table()]
    assert sorted(codes) == sorted(int(c) for c in ExitCode)
    assert len(set(codes)) == len(codes)


def test_our_codes_do_not_collide_with_signal_kills():
    assert all(0 <= int(c) < 128 for c in ExitCode)
