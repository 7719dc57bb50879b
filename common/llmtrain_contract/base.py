"""The base of every spec and config model both sides share, and the error a cross-field
rule raises."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class FieldRuleError(ValueError):
    """A rule failed on a field that pydantic's own error location would not name.

    ``field`` is the offending field's path relative to the model (or field) that checks
    the rule: camelCase and dotted, or a tuple when a key contains dots
    (``("nvidia.com/gpu",)``). Error reports append it to pydantic's location so that
    they name the exact field rather than the enclosing object.
    """

    def __init__(self, field: str | tuple[str, ...], message: str):
        self.field = field
        self.message = message
        super().__init__(f"{'.'.join(field) if isinstance(field, tuple) else field}: {message}")

    @property
    def parts(self) -> tuple[str, ...]:
        return self.field if isinstance(self.field, tuple) else tuple(self.field.split("."))


class CamelModel(BaseModel):
    """Base for every spec/config model: camelCase on the wire, unknown keys rejected.

    Unknown keys are an error rather than ignored because a typo (``maxStep``) would
    otherwise silently fall back to a default and waste a GPU-day.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict form, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
