"""Where a rank stands in its job: torchrun's environment, as one value.

Torch-free and dependency-free, so that every room of the rank side (``train``,
``engines``, ``checkpoint``) can take it without importing the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    """torchrun's GROUP_RANK: which node (agent) this rank runs on."""
    restart_count: int
    """TORCHELASTIC_RESTART_COUNT: how many times torchrun restarted this worker group."""
    backend: str

    @classmethod
    def of(cls, rank: int, world_size: int, backend: str, env: Mapping[str, str]) -> DistInfo:
        """A rank of a process group, placed by torchrun's environment ``env``."""
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
        return cls(rank=rank, world_size=world_size, local_rank=int(env.get("LOCAL_RANK", "0")), local_world_size=local_world,
                   node_rank=int(env.get("GROUP_RANK", str(rank // max(local_world, 1)))),
                   restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")), backend=backend)

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def is_node_leader(self) -> bool:
        return self.local_rank == 0

    def ranks_on_node(self, node: int | None = None) -> range:
        node = self.node_rank if node is None else node
        return range(node * self.local_world_size, (node + 1) * self.local_world_size)
