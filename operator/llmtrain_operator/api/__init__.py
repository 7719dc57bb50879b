"""API types: the LLMTrainJob model, its validation, and the generated CRD. No I/O."""

from .job import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    FieldError,
    LLMTrainJob,
    Received,
    SpecInvalid,
    parse_job,
    receive,
)
from .spec import LLMTrainJobSpec
from .status import Condition, LLMTrainJobStatus

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "Condition", "FieldError",
    "LLMTrainJob", "LLMTrainJobSpec", "LLMTrainJobStatus", "Received", "SpecInvalid", "parse_job",
    "receive",
]
