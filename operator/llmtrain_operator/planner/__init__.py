"""Pure planning: (job, observed state, clock) -> actions, events and the new status.
No I/O: the kopf handlers and the local runner supply the observations and apply the
actions."""

from .context import CreateObject, DeleteJob, DeletePod, Event, Plan, ReplaceObject
from .plan import plan

__all__ = ["CreateObject", "DeleteJob", "DeletePod", "Event", "Plan", "ReplaceObject", "plan"]
