"""The planner's policies, one concern per module, each ``handle(ctx) -> Verdict``; the
queue's and the gang's return what they decided instead (``queue.Admission``,
``podgroup.GangGate``), which ``plan.py`` hands to the policies that act on it.

None imports another (an import-linter ``independence`` contract): what several need
(entering a terminal phase, recording a failure, charging the budget, quarantine) lives
in the planner's helper modules. ``plan.py`` runs them in order.
"""
