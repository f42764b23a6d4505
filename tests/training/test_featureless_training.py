"""A featureless homogeneous graph (no x.npy: labels and edges only) partitions, is served without ``x``, and trains
with a server-held embedding table (``client.embedding(..., field="x")``) to an accuracy far above chance.

The graph is four planted communities whose class is the community, node ids shuffled: nothing but the structure
carries the class, so only embeddings learned over the edges can predict it."""
from __future__ import annotations

import numpy as np
import torch
from helpers.shared import serving

import graphfeed.client as gf
from graphfeed.cli.main import main
from graphfeed.server.partition.format.layout import read_meta
from graphfeed.server.partition.format.store import open_parts

CLASSES, PER_CLASS, DIM = 4, 150, 16


def _community_graph(folder) -> None:
    """``CLASSES`` communities of ``PER_CLASS`` nodes (8 neighbours inside, ~1 outside per node, both directions),
    labels = community, ids shuffled; train on a quarter of the nodes, validate on another quarter; no x.npy."""
    rng = np.random.default_rng(0)
    n = CLASSES * PER_CLASS
    community = np.repeat(np.arange(CLASSES), PER_CLASS)
    src = np.repeat(np.arange(n), 9)
    inside = community[src] * PER_CLASS + rng.integers(0, PER_CLASS, src.size)
    dst = np.where(rng.random(src.size) < 0.9, inside, rng.integers(0, n, src.size))
    perm = rng.permutation(n)                       # new id of each node: the ids say nothing about the class
    edge_index = perm[np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])]
    y = np.empty(n, np.int64)
    y[perm] = community
    order = rng.permutation(n)
    folder.mkdir()
    np.save(folder / "edge_index.npy", edge_index.astype(np.int64))
    np.save(folder / "y.npy", y)
    np.save(folder / "train_idx.npy", np.sort(order[: n // 4]))
    np.save(folder / "val_idx.npy", np.sort(order[n // 4: n // 2]))


def _partitioned(tmp_path):
    _community_graph(tmp_path / "graph")
    assert main(["partition", str(tmp_path / "graph"), "-p", "2", "-o", str(tmp_path / "parts"), "-q"]) == 0
    return tmp_path / "parts"


def _model():
    from torch_geometric.nn import SAGEConv

    class SAGE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = SAGEConv(DIM, 32), SAGEConv(32, CLASSES)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return SAGE()


def _inputs(batch) -> torch.Tensor:
    """The batch's node inputs: its table rows, or -- the plain model, no table -- zeros of the same shape."""
    return batch.x if "x" in batch else torch.zeros(batch.num_nodes, DIM)


def _accuracy(model, loader) -> float:
    correct = total = 0
    with torch.no_grad():
        for batch in loader:
            pred = model(_inputs(batch), batch.edge_index)[: batch.batch_size].argmax(-1)
            correct += int((pred == batch.y[: batch.batch_size]).sum())
            total += batch.batch_size
    return correct / total


def _train(client, table) -> float:
    """Validation accuracy of the model trained for 6 epochs with ``table`` (None: the plain model)."""
    torch.manual_seed(0)
    tables = [table] if table is not None else []
    train = client.neighbor_loader("train", [5, 5], batch_size=32, shuffle=True, seed=0, embeddings=tables)
    val = client.neighbor_loader("val", [5, 5], batch_size=64, embeddings=tables)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sparse = gf.SparseAdam(tables, lr=0.05) if tables else None
    for _ in range(6):
        for batch in train:
            loss = torch.nn.functional.cross_entropy(model(_inputs(batch), batch.edge_index)[: batch.batch_size],
                                                     batch.y[: batch.batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sparse is not None:
                sparse.step()
    accuracy = _accuracy(model, val)
    for loader in (train, val):
        loader.close()
    return accuracy


def test_featureless_graph_partitions_without_x(tmp_path):
    parts = _partitioned(tmp_path)
    meta = read_meta(parts)
    assert "x" not in meta.features["_N"] and "y" in meta.features["_N"] and meta.num_classes == CLASSES
    _, stores = open_parts(parts)
    assert all(store.nodes("_N").x is None for store in stores)


def test_featureless_graph_trains_with_a_server_embedding_table(tmp_path):
    parts = _partitioned(tmp_path)
    with serving(parts, log_dir=tmp_path / "logs") as servers, \
            gf.connect([s.address for s in servers], timeout=60) as client:
        with client.neighbor_loader("train", [5, 5], batch_size=32) as plain:
            batch = next(iter(plain))
        assert "x" not in batch and batch.y.numel() == batch.num_nodes     # served without features
        without = _train(client, None)
        table = client.embedding("_N", dim=DIM, seed=0, field="x")
        with_table = _train(client, table)
        table.close()
    # chance is 1/CLASSES: the plain model sees zeros; the table's rows learn the communities over the edges
    assert without <= 0.4 and with_table >= 0.6 and with_table >= without + 0.3, (without, with_table)
