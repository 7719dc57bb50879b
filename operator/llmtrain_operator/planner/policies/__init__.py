"""The planner's policies, one concern per module, each ``handle(ctx) -> Verdict``.

None imports another (an import-linter ``independence`` contract): what several need
(entering a terminal phase, recording a failure, charging the budget, quarantine) lives
in the planner's helper modules. ``plan.py`` runs them in order.
"""
