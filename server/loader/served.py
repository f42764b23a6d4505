"""The in-process loaders' side of ``data=`` (:mod:`graphfeed.core.data_check`): what their parts serve.

Rows are read as a session worker's ``node_rows`` reads them (each part's source ``gather``s the ids it
owns), so the local loader checks the same rows the remote loader asks the servers for.
"""
from __future__ import annotations

import torch

from graphfeed.server.sampling.graph import PartitionedGraph


class PartsServed:
    """A :class:`~graphfeed.core.data_check.ServedGraph` over every part of ``graph`` in this process."""

    def __init__(self, graph: PartitionedGraph):
        self.graph = graph
        self.node_types, self.label_type = list(graph.node_types), graph.label_type

    def num_nodes(self, ntype: str) -> int:
        return int(self.graph.books[ntype].num_nodes)

    def num_edges(self) -> int:
        return int(sum(self.graph.parts[0].meta.num_edges.values()))

    def rows(self, ntype: str, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stored ``x``/``y`` of original ids ``ids`` (in order), gathered part by part."""
        out: dict[str, torch.Tensor] = {}
        for held in (s.held() for s in self.graph.sources):
            if held is None:
                continue
            mask, gids = held.part.nodes(ntype).to_global(ids)
            if not bool(mask.any()):
                continue
            for name, rows in held.gather(ntype, gids).items():
                if rows is None or name == "n_id":
                    continue
                if name not in out:
                    out[name] = torch.empty((ids.numel(), *rows.shape[1:]), dtype=rows.dtype)
                out[name][mask] = rows.cpu()
        return out
