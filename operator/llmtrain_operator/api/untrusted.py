"""Values that come from a pod, read as untrusted input.

A label, a container's termination message and a trainer's metric are written by code
running in the job's pods (or by anyone who can create pods in the namespace): a
non-numeric label, ``{"code": "x"}``, ``1e999`` or a ``+Inf`` sample must not raise
through a pass, or every pass of that job raises and its failures are never handled
again. Each reader here returns the value when it is one the operator can use, else
``None`` and a line naming the field and the value, which the pass reports once as an
Event (``policies/pod_values.py``) and otherwise ignores.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from llmtrain_contract.names import FAILED_ATTEMPT_CAUSES, TIER_REASONS, Termination

MAX_COUNT = 2**53
"""Steps, ranks and counters above this are not real (and lose precision as floats)."""
MAX_MESSAGE = 1024
"""Characters of a termination message's ``message`` kept (the status is size-bounded)."""
TIERS = ("local", "shared", "s3")
_SHOWN = 40


def shown(value: Any) -> str:
    """A value as a report quotes it: short, one line (never raising, however deep)."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except (RecursionError, ValueError, TypeError):
        text = f"a {type(value).__name__} nested too deep"
    text = text.replace("\n", "\\n")
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def count(value: Any) -> int | None:
    """A whole number in [0, 2**53]: an int, a float that is one (a metric's sample), or
    digits (a label); ``None`` for anything else (NaN, infinities, negatives, text, bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return int(value) if value.isascii() and value.isdigit() and len(value) <= 16 and int(value) <= MAX_COUNT else None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and 0 <= value <= MAX_COUNT:
        return int(value)
    return None


def seconds(value: Any) -> float | None:
    """A finite, non-negative number: seconds, a Unix time, a ratio."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= MAX_COUNT else None


def loss(value: Any) -> float | None:
    """A finite number no larger than ``MAX_COUNT`` either way: a loss (a script's may be
    negative). Shown, never acted on."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and abs(value) <= MAX_COUNT else None


def exit_code(value: Any) -> int | None:
    """A process exit code as a container reports it: 0..255."""
    code = count(value) if not isinstance(value, str) else None
    return code if code is not None and code <= 255 else None


_REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")
_TOKEN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


def token(value: Any) -> str | None:
    """A reason as the kubelet writes one (``OOMKilled``, ``Evicted``, ``Error``): it may
    become a condition's reason, which the API server checks."""
    return value if isinstance(value, str) and _TOKEN.match(value) else None


def tier_reason(value: Any) -> str | None:
    """A tier's degraded reason: one of ``TIER_REASONS`` (it becomes part of a condition's
    reason, which the API server checks: a space there fails the status write)."""
    return value if isinstance(value, str) and _REASON.match(value) and value in TIER_REASONS else None


def termination(message: Any) -> tuple[dict[str, Any], list[str]]:
    """The launcher's JSON termination message, only its known fields with usable values
    (``Termination``); unknown fields are left out silently (a newer launcher may add
    some), bad values of known ones are named. A message that is not a JSON object is not
    the launcher's (a user's script or a kubelet's note): nothing, no complaint."""
    try:
        parsed = json.loads(message) if isinstance(message, str) else None
    except (ValueError, RecursionError):  # not JSON; nested too deep for the parser
        parsed = None
    if not isinstance(parsed, dict):
        return {}, []
    kept: dict[str, Any] = {}
    bad: list[str] = []

    def take(key: str, value: Any, parse: Any) -> None:
        got = parse(value)
        if got is None:
            bad.append(f"termination message field {key!r} ({shown(value)})")
        else:
            kept[key] = got

    for key, value in parsed.items():
        if value is None:
            continue  # the launcher writes null for what it does not know (a step before the first)
        if key == Termination.CODE:
            take(key, value, exit_code)
        elif key in (Termination.RANK, Termination.STEP, Termination.COUNTED_IN_PLACE):
            take(key, value, lambda v: count(v) if not isinstance(v, str) else None)
        elif key in (Termination.REASON, Termination.MESSAGE):
            take(key, value, lambda v: v[:MAX_MESSAGE] if isinstance(v, str) else None)
        elif key == Termination.CHECKPOINTS:
            take(key, value, _checkpoints)
        elif key == Termination.LAST_STEP:
            take(key, value, _last_step)
        elif key == Termination.OOM:
            take(key, value, _oom)
        elif key == Termination.MEMORY:
            take(key, value, _memory)
        elif key == Termination.FAILED_ATTEMPTS:
            take(key, value, _failed_attempts)
    return kept, bad


def _memory(value: Any) -> dict[str, Any] | None:
    """``{"oomKills": N, "peakBytes": P, "limitBytes": L}``: counts, the bytes maybe null."""
    if not isinstance(value, dict) or set(value) != {"oomKills", "peakBytes", "limitBytes"}:
        return None
    whole = {key: count(v) if not isinstance(v, str) and v is not None else None for key, v in value.items()}
    if whole["oomKills"] is None or any(whole[key] is None and value[key] is not None for key in ("peakBytes", "limitBytes")):
        return None
    return whole


def _failed_attempts(value: Any) -> dict[str, int] | None:
    """cause -> count, every cause a known one (``FAILED_ATTEMPT_CAUSES``)."""
    if not isinstance(value, dict) or any(cause not in FAILED_ATTEMPT_CAUSES for cause in value):
        return None
    counts = {cause: count(n) if not isinstance(n, str) else None for cause, n in value.items()}
    return None if any(n is None for n in counts.values()) else counts  # type: ignore[return-value]


def _oom(value: Any) -> dict[str, Any] | None:
    """``{"kills": N, "peakBytes": P, "limitBytes": L}``: a count of at least one kill,
    byte counts or null, nothing else."""
    if not isinstance(value, dict) or set(value) != {"kills", "peakBytes", "limitBytes"}:
        return None
    whole = {key: count(v) if not isinstance(v, str) and v is not None else None for key, v in value.items()}
    if not whole["kills"] or any(whole[key] is None and value[key] is not None for key in ("peakBytes", "limitBytes")):
        return None
    return whole


def _last_step(value: Any) -> dict[str, Any] | None:
    """``{"step": N, "loss": L}``: both present and usable, nothing else."""
    if not isinstance(value, dict) or set(value) != {"step", "loss"}:
        return None
    step, value_loss = count(value["step"]) if not isinstance(value["step"], str) else None, loss(value["loss"])
    return {"step": step, "loss": value_loss} if step is not None and value_loss is not None else None


def _checkpoints(value: Any) -> dict[str, int] | None:
    """tier -> newest committed step; every entry must be a known tier and a step."""
    if not isinstance(value, dict):
        return None
    steps = {tier: count(step) if not isinstance(step, str) else None for tier, step in value.items()}
    if any(tier not in TIERS or step is None for tier, step in steps.items()):
        return None
    return {tier: step for tier, step in steps.items() if step is not None}
