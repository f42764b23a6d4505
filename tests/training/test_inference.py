"""The layer-wise inference recipe of docs/how-to/node-loaders.md (PyG's ``examples/reddit.py`` pattern) over the
service gives the predictions of full-batch inference, although seeds arrive partition by partition; with
``ordered=True`` the unchanged (appending) recipe does too."""
from __future__ import annotations

import pytest
import torch
from helpers.gnn import SAGE

import graphfeed.client as gf
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster


@torch.no_grad()
def layerwise_inference(model: SAGE, loader, num_nodes: int) -> torch.Tensor:
    """The docs' recipe: one full-neighborhood hop per layer, each batch's seed rows written to
    the seeds' own rows (``n_id[:batch_size]``), never appended in arrival order."""
    h_all = None                                   # the previous layer's output for every node
    for i, conv in enumerate(model.convs):
        out = torch.empty(num_nodes, conv.out_channels)
        for batch in loader:
            h = batch.x if h_all is None else h_all[batch.n_id]
            h = conv(h, batch.edge_index)[:batch.batch_size]
            out[batch.n_id[:batch.batch_size]] = h.relu() if i < len(model.convs) - 1 else h
        h_all = out
    return h_all


@torch.no_grad()
def appending_inference(model: SAGE, loader) -> torch.Tensor:
    """PyG's ``examples/reddit.py`` as written: each layer's outputs appended in arrival order
    (correct only when the loader delivers the nodes in id order: ``ordered=True``)."""
    h_all = None
    for i, conv in enumerate(model.convs):
        outs = []
        for batch in loader:
            h = batch.x if h_all is None else h_all[batch.n_id]
            h = conv(h, batch.edge_index)[:batch.batch_size]
            outs.append(h.relu() if i < len(model.convs) - 1 else h)
        h_all = torch.cat(outs)
    return h_all


@pytest.mark.slow
def test_layerwise_inference_over_the_service_equals_full_batch(tmp_path):
    ei, x, y, splits = synth.generate(2000, 6, 8, 4)
    parts = tmp_path / "parts"
    builder.partition_graph(builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, name="infer-2000",
                                               fingerprint="infer-2000", num_classes=4), 2, parts)
    x, edge_index = torch.as_tensor(x), torch.as_tensor(ei)   # the whole graph, original ids
    num_nodes = x.size(0)

    torch.manual_seed(0)
    model = SAGE([x.size(1), 16, 4], dropout=0.0).eval()
    with torch.no_grad():
        full = model(x, edge_index)
    with running_cluster(parts, log_dir=tmp_path / "logs") as servers:
        with gf.connect([s.address for s in servers], timeout=120) as client:
            loader = client.neighbor_loader(input_nodes=None, num_neighbors=[-1], batch_size=256, shuffle=False,
                                            ordered=False)   # part by part, by name (the default is input order)
            served = layerwise_inference(model, loader, num_nodes)
            first = next(iter(loader))
            # the seeds do not arrive in node order: appending outputs would misplace them
            arrival = torch.cat([b.n_id[:b.batch_size] for b in loader])
            ordered = client.neighbor_loader(input_nodes=None, num_neighbors=[-1], batch_size=256, shuffle=False)
            appended = appending_inference(model, ordered)
    assert not torch.equal(arrival, torch.arange(num_nodes)) and first.batch_size <= 256
    assert sorted(arrival.tolist()) == list(range(num_nodes))
    torch.testing.assert_close(served, full, rtol=1e-4, atol=1e-5)
    assert torch.equal(served.argmax(1), full.argmax(1))
    torch.testing.assert_close(appended, full, rtol=1e-4, atol=1e-5)   # the default order: reddit.py unchanged works
