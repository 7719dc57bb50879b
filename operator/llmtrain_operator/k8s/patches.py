"""JSON merge patches (RFC 7386) that turn one document into another *exactly*.

A merge patch leaves keys it does not mention untouched, so a field that became None in
the new status (``lastRecoverySeconds`` after a new failure, ``nextRestartTime`` after a
resume) must be sent as an explicit null, at any depth, or the old value survives.
"""

from __future__ import annotations

from typing import Any


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before or key not in old:
            patch[key] = value
    return patch
