"""When a pass writes the status (handlers/reconcile.py ``status_changed``): at once for a
decision, at the progress budget's pace for a step alone, at the flush interval for time
accounting alone."""

from __future__ import annotations

from datetime import datetime, timedelta, UTC

import pytest
from llmtrain_operator.handlers.reconcile import progress_pace, status_changed
from llmtrain_operator.settings import OperatorSettings

NOW = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)


def status(written_ago: float, **fields):
    base = {"phase": "Running", "step": 100, "lastProgressTime": "2026-11-26T07:59:00Z", "activeSeconds": 50.0,
            "lastReconcileTime": (NOW - timedelta(seconds=written_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return {**base, **fields}


@pytest.mark.parametrize("ago, pace, written", [(5, 25, False), (30, 25, True), (5, 0, True)])
def test_a_step_alone_is_written_at_the_progress_pace(ago, pace, written):
    old = status(ago)
    new = status(0, step=105, lastProgressTime="2026-11-26T08:00:00Z", activeSeconds=55.0)
    assert status_changed(old, new, flush_seconds=60, now=NOW, progress_seconds=pace) is written


def test_any_other_change_is_written_at_once():
    old = status(1)
    new = status(0, step=105, phase="Restarting", activeSeconds=51.0)
    assert status_changed(old, new, flush_seconds=60, now=NOW, progress_seconds=1000)


def test_time_accounting_alone_waits_for_the_flush_interval():
    old = status(30)
    assert not status_changed(old, status(0, activeSeconds=80.0), flush_seconds=60, now=NOW, progress_seconds=0)
    assert status_changed(status(61), status(0, activeSeconds=111.0), flush_seconds=60, now=NOW, progress_seconds=0)


def test_the_pace_shares_the_budget_among_the_jobs():
    settings = OperatorSettings(progress_writes_per_second=20)
    assert progress_pace(settings, 500) == 25.0
    assert progress_pace(settings, 10) == 0.5
    assert progress_pace(OperatorSettings(progress_writes_per_second=0), 500) == 0.0
