"""A wire batch as PyG's sampler output (fast tier: batches made in this process by the producer the workers run)."""
from __future__ import annotations

import numpy as np
import torch
from torch_geometric.sampler import SamplerOutput

from graphfeed.core import batch as batch_codec
from graphfeed.core.spec import LinkInput, NegativeSampling, NodeInput
from graphfeed.pyg.convert import BatchRows, to_sampler_output
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.sampling.adhoc import produce_for_seeds


def test_node_and_link_batches_become_sampler_outputs_with_pyg_metadata(tiny_parts_dir, tiny_graph):
    graph = LocalNeighborLoader(tiny_parts_dir, [3, 2], batch_size=4)
    spec = graph.spec.sampling
    wire = produce_for_seeds(graph.graph, NodeInput(ids=torch.tensor([5, 9000, 17])), torch.tensor([7, 8, 9]), spec, 1)
    data = batch_codec.to_pyg(wire)
    out, rows = to_sampler_output(wire, None, link=False)
    assert isinstance(out, SamplerOutput) and out.node is rows.nodes["_N"]
    assert torch.equal(torch.stack([out.row, out.col]), data.edge_index) and torch.equal(out.edge, data.e_id)
    assert out.num_sampled_nodes == data.num_sampled_nodes and out.num_sampled_edges == data.num_sampled_edges
    input_id, seed_time, batch_rows = out.metadata
    assert input_id.tolist() == [7, 8, 9] and seed_time is None and isinstance(batch_rows, BatchRows)
    assert torch.equal(rows.rows["_N"]["x"], torch.from_numpy(np.asarray(tiny_graph.x)[out.node.numpy()]))
    assert out.batch is None and rows.edge_rows == {}

    index = torch.from_numpy(np.array(tiny_graph.edge_index[:, :6], dtype=np.int64))
    for neg, fields in ((NegativeSampling("binary"), ("edge_label_index", "edge_label")),
                        (NegativeSampling("triplet", 2), ("src_index", "dst_pos_index", "dst_neg_index"))):
        wire = produce_for_seeds(graph.graph, LinkInput(index, None, neg), torch.arange(10, 16), spec, 3)
        out, _ = to_sampler_output(wire, neg.mode, link=True)
        assert out.metadata[0].tolist() == list(range(10, 16))
        for i, name in enumerate(fields, 1):
            assert torch.equal(out.metadata[i], wire[name])
        assert out.metadata[len(fields) + 1] is None   # edge_label_time / seed_time: not temporal


def test_int8_batch_rows_are_handed_over_dequantized(tiny_parts_dir):
    graph = LocalNeighborLoader(tiny_parts_dir, [3, 2], batch_size=4)
    seeds = NodeInput(ids=torch.tensor([5, 17]))
    full = produce_for_seeds(graph.graph, seeds, torch.tensor([0, 1]), graph.spec.sampling, 1)
    wire = produce_for_seeds(graph.graph, seeds, torch.tensor([0, 1]), graph.spec.sampling, 1,
                             feature_dtype=torch.int8)
    assert wire["x@_N"].dtype == torch.int8
    _, rows = to_sampler_output(wire, None, link=False)
    x = rows.rows["_N"]["x"]
    assert x.dtype == torch.float32 and ((x - full["x@_N"]).abs() <= wire["x_scale@_N"] / 2 + 1e-6).all()
