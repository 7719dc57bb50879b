"""torchrun's rendezvous state, read without running anything it names.

The state lives pickled in the rendezvous store, which any pod that reaches the store's
port can write. torchrun's agents and the store's lease server both read it: with a
plain ``pickle.loads`` a forged state naming ``os.system`` runs in every worker pod (with
the S3 keys in its environment). Here only the types torchrun's state is made of are
built; anything else is refused before it runs. Standard library only: the torchrun
agent loads this file by path from a bundle in a user's image (``launch/torchrun_agent.py``).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

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
