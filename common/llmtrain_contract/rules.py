"""Cross-field rules, each written once: a Python check for the model (``llmtrain
validate``, the operator, the trainer's config) and, beside it, the same rule in CEL for
the API server, with one message and one example that breaks it.

A model lists its rules (``RULES``), enforces them in a validator (``enforce``) and puts
their CEL into its JSON schema (``cel_validations``), from which the CRD is generated.
Where the server cannot check a rule, ``server_cannot`` says why; the operator's
``Invalid`` condition covers it. ``llmtrain_operator.api.rules`` gathers every model's
rules into the one table that the tests and docs/api.md read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from .base import CamelModel, FieldRuleError


@dataclass(frozen=True)
class Rule:
    name: str
    """Stable id, e.g. ``replicas-ordered``."""
    field: str
    """The field the error names, camelCase, relative to the model holding the rule."""
    message: str
    """The server's message, and the start of the model's (which adds the values)."""
    check: Callable[[Any], str | None]
    """The model instance -> None when the rule holds, else what is wrong (values)."""
    cel: str | None = None
    """The same rule in CEL, over the model's object as the API server stores it."""
    server_cannot: str | None = None
    """Why the API server cannot check it (when ``cel`` is None)."""
    example: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Dotted paths relative to the model, set on a valid object to break the rule."""

    def __post_init__(self) -> None:
        if (self.cel is None) == (self.server_cannot is None):
            raise ValueError(f"rule {self.name}: give its CEL or say why the server cannot check it")


def enforce(model: Any, rules: tuple[Rule, ...]) -> Any:
    """Raise for the first rule the model breaks; return the model otherwise."""
    for rule in rules:
        detail = rule.check(model)
        if detail is not None:
            raise FieldRuleError(rule.field, f"{rule.message} ({detail})" if detail else rule.message)
    return model


def cel_validations(rules: tuple[Rule, ...]) -> dict[str, Any]:
    """The ``x-kubernetes-validations`` of a model's schema, from its rules."""
    entries = [{"rule": r.cel, "message": r.message, "fieldPath": "." + r.field} for r in rules if r.cel is not None]
    return {"x-kubernetes-validations": entries} if entries else {}


def cel_get(path: str, default: Any) -> str:
    """A field in CEL, with the model's default when the object does not set it (the
    API server applies no defaults inside objects that are absent)."""
    parts = path.split(".")
    guards = " && ".join("has(" + ".".join(parts[: i + 1]) + ")" for i in range(1, len(parts)))
    return f"({guards} ? {path} : {cel_literal(default)})"


def cel_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{cel_literal(k)}: {cel_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple, range)):
        return "[" + ",".join(cel_literal(v) for v in value) + "]"
    return repr(value)


def _schema_extra(schema: dict[str, Any], cls: type) -> None:
    schema.update(cel_validations(getattr(cls, "RULES", ())))


class Ruled(CamelModel):
    """A model with cross-field rules: set ``RULES`` on the class (after it is defined,
    when a rule needs the class's own defaults). They are enforced after field
    validation and rendered into the model's JSON schema as CEL."""

    model_config = ConfigDict(json_schema_extra=_schema_extra)
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Any:
        return enforce(self, type(self).RULES)


def default_of(model: type[BaseModel], name: str) -> Any:
    """A field's default (for ``cel_get``), read from the model itself."""
    return model.model_fields[name].default
