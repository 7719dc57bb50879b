"""torchrun's rendezvous state, read without running anything it names.

The state lives pickled in the rendezvous store, which any pod that reaches the store's
port can write. torchrun's agents and the store's lease server both read it: with a
plain ``pickle.loads`` a forged state naming ``os.system`` runs in every worker pod (with
the S3 keys in its environment). Here only the types torchrun's state is made of are
built; anything else is refused before it runs. Standard library only: the torchrun
agent loads this file by path from a bundle in a user's image (``launch/torchrun_agent.py``).

With the job's token (``TOKEN_ENV``, from the Secret the operator makes for each job) the
state is also *signed*: the agents and the store's process write it as ``SIGNED``, an
HMAC-SHA256 of the pickle under a key drawn from the token, then the pickle, and refuse
one without a valid signature before unpickling anything. A pod that reaches the store
but has not the token (another job's, one that NetworkPolicy does not stop where the
network plugin enforces none) can then forge no state at all, not even one made only of
torchrun's own types (participants removed, a round closed). It can still write back an
older state of the same job that it read from the store (a replay): that costs a
re-formed round, never code.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle
from typing import Any

TOKEN_ENV = "LLMTRAIN_RDZV_TOKEN"
"""The job's token (``llmtrain_contract.names.Env.RDZV_TOKEN``; spelt here too, since this
file imports nothing of the project's packages)."""
SIGNED = b"llmtrain-signed-state-v1:"
"""What a signed state starts with (torchrun's pickle starts with its protocol opcode),
then the HMAC's 32 bytes, then the pickle."""
MAC_BYTES = 32

RDZV_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
STATE_GLOBALS = {(RDZV_MODULE, "_RendezvousState"), (RDZV_MODULE, "_NodeDesc"),
                 ("datetime", "datetime"), ("datetime", "timedelta"), ("datetime", "timezone"), ("builtins", "set")}
"""All that torchrun's rendezvous state is made of."""


class ForgedState(pickle.UnpicklingError):
    """The store held a rendezvous state naming something torchrun's state never holds
    (an UnpicklingError: torchrun reports it as a corrupt state)."""


class _StateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in STATE_GLOBALS:
            raise ForgedState(f"the rendezvous state names {module}.{name}, which torchrun's state never holds")
        return super().find_class(module, name)


def load_state(bits: bytes) -> Any:
    """torchrun's rendezvous state from the store's bytes, building only its own types."""
    try:
        return _StateUnpickler(io.BytesIO(bits)).load()
    except ForgedState:
        raise
    except Exception as err:  # any malformed payload is the same refusal
        raise ForgedState(f"the rendezvous state does not decode: {err}") from err


def purpose_key(token: str, purpose: str) -> bytes:
    """A key for one use of the job's token (the state's signature, a lease's hello), so
    that a value signed for one use is never valid for another."""
    return hmac.new(token.encode(), b"llmtrain/" + purpose.encode(), hashlib.sha256).digest()


class StateCodec:
    """How the rendezvous state is written to and read from the store: pickled, and signed
    with the job's token when there is one (``token``; None or empty: unsigned, as
    torchrun writes it)."""

    def __init__(self, token: str | None):
        self.key = purpose_key(token, "rendezvous-state") if token else None

    def dumps(self, state: Any) -> bytes:
        bits = pickle.dumps(state)
        if self.key is None:
            return bits
        return SIGNED + hmac.new(self.key, bits, hashlib.sha256).digest() + bits

    def verified(self, raw: bytes) -> bytes:
        """The pickle of a state read from the store, its signature checked first (nothing
        is unpickled before that); ForgedState naming why it is refused."""
        if self.key is None:
            return raw
        if not raw.startswith(SIGNED):
            raise ForgedState("the rendezvous state is not signed with the job's token")
        mac, bits = raw[len(SIGNED):len(SIGNED) + MAC_BYTES], raw[len(SIGNED) + MAC_BYTES:]
        if not hmac.compare_digest(mac, hmac.new(self.key, bits, hashlib.sha256).digest()):
            raise ForgedState("the rendezvous state's signature does not match the job's token")
        return bits

    def loads(self, raw: bytes) -> Any:
        """torchrun's state from the store's bytes: the signature checked, then only
        torchrun's own types built (``load_state``)."""
        return load_state(self.verified(raw))
