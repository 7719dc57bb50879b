"""A real c10d TCPStore for the rendezvous tests, on a port whose lease port (the next) is
free too: port 0 would come from the ephemeral range, where the next port may be any
client's (it was once, on CI)."""

from __future__ import annotations

import datetime

import pytest
from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET
from llmtrain_contract.ports import free_ports

from torch.distributed import TCPStore


@pytest.fixture()
def store():
    master = TCPStore("127.0.0.1", free_ports(1 + RDZV_LEASE_PORT_OFFSET), is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=10), use_libuv=True)
    yield master
    del master
