"""Kubernetes-style conditions: change ``lastTransitionTime`` only when the status flips."""

from __future__ import annotations

from typing import Literal

from ..api.status import CONDITION_TYPES, Condition
from ..api.vocabulary import ConditionType

MAX_MESSAGE = 4096
"""Characters of a condition's message kept: the planner's own are shorter; one built from
what pods and other components said is cut, so that the 16 conditions together stay a
small part of the object (etcd keeps an object to 1.5 MiB: docs/operator.md, "Size")."""


def bounded(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message``, or its start and how many characters were cut, within ``limit``."""
    if len(message) <= limit:
        return message
    keep = limit - len(f" ... ({len(message)} more characters)")  # the note at its longest
    return message[:keep] + f" ... ({len(message) - keep} more characters)"


def set_condition(
    conditions: list[Condition], type_: ConditionType, status: bool, reason: str, message: str, now: str, generation: int | None
) -> bool:
    """Upsert a condition in place. Returns True when its status changed."""
    value: Literal["True", "False"] = "True" if status else "False"
    for i, cond in enumerate(conditions):
        if cond.type == type_:
            changed = cond.status != value
            conditions[i] = Condition(
                type=type_, status=value, reason=reason, message=bounded(message),
                last_transition_time=now if changed else cond.last_transition_time, observed_generation=generation,
            )
            return changed
    conditions.append(Condition(type=type_, status=value, reason=reason, message=bounded(message),
                                last_transition_time=now, observed_generation=generation))
    conditions.sort(key=lambda c: CONDITION_TYPES.index(c.type))
    return True


def is_true(conditions: list[Condition], type_: ConditionType) -> bool:
    return any(c.type == type_ and c.status == "True" for c in conditions)
