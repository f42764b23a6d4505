"""The remote loaders' side of ``data=`` (:mod:`graphfeed.core.data_check`): what the servers serve.

Node counts and the edge count come from the servers' cluster info; rows from one ``node_rows`` call per
server (the call PyG's feature store makes), each answering for the ids its part owns.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from graphfeed.client.errors import ServerError

if TYPE_CHECKING:
    from graphfeed.client.view import ClientView

WAIT_SLACK = 30.0   # seconds beyond rpc_timeout a node_rows answer may take


class ServersServed:
    """A :class:`~graphfeed.core.data_check.ServedGraph` over the servers of ``client``."""

    def __init__(self, client: ClientView):
        self.client = client
        self.node_types, self.label_type = list(client.node_types), client.label_type

    def num_nodes(self, ntype: str) -> int:
        return self.client.num_nodes_of(ntype)

    def num_edges(self) -> int:
        return int(self.client.servers[0].cluster_info.num_edges)

    def rows(self, ntype: str, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stored ``x``/``y`` of original ids ``ids`` (in order): every server answers for its part's."""
        client = self.client
        calls = client.group.calls
        pending = [calls.call(p, "node_rows", (ntype, ids), client.rpc_timeout) for p in range(len(client.servers))]
        out: dict[str, torch.Tensor] = {}
        for server, p in zip(client.servers, pending):
            try:
                mask, rows = p.result(client.rpc_timeout + WAIT_SLACK)
            except Exception as exc:  # noqa: BLE001 -- a refused or lost call, named like the loaders name it
                raise ServerError(server.name, f"node_rows for the data= check failed: {exc}") from exc
            for name, values in rows.items():
                if name not in out:
                    out[name] = torch.empty((ids.numel(), *values.shape[1:]), dtype=values.dtype)
                out[name][mask] = values
        return out
