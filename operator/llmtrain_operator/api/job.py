"""The ``LLMTrainJob`` object and the one place where raw input becomes a typed job.

``parse_job`` never raises anything but :class:`SpecInvalid`, whose ``errors`` name the
field path (``spec.replicas.min``) and say what would be valid. The operator turns it
into an ``Invalid`` condition plus an Event; ``llmtrain validate`` prints it.
``receive`` reads a whole object as delivered (spec through ``parse_job``, status apart),
once per pass, for the handler and the planner alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from llmtrain_contract.base import CamelModel, FieldRuleError
from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from .spec import LLMTrainJobSpec
from .status import LLMTrainJobStatus, read_status

GROUP = "llmtrain.io"
EVENT_SOURCE = "llmtrain-operator"
"""The component the operator's Events name as their source (``kubectl get events`` shows it)."""
REPORTING_COMPONENT = f"{GROUP}/operator"
"""The Events' ``reportingComponent`` (events.k8s.io's field, a qualified name)."""
VERSION = "v1alpha1"
API_VERSION: Final = "llmtrain.io/v1alpha1"
"""``GROUP/VERSION``, spelled out: ``LLMTrainJob.api_version`` is this literal."""
KIND: Final = "LLMTrainJob"
PLURAL = "llmtrainjobs"
SINGULAR = "llmtrainjob"
SHORT_NAMES = ["ltj"]

NAME_MAX_LENGTH = 40
"""Host names are ``<job>-worker-<slot>`` and pod names ``<job>-worker-<slot>[-<n>]``,
DNS labels (<= 63 chars), so the job name is capped well below that."""
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(CamelModel):
    """The parts of ``metadata`` the operator reads. Everything else is kept as-is."""

    model_config = {"extra": "allow"}

    name: str = Field(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN)
    """DNS-1035 label, at most 40 characters (pod and Service names derive from it)."""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class LLMTrainJob(CamelModel):
    """An elastic LLM training job."""

    api_version: Literal["llmtrain.io/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["LLMTrainJob"] = KIND
    metadata: ObjectMeta
    spec: LLMTrainJobSpec
    status: LLMTrainJobStatus | None = None


@dataclass(frozen=True)
class FieldError:
    path: str
    """Dotted field path from the object root, e.g. ``spec.replicas.min``."""
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecInvalid(ValueError):
    """The object does not describe a valid job. ``errors`` names every bad field."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "." in str(item) or "/" in str(item):
            parts.append(f"[{item}]")  # a map key such as nvidia.com/gpu
        elif str(item).startswith(("function-", "json-or-python", "union[")):
            # pydantic's internal validator names (e.g. for int|str unions); not fields.
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(root)"


def _message(err: ErrorDetails) -> str:
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown field (check the spelling; see `kubectl explain ltj.spec`)"
    if err["type"] == "missing":
        return "required field is missing"
    if err["type"] == "literal_error":
        return msg.replace("Input should be", "must be one of:")
    return msg


def errors_from(exc: ValidationError) -> list[FieldError]:
    """Flatten pydantic's errors into field-named messages, deduplicated.

    For ``int | str`` quantities pydantic reports one error per union member; the
    first message per path is the useful one.
    """
    seen: dict[str, FieldError] = {}
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        message = _message(err)
        rule = (err.get("ctx") or {}).get("error")
        if isinstance(rule, FieldRuleError):
            # A cross-field rule: point at the offending field, not the enclosing object.
            loc = loc + rule.parts
            message = rule.message
        path = _path(loc)
        seen.setdefault(path, FieldError(path, message))
    return list(seen.values())


def parse_job(obj: Any) -> LLMTrainJob:
    """Validate a raw object (from YAML or the API) into a typed job.

    Raises :class:`SpecInvalid` for anything that is not a valid job, including a
    non-mapping or the wrong apiVersion/kind.
    """
    if not isinstance(obj, dict):
        raise SpecInvalid([FieldError("(root)", f"expected a mapping (an LLMTrainJob object), got {type(obj).__name__}")])
    if obj.get("kind") not in (None, KIND):
        raise SpecInvalid([FieldError("kind", f"must be {KIND}, got {obj.get('kind')!r}")])
    try:
        return LLMTrainJob.model_validate(obj)
    except ValidationError as exc:
        raise SpecInvalid(errors_from(exc)) from None


@dataclass(frozen=True)
class Received:
    """One job object as delivered (by the API server, a file), read once: the typed job
    or why it is not one, and its status read apart, so that a status the operator cannot
    read never makes the spec invalid."""

    job: LLMTrainJob | None
    """None when the object is not a valid job (``invalid`` says why)."""
    invalid: SpecInvalid | None
    status: LLMTrainJobStatus
    """The status as written (``read_status``); the planner builds the new one from a copy."""
    deleting: bool
    """``metadata.deletionTimestamp`` is set: nothing is planned any more."""
    generation: int | None
    """``metadata.generation``; only a real integer, since even the metadata of an invalid
    object may be garbage."""


def receive(obj: Any) -> Received:
    """Read a raw object: its spec through ``parse_job`` (the status is not part of the
    spec's validity), its status through ``read_status``. Never raises."""
    raw = obj if isinstance(obj, dict) else None
    meta = (raw or {}).get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    generation = meta.get("generation")
    try:
        job, invalid = parse_job({**raw, "status": None} if raw is not None else obj), None
    except SpecInvalid as err:
        job, invalid = None, err
    return Received(job=job, invalid=invalid, status=read_status((raw or {}).get("status")),
                    deleting=bool(meta.get("deletionTimestamp")), generation=generation if type(generation) is int else None)
