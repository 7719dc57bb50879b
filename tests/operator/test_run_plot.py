"""`llmtrain run`'s plot splits the steps a model kept from those a restart redid."""

from __future__ import annotations

from llmtrain_operator.localrun.plot import kept_and_replayed


def test_a_steps_last_record_is_kept_and_its_earlier_runs_are_the_replayed_ones():
    # Steps 1-4 ran, the job restored step 2 and ran 3-5 again.
    records = [{"step": s, "time": t, "loss": 10.0 - t} for t, s in enumerate([1, 2, 3, 4, 3, 4, 5])]
    kept, replayed = kept_and_replayed(records)
    assert [(r["step"], r["time"]) for r in kept] == [(1, 0), (2, 1), (3, 4), (4, 5), (5, 6)]
    assert sorted((r["step"], r["time"]) for r in replayed) == [(3, 2), (4, 3)]
