"""graphfeed's typed batch class (:class:`graphfeed.core.hetero.TypedBatch`): PyG's ``HeteroData`` except for
``x_dict`` on a batch whose node types are all id-only, which names ``n_id``."""
from __future__ import annotations

import pickle

import pytest
import torch
from torch_geometric.data import HeteroData

from graphfeed.core.hetero import TypedBatch


def _batch(with_x: bool) -> TypedBatch:
    batch = TypedBatch()
    batch["user"].n_id, batch["user"].num_nodes = torch.tensor([4, 0, 2]), 3
    batch["movie"].n_id, batch["movie"].num_nodes = torch.tensor([1, 7]), 2
    if with_x:
        batch["movie"].x = torch.ones(2, 3)
    batch["user", "rates", "movie"].edge_index = torch.tensor([[0, 1, 2], [0, 1, 1]])
    return batch


def test_x_dict_of_id_only_types_names_n_id():
    with pytest.raises(KeyError, match=r"no node type of this batch has 'x': 'user', 'movie' are id-only .*"
                                       r"batch\[node_type\]\.n_id holds its nodes' original ids"):
        _ = _batch(with_x=False).x_dict
    assert _batch(with_x=False).collect("x", allow_empty=True) == {}
    with pytest.raises(KeyError, match="Tried to collect 'y'"):   # other keys: PyG's own words
        _ = _batch(with_x=False).y_dict


def test_otherwise_it_is_pygs_heterodata():
    batch = _batch(with_x=True)
    assert isinstance(batch, HeteroData) and set(batch.x_dict) == {"movie"}   # PyG's: id-only types left out
    assert set(batch.n_id_dict) == {"user", "movie"}
    again = pickle.loads(pickle.dumps(batch))
    assert type(again) is TypedBatch and torch.equal(again["movie"].x, batch["movie"].x)
    assert type(batch.clone()) is TypedBatch and type(batch.to("cpu")) is TypedBatch
