"""Typed link practice without trips (issue #40, item 8): each first stumble of a typed link script is one line
that names the fix -- ``x_dict`` of id-only types names ``n_id`` (tests/core/test_hetero.py), times on the
edges under PyG's ``time`` name ``edge_time`` (partition's hint line and the loader's error), and a typed
batch from graphfeed's loaders is that ``TypedBatch``."""
from __future__ import annotations

import pytest
import torch
from helpers.graphs import hand_made_typed_arrays, hetero_data

from graphfeed.cli.main import main
from graphfeed.core.hetero import TypedBatch
from graphfeed.server.loader.local import LocalNeighborLoader


def test_partition_names_edge_time_for_times_stored_on_edges(tmp_path, capsys):
    data = hetero_data(hand_made_typed_arrays())
    buys = ("user", "buys", "item")
    data[buys].time = torch.arange(data[buys].edge_index.shape[1])
    torch.save(data, tmp_path / "g.pt")
    assert main(["partition", str(tmp_path / "g.pt"), "-p", "2", "-o", str(tmp_path / "out"), "-q"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert f"graphfeed partition: edge times are read as edge_time: rename data[{buys!r}].time to " \
           f"data[{buys!r}].edge_time, partition again and sample with time_attr='edge_time'" in err, err


def test_node_time_error_names_edge_time_and_typed_batches_are_typed_batch(shared_mag):
    parts, _ = shared_mag
    seeds = dict(batch_size=8, input_nodes=("paper", torch.arange(8)))
    with pytest.raises(ValueError, match=r"time_attr='time' names no stored time column of edge type .* or give "
                                         r"this edge type fanout 0; times the edges carry are edge times: store "
                                         r"them as data\[\(.*\)\]\.edge_time and pass time_attr='edge_time'$"):
        list(LocalNeighborLoader(parts, [2], time_attr="time", input_time=torch.zeros(8, dtype=torch.int64),
                                 **seeds))
    batch = next(iter(LocalNeighborLoader(parts, [2], **seeds)))
    assert isinstance(batch, TypedBatch) and "x" in batch["paper"] and "x" not in batch["author"]
    assert set(batch.x_dict) == {t for t in batch.node_types if "x" in batch[t]}   # PyG's: id-only types left out
