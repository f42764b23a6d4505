"""Single-process link loader: PyG ``LinkNeighborLoader`` over a partition folder.

The reference the remote link loader (``Client.link_neighbor_loader``) equals batch for batch:
the same :class:`LoaderSpec` (its input a :class:`LinkInput`), the same
:class:`~graphfeed.core.epoch.EpochPlan` over seed-edge positions, and the same producer
(:func:`graphfeed.server.sampling.link.produce_link_batch`).
"""
from __future__ import annotations

import os
from typing import Sequence

import torch
from typing_extensions import Unpack

from graphfeed.core.compat import take_loader_extras
from graphfeed.core.delivery import Delivery
from graphfeed.core.epoch import BatchSpec
from graphfeed.core.spec import LinkInput, LoaderSpec, LocalLoaderOptions, split_options
from graphfeed.server.loader.local import LocalNeighborLoader, open_graph
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.server.sampling.link import LinkSeeds, produce_link_batch


class LocalLinkNeighborLoader(LocalNeighborLoader):
    """Iterate PyG ``Data`` link batches sampled from a partitioned graph.

    Arguments follow PyG's ``LinkNeighborLoader``: ``edge_label_index`` ([2, E] original node
    ids, row 0 = sources; on a typed graph ``((src, rel, dst), index)``, rows of the source / destination
    type's original ids, batches then ``HeteroData`` with the link fields on the edge type as PyG's; the edge
    type alone or ``(edge type, None)``: every edge of the type, as its input ``edge_index`` would; None
    (PyG's default): every edge of the graph's one edge type (ValueError naming them when it has several); or a
    link split stored by ``graphfeed partition --link-split``: ``"train"``, ``"val"``, ``"test"``, each
    part's seed edges one part after another),
    ``edge_label`` ([E] or None), ``neg_sampling`` (``"binary"``,
    ``"triplet"``, a dict with ``mode``/``amount``/``strict``) or ``neg_sampling_ratio``;
    ``batch_size`` counts seed edges.  Batches carry ``edge_label_index`` (local ids) and
    ``edge_label``, or in triplet mode ``src_index``, ``dst_pos_index``, ``dst_neg_index``;
    ``input_id`` (positions of the seed edges); ``n_id`` starts with the ``batch_size`` endpoint
    nodes (sorted by global id).  Epochs, ranks and ``drop_last`` follow the epoch contract over
    seed edges (every seed edge once per epoch across ranks).  Iteration, ``set_epoch``,
    ``len``, one live iterator, ``state_dict``/``load_state_dict`` and the DDP agreement check
    are :class:`LocalNeighborLoader`'s (only the batch producer differs); ``feature_dtype`` too.
    ``disjoint=True``: each seed edge (and each binary negative) is its own subgraph (``batch.batch``);
    ``time_attr`` with ``edge_label_time`` (one per seed edge; negatives take their seed edge's)
    samples temporally, as PyG.
    ``num_hard_negatives`` (per seed edge, part of ``neg_sampling``'s amount): taken from the partition's stored
    hard-negative lists, topped up with random negatives; batches mark them in ``neg_is_hard``.
    ``exclude_seed_edges=True`` (with ``reverse_edge_types`` on typed graphs): a batch's seed edges and their
    reverses are not sampled (see :mod:`graphfeed.server.sampling.link`).
    """

    def __init__(self, parts: str | os.PathLike | PartitionedGraph | None = None,
                 num_neighbors: Sequence[int] | None = None, *, edge_label_index=None, edge_label=None,
                 neg_sampling=None, neg_sampling_ratio=None, edge_label_time=None,
                 num_hard_negatives: int | None = None, data=None, verify: bool = True,
                 **options: Unpack[LocalLoaderOptions]):
        own, spec_options = split_options(options, LocalLoaderOptions, type(self).__name__)
        self.transforms = take_loader_extras(own, "links")
        if own.pop("embeddings", None):
            raise ValueError("embedding tables ride node loaders' batches so far, not link loaders'")
        delivery = Delivery(**own)   # first: a bad device fails before the parts are opened
        graph, data = open_graph(parts, data, type(self).__name__)
        link = LinkInput.of(edge_label_index, edge_label, neg_sampling, neg_sampling_ratio, edge_label_time,
                            edge_types=graph.edge_types, num_hard_negatives=num_hard_negatives)
        self._setup(graph, LoaderSpec.of(link, num_neighbors, **spec_options))
        self._check_data(data, verify)
        self.delivery = delivery
        self.seeds = LinkSeeds(link).resolve(graph, torch.cat(self.inputs))

    def _produce(self, epoch: int, seq: int, entry: BatchSpec, seeds: torch.Tensor,
                 input_id: torch.Tensor) -> dict[str, torch.Tensor]:
        """A link batch: ``seeds`` are the positions of its seed edges (also its ``input_id``)."""
        return produce_link_batch(self.graph, self.seeds, seeds, self.spec.sampling, entry, epoch, seq,
                                  feature_dtype=self.spec.feature_torch_dtype)
