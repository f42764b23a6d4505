"""graphfeed as PyG's remote backend: ``NodeLoader`` / ``LinkLoader`` over the servers.

    import graphfeed.client as gf
    from graphfeed.pyg import GraphfeedSampler, GraphfeedFeatureStore, GraphfeedGraphStore
    from torch_geometric.loader import NodeLoader

    client = gf.connect(["host1:7000", "host2:7000"])
    fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
    sampler = GraphfeedSampler(client, [10, 5], feature_store=fs)
    loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=train_ids, batch_size=512)
    loader = NeighborLoader((fs, gs), num_neighbors=[10, 5], input_nodes=train_ids, batch_size=512)  # same sampler

The topology stays on the servers (PyG's own ``NeighborSampler`` would pull it into the trainer), and
each batch's features come back with its sample.  Importing this package makes PyG's loaders pick
``GraphfeedSampler`` over graphfeed's stores and start their next batches ahead (:mod:`graphfeed.pyg.loaders`).
docs/how-to/pyg-backend.md lists which PyG arguments carry over.  Imports graphfeed.client and below
(never graphfeed.server).
"""
from graphfeed.pyg.convert import BatchRows
from graphfeed.pyg.loaders import install
from graphfeed.pyg.sampler import GraphfeedSampler
from graphfeed.pyg.stores import GraphfeedFeatureStore, GraphfeedGraphStore

install()

__all__ = ["GraphfeedSampler", "GraphfeedFeatureStore", "GraphfeedGraphStore", "BatchRows"]
