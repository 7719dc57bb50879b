"""Pure planning: (job, observed state, clock) -> actions, decisions and the new status.
No I/O: the kopf handlers and the local runner supply the observations and apply the
actions."""

from .context import (Action, CreateObject, DeleteJob, DeleteObject, DeletePod, KeepPod, PatchStatus, Plan, ReplaceObject, SetSuspend,
                      UpdateSpec, Verdict)
from .decisions import Decision, Event
from .plan import plan, plan_received

__all__ = ["Action", "CreateObject", "Decision", "DeleteJob", "DeleteObject", "DeletePod", "Event", "KeepPod", "Plan", "PatchStatus",
           "ReplaceObject", "SetSuspend", "UpdateSpec", "Verdict", "plan", "plan_received"]
