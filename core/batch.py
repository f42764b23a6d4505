"""The batch schema: every tensor key of a mini-batch, and the one conversion to PyG.

A batch travels as a ``dict[str, Tensor]`` with exactly the keys of :data:`BATCH_KEYS`
(torch RPC pickles tensors without copying them through protobuf).  Both the local
loader and the remote loader turn it into a ``torch_geometric.data.Data`` with
:func:`to_pyg`, so they yield identical batches.
"""
from __future__ import annotations

from typing import Mapping

import torch

# key -> (dtype, meaning).  Node-level tensors are aligned with ``n_id``.
BATCH_KEYS: dict[str, tuple[torch.dtype | None, str]] = {
    "x": (None, "node features of n_id, [num_nodes, F] (dtype as stored)"),
    "y": (None, "labels of n_id, [num_nodes]"),
    "edge_index": (torch.int64, "sampled edges in local ids, [2, num_edges], row = source"),
    "n_id": (torch.int64, "original ids of the batch's nodes, seeds first"),
    "e_id": (torch.int64, "original ids (input positions) of the sampled edges"),
    "num_sampled_nodes": (torch.int64, "new nodes per hop, [hops + 1], first = batch_size"),
    "num_sampled_edges": (torch.int64, "edges per hop, [hops]"),
    "meta": (torch.int64, "[batch_size, epoch, seq, batch index in the epoch]"),
}


class BatchSchemaError(ValueError):
    """A batch dict does not match :data:`BATCH_KEYS` (a version mismatch between peers)."""


def encode(*, x: torch.Tensor, y: torch.Tensor, edge_index: torch.Tensor, n_id: torch.Tensor,
           e_id: torch.Tensor, num_sampled_nodes, num_sampled_edges, batch_size: int, epoch: int,
           seq: int, index: int) -> dict[str, torch.Tensor]:
    """Build the wire form of a batch."""
    return {
        "x": x, "y": y, "edge_index": edge_index, "n_id": n_id, "e_id": e_id,
        "num_sampled_nodes": torch.as_tensor(num_sampled_nodes, dtype=torch.int64),
        "num_sampled_edges": torch.as_tensor(num_sampled_edges, dtype=torch.int64),
        "meta": torch.tensor([batch_size, epoch, seq, index], dtype=torch.int64),
    }


def nbytes(batch: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())


def check(batch: Mapping[str, torch.Tensor]) -> None:
    if set(batch) != set(BATCH_KEYS):
        raise BatchSchemaError(f"batch keys {sorted(batch)} do not match the schema {sorted(BATCH_KEYS)}; "
                               f"client and server run different graphfeed versions")


def to_pyg(batch: Mapping[str, torch.Tensor]):
    """The PyG ``Data`` of a batch: ``x, y, edge_index, n_id, e_id, batch_size,
    num_sampled_nodes, num_sampled_edges, epoch, seq`` (like ``NeighborLoader``'s output)."""
    from torch_geometric.data import Data

    check(batch)
    batch_size, epoch, seq, index = batch["meta"].tolist()
    return Data(x=batch["x"], y=batch["y"], edge_index=batch["edge_index"], n_id=batch["n_id"],
                e_id=batch["e_id"], batch_size=batch_size,
                num_sampled_nodes=batch["num_sampled_nodes"].tolist(),
                num_sampled_edges=batch["num_sampled_edges"].tolist(),
                epoch=epoch, seq=seq, batch_index=index)
