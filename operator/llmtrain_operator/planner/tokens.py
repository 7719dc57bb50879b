"""Each job's token: what its rendezvous store and its workers share and no other pod has.

The store's TCPStore answers any client that reaches it, and torchrun keeps the
rendezvous state there, so a pod that reaches it (any pod of the cluster where the network
plugin enforces no NetworkPolicy, or a pod the policy admits) could rewrite the state or
end a live agent's lease. With a token in the job's pods only, the agents and the store
sign the state and the lease lines (``llmtrain_trainer/pod/rdzvstate.py``,
``rendezvous/leases.py``): without it a pod can do neither.

The token lives in a Secret the operator creates beside the job's pods
(``manifests.token_secret``), mounted into the store's and the workers' environment. The
operator may only *create* Secrets (it never reads one it made), so the token is not
random but an HMAC of the job's uid under the operator's key: a Secret deleted by hand
is made again with the same value, which the job's running pods still hold. A job
re-created under the same name has a new uid, so a new token.

Nor can the operator check that a Secret answered "exists" (409) is its own. Its name
therefore ends with another HMAC of the uid: nobody without the operator's key can know
it before the operator creates the Secret, and the pods that name it are created after
it, so no Secret of that name can be planted before it.

Pure: the key is the operator's setting (``settings.token_key_file``), read at startup.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

KEY_BYTES = 32
"""The least a key file must hold: a shorter key would make the tokens guessable."""


class TokenKeyError(ValueError):
    """A key that cannot make tokens (the message says why)."""


NAME_SUFFIX_CHARS = 10
"""Hex characters of the Secret name's HMAC: 40 bits, not to be guessed."""


@dataclass(frozen=True)
class JobToken:
    secret: str
    """The Secret's name: ``<job>-rdzv-token-<HMAC of the uid>``."""
    value: str
    """The token (hex, 64 characters)."""


def job_token(key: bytes, job: str, uid: str) -> JobToken:
    """The token of the job named ``job`` with ``uid``, and its Secret's name."""
    if len(key) < KEY_BYTES:
        raise TokenKeyError(f"the token key holds {len(key)} bytes, {KEY_BYTES} at least")
    if not uid:
        raise TokenKeyError("the job has no uid (not read from the API server): no token can be drawn for it")
    def mac(purpose: bytes) -> str:
        return hmac.new(key, purpose + b"/" + uid.encode(), hashlib.sha256).hexdigest()

    return JobToken(f"{job}-rdzv-token-{mac(b'llmtrain-job-token-name')[:NAME_SUFFIX_CHARS]}", mac(b"llmtrain-job-token"))
