"""What went wrong with a tier, as a short reason the status, Events and metrics can carry.

A tier that fails degrades: training goes on, the reason is reported, and the tier is
retried until it works again. The reason is a fixed word plus a message written here,
never the raw error text of a remote service: that keeps secrets (a rejected access key,
a signed URL) out of logs, Events and metric labels.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from llmtrain_contract.names import TIER_REASONS

REASONS = TIER_REASONS
"""Reason -> what it means, for messages (the contract's table)."""

NO_SPACE = "NoSpace"
"""A tier out of space or over its quota: the one reason a retry cannot outlast by itself."""

_ERRNO = {errno.ENOSPC: NO_SPACE, errno.EDQUOT: NO_SPACE, errno.EACCES: "PermissionDenied", errno.EPERM: "PermissionDenied",
          errno.EROFS: "ReadOnly", errno.EIO: "IOError", errno.ETIMEDOUT: "Timeout", errno.ECONNREFUSED: "Unreachable",
          errno.EHOSTUNREACH: "Unreachable", errno.ENETUNREACH: "Unreachable"}
_S3_CODES = {
    "AccessDenied": "CredentialsRefused", "InvalidAccessKeyId": "CredentialsRefused", "SignatureDoesNotMatch": "CredentialsRefused",
    "InvalidToken": "CredentialsRefused", "ExpiredToken": "CredentialsRefused", "NoSuchBucket": "NoSuchBucket",
    "SlowDown": "Throttled", "RequestTimeout": "Timeout", "XMinioStorageFull": NO_SPACE, "XMinioAdminBucketQuotaExceeded": NO_SPACE,
}


@dataclass(frozen=True)
class Degraded:
    reason: str
    """A key of ``REASONS``."""
    detail: str = ""
    """Safe context (a path, an HTTP status), never a remote error's own text."""

    @property
    def message(self) -> str:
        text = REASONS.get(self.reason, REASONS["Error"])
        return f"{text} ({self.detail})" if self.detail else text


def classify(err: BaseException) -> Degraded:
    """A tier error's reason. Walks ``__cause__`` (a wrapped OSError stays an OSError)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _ERRNO:
            return Degraded(_ERRNO[seen.errno], f"errno {seen.errno}")
        reason = _botocore(seen)
        if reason is not None:
            return reason
        if isinstance(seen, TimeoutError):
            return Degraded("Timeout")
        seen = seen.__cause__ or seen.__context__
    return Degraded("Error", type(err).__name__)


def absent(err: BaseException) -> bool:
    """Whether ``err`` says only that an object or file is not there (never was, or was
    deleted meanwhile): a step without it is not committed, not unreadable."""
    if isinstance(err, OSError) and err.errno in (errno.ENOENT, errno.ENOTDIR):
        return True
    response = getattr(err, "response", None)
    if isinstance(response, dict) and isinstance(response.get("Error"), dict):
        code = str(response["Error"].get("Code", ""))
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return code in ("NoSuchKey", "NotFound", "404") or status == 404
    return False


def _botocore(err: BaseException) -> Degraded | None:
    name = type(err).__name__
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ProxyConnectionError"):
        return Degraded("Unreachable", name)
    if name in ("ReadTimeoutError",):
        return Degraded("Timeout", name)
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return Degraded("NoCredentials")
    response = getattr(err, "response", None)
    if isinstance(response, dict) and "Error" in response:
        code = str(response["Error"].get("Code", ""))
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if code in _S3_CODES:
            return Degraded(_S3_CODES[code], f"S3 {code}")
        if isinstance(status, int) and status >= 500:
            return Degraded("ServerError", f"HTTP {status}")
        if status == 403:
            return Degraded("CredentialsRefused", "HTTP 403")
        return Degraded("Error", f"S3 {code or status}")
    return None
