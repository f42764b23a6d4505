"""``data=`` on every loader: a script's ``Data``/``HeteroData`` checked against what the loader serves (issue 40).

PyG's ``graph_sage_unsup.py`` normalises its dataset; after the loader swap the servers serve the raw
rows.  Handed the script's ``data``, both loaders compare a sample with what they serve and refuse in one
line naming the difference and the fix; ``transform=`` makes the batches (and the check) agree;
``verify=False`` warns.  Real ``graphfeed serve`` daemons on loopback (2 parts, 2000 nodes of bag-of-words
rows, as Cora's) and the local loader over the same parts; typed graphs through the local loader.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.graphs import assert_same_batch
from torch_geometric.data import Data, HeteroData
from torch_geometric.transforms import AddSelfLoops, NormalizeFeatures

import graphfeed.client as gf
from graphfeed.core.data_check import DataMismatchWarning
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster

FANOUTS = [5, 3]
REFUSED_X = r"^data= differs from the graph this loader serves: x differs \(node \d+: row sum [\d.]+ in data, " \
            r"[\d.]+ served\)\. Fix: .*transform=.*re-partition the transformed data"


@pytest.fixture(scope="module")
def graph():
    ei, x, y, splits = synth.generate(2000, 8, 16, 4, seed=5)
    return ei, (x > 0).astype("float32"), y, splits    # bag-of-words rows: NormalizeFeatures acts per row


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    ei, x, y, splits = graph
    out = tmp_path_factory.mktemp("dropin_data") / "parts"
    builder.partition_graph(builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=4, name="dd",
                                               fingerprint="dd"), 2, out, method="metis", topologies=("csc", "csr"))
    return out


@pytest.fixture(scope="module")
def addresses(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield [s.address for s in servers]


def _data(graph) -> Data:
    ei, x, y, splits = graph
    mask = torch.zeros(x.shape[0], dtype=torch.bool)
    mask[torch.as_tensor(splits["train"])] = True
    return Data(x=torch.as_tensor(x), y=torch.as_tensor(y), edge_index=torch.as_tensor(ei), train_mask=mask)


def _normalised(graph) -> Data:
    return NormalizeFeatures()(_data(graph))   # what graph_sage_unsup.py does to its dataset


# ---- the local loaders --------------------------------------------------------------------------------

def test_local_identical_data_passes_and_normalised_features_are_refused_in_one_line(graph, parts_dir):
    data, normalised = _data(graph), _normalised(graph)
    assert len(LocalNeighborLoader(parts_dir, FANOUTS, batch_size=64, data=data)) > 0
    assert len(LocalLinkNeighborLoader(parts_dir, FANOUTS, batch_size=64, data=data)) > 0
    for make in (lambda **kw: LocalNeighborLoader(parts_dir, FANOUTS, batch_size=64, **kw),
                 lambda **kw: LocalLinkNeighborLoader(parts_dir, FANOUTS, batch_size=64, **kw)):
        with pytest.raises(ValueError, match=REFUSED_X) as refused:
            make(data=normalised)
        assert "\n" not in str(refused.value) and "verify=False" in str(refused.value)
        with pytest.warns(DataMismatchWarning, match=r"x differs \(node \d+: row sum"):
            loader = make(data=normalised, verify=False)
        assert len(list(loader)) == len(loader) > 0   # a warning only: the loader serves


def test_local_transform_passes_the_check_and_batches_carry_the_normalised_rows(graph, parts_dir):
    normalised = _normalised(graph)
    loader = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=128, data=normalised, transform=NormalizeFeatures())
    for batch in loader:
        assert torch.allclose(batch.x, normalised.x[batch.n_id])


def test_local_other_differences_are_named(graph, parts_dir):
    labels = _data(graph)
    labels.y = labels.y.clone()
    labels.y[0] = (labels.y[0] + 1) % 4
    with pytest.raises(ValueError, match=r"y differs \(node 0: \d in data, \d served\)"):
        LocalNeighborLoader(parts_dir, FANOUTS, data=labels)
    loops = AddSelfLoops()(_data(graph))
    with pytest.raises(ValueError, match=rf"edge count: {loops.num_edges} in data, {graph[0].shape[1]} served"):
        LocalNeighborLoader(parts_dir, FANOUTS, data=loops)
    fewer = _data(graph).subgraph(torch.arange(1000))
    with pytest.raises(ValueError, match="node count: 1000 in data, 2000 served"):
        LocalNeighborLoader(parts_dir, FANOUTS, data=fewer)
    with pytest.raises(TypeError, match="data= takes the script's torch_geometric Data"):
        LocalNeighborLoader(parts_dir, FANOUTS, data=torch.zeros(3))
    with pytest.raises(TypeError, match="first argument got a Data.*partition folder first.*data="):
        LocalNeighborLoader(_data(graph), FANOUTS)
    older = LocalNeighborLoader(data=str(parts_dir), num_neighbors=FANOUTS)   # the first argument's old name
    assert len(older) == len(LocalNeighborLoader(parts_dir, FANOUTS))


def _hetero(mag_graph) -> HeteroData:
    data = HeteroData()
    for ntype in mag_graph.node_types:
        nodes = mag_graph.nodes[ntype]
        data[ntype].num_nodes = nodes.num_nodes
        for name in ("x", "y"):
            if getattr(nodes, name) is not None:
                data[ntype][name] = torch.as_tensor(getattr(nodes, name))
    for etype in mag_graph.edge_types:
        data[etype].edge_index = torch.as_tensor(mag_graph.edges[etype].edge_index)
    return data


def test_local_hetero_data_is_checked_per_node_type(shared_mag):
    parts, mag_graph = shared_mag
    fanouts = {e: [3, 2] for e in mag_graph.edge_types}
    data = _hetero(mag_graph)
    LocalNeighborLoader(parts, fanouts, input_nodes=("paper", "train"), batch_size=256, data=data)
    scaled = _hetero(mag_graph)
    scaled["field"].x = scaled["field"].x * 2
    with pytest.raises(ValueError, match=r"'field' x differs \(node \d+: row sum"):
        LocalNeighborLoader(parts, fanouts, input_nodes=("paper", "train"), data=scaled)
    with pytest.raises(ValueError, match="data is a Data but the served graph is typed.*pass the HeteroData"):
        LocalNeighborLoader(parts, fanouts, input_nodes=("paper", "train"), data=Data(x=torch.zeros(3, 1)))


# ---- the remote loaders (real servers) ---------------------------------------------------------------

def test_remote_refuses_normalised_features_and_passes_identical_data(addresses, graph):
    data, normalised = _data(graph), _normalised(graph)
    with gf.connect(addresses, timeout=60) as client:
        assert len(client.neighbor_loader(data.train_mask, FANOUTS, batch_size=64, data=data)) > 0
        assert len(client.link_neighbor_loader(FANOUTS, batch_size=64, data=data)) > 0
        for make in (lambda **kw: client.neighbor_loader(data.train_mask, FANOUTS, batch_size=64, **kw),
                     lambda **kw: client.link_neighbor_loader(FANOUTS, batch_size=64, **kw)):
            with pytest.raises(ValueError, match=REFUSED_X) as refused:
                make(data=normalised)
            assert "\n" not in str(refused.value)
            with pytest.warns(DataMismatchWarning, match=r"x differs \(node \d+: row sum"):
                loader = make(data=normalised, verify=False)
            assert len(list(loader)) == len(loader) > 0
        with pytest.raises(TypeError, match=r"takes no graph .*data=data"):
            client.neighbor_loader(data, FANOUTS)


def test_remote_with_transform_equals_the_in_process_run(addresses, graph, parts_dir):
    normalised = _normalised(graph)
    args = dict(batch_size=128, shuffle=True, seed=3, data=normalised, transform=NormalizeFeatures())
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, input_nodes=normalised.train_mask, **args))
    with gf.connect(addresses, timeout=60) as client:
        remote = list(client.neighbor_loader(normalised.train_mask, FANOUTS, **args))
    assert len(remote) == len(local) > 1
    for a, b in zip(remote, local, strict=True):
        assert_same_batch(a, b)
        assert torch.allclose(a.x, normalised.x[a.n_id])   # what the script's normalised dataset holds
