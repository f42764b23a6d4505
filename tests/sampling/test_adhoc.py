"""Ad-hoc batches (``produce_for_seeds``, what PyG's samplers ask the workers for) equal the loaders' batches
for the same seeds, positions and batch seed; bad seeds are one-line ValueErrors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch

from graphfeed.core import batch as batch_codec
from graphfeed.core.seeding import batch_seed
from graphfeed.core.spec import LinkInput, NegativeSampling, NodeInput
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.sampling.adhoc import produce_for_seeds

POSITION = ("epoch", "seq", "batch_index")


def _without_position(batch):
    batch = batch.clone()
    for key in POSITION:
        del batch[key]
    return batch


def test_node_seeds_equal_the_loaders_batch_with_its_batch_seed(tiny_parts_dir):
    ids = torch.randperm(10_000, generator=torch.Generator().manual_seed(4))[:150]
    loader = LocalNeighborLoader(tiny_parts_dir, [4, 3], input_nodes=ids, batch_size=50, seed=11)
    for i, want in enumerate(loader):
        positions = torch.arange(50 * i, 50 * (i + 1))
        wire = produce_for_seeds(loader.graph, NodeInput(ids=ids[positions]), positions, loader.spec.sampling,
                                 batch_seed(11, 0, i))
        assert_same_batch(_without_position(batch_codec.to_pyg(wire)), _without_position(want))
        assert want.edge_index.size(1) > 0


@pytest.mark.parametrize("neg", [NegativeSampling("binary", 2.0), NegativeSampling("triplet", 3)])
def test_seed_edges_equal_the_link_loaders_batch_with_its_batch_seed_and_positions(tiny_parts_dir, tiny_graph, neg):
    index = torch.from_numpy(np.array(tiny_graph.edge_index[:, ::500], dtype=np.int64))
    loader = LocalLinkNeighborLoader(tiny_parts_dir, [3, 2], edge_label_index=index, batch_size=40, shuffle=True,
                                     seed=2, neg_sampling=neg)
    for i, want in enumerate(loader):
        positions = want.input_id   # the batch's seed edges' positions in edge_label_index
        link = LinkInput(index[:, positions], None, neg)
        wire = produce_for_seeds(loader.graph, link, positions, loader.spec.sampling, batch_seed(2, 0, i))
        assert_same_batch(_without_position(batch_codec.to_pyg(wire)), _without_position(want))


def test_bad_seeds_are_one_line_value_errors(tiny_parts_dir):
    loader = LocalNeighborLoader(tiny_parts_dir, [2], batch_size=4)
    graph, spec = loader.graph, loader.spec.sampling
    with pytest.raises(ValueError, match="node_ids\\[1\\] = 10000 is outside the graph: original node ids are 0..9999"):
        produce_for_seeds(graph, NodeInput(ids=torch.tensor([1, 10_000])), torch.arange(2), spec, 0)
    with pytest.raises(ValueError, match="positions has 1 entries for 2 seed nodes"):
        produce_for_seeds(graph, NodeInput(ids=torch.tensor([1, 2])), torch.arange(1), spec, 0)
    with pytest.raises(ValueError, match="positions must be a 1-D integer tensor"):
        produce_for_seeds(graph, NodeInput(ids=torch.tensor([1, 2])), torch.zeros(2), spec, 0)
    with pytest.raises(ValueError, match="edge type \\('a', 'b', 'c'\\) is not one of the graph's"):
        produce_for_seeds(graph, LinkInput(torch.tensor([[1], [2]]), edge_type=("a", "b", "c")), torch.arange(1),
                          spec, 0)
