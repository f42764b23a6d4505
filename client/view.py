"""What the loaders, online sampling and the hot-feature cache use of their :class:`~graphfeed.client.client.Client`.

A :class:`typing.Protocol`: ``client.client`` imports those modules to build them, so they name the
client by this view instead of importing ``client.client`` back (no import cycle, not even a type-only one).
"""
from __future__ import annotations

import collections
from concurrent.futures import Executor
from typing import Callable, Protocol, TypeVar

from graphfeed.client.cluster import ServerConn
from graphfeed.client.group import DataGroup

T = TypeVar("T")


class ClientView(Protocol):
    servers: list[ServerConn]
    group: DataGroup
    timeout: float
    rpc_timeout: float
    generation: int                 # +1 each time the data-path group is re-formed
    num_parts: int
    num_nodes: int                  # of the label type
    node_types: list[str]
    label_type: str
    _orphans: collections.deque[tuple[int, str]]   # (part, session) of loaders dropped without close()

    def num_nodes_of(self, ntype: str | None) -> int: ...

    control_pool: Executor          # every control call to all servers at once (client.sessions.SessionSet)

    def _check_usable(self) -> None: ...

    def recover(self, where: tuple[str, str], cause: BaseException | None, generation: int) -> int: ...

    def call_with_recovery(self, what: str, fn: Callable[[], T]) -> T: ...

    def server_name(self, part: int) -> str: ...

    def track(self, sessions) -> None: ...

    def untrack(self, sessions) -> None: ...

    def remove_loader(self, loader) -> None: ...
