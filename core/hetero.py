"""graphfeed's typed batch class: PyG's ``HeteroData``, with graphfeed's words where PyG's would leave a
script without features guessing.

Imported when the first typed batch is built (:func:`graphfeed.core.batch.to_pyg`), so processes that never
build one (the servers) never import PyG's data classes for it.
"""
from __future__ import annotations

import torch
from torch_geometric.data import HeteroData


class TypedBatch(HeteroData):
    """A typed batch: a ``HeteroData`` in every respect but one.  ``batch.x_dict`` (``collect("x")``) when no
    node type of the batch has ``x`` -- every type id-only, stored without features -- raises a KeyError that
    names what such a type carries (``n_id``, its nodes' original ids, the index of an ``Embedding``, or a
    server table's rows with ``client.embedding(..., field="x")``) instead of PyG's "Tried to collect 'x'".
    Anything else, a type with ``x`` beside id-only ones included (``x_dict`` then leaves those out), is PyG's."""

    def collect(self, key: str, allow_empty: bool = False):
        if key == "x" and not allow_empty and not any("x" in store for store in self.stores):
            raise KeyError(f"no node type of this batch has 'x': {', '.join(map(repr, self.node_types))} "
                           f"{'is' if len(self.node_types) == 1 else 'are'} id-only (stored without features); "
                           f"each type's batch[node_type].n_id holds its nodes' original ids: index an Embedding "
                           f"with it, or give the loader a server table, client.embedding(node_type, dim, "
                           f"field='x'), whose rows arrive as x")
        return super().collect(key, allow_empty)


if hasattr(torch.serialization, "add_safe_globals"):   # torch.load(weights_only=True) of a saved batch, as PyG's
    torch.serialization.add_safe_globals([TypedBatch])
