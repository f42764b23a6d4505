"""graphfeed client: connect a trainer to sampler servers and iterate PyG mini-batches.

    import graphfeed.client as gf

    with gf.connect(["host1:7000", "host2:7000"]) as client:     # or "cluster.yaml"
        loader = client.neighbor_loader("train", [15, 10, 5], batch_size=1024, shuffle=True)
        for epoch in range(10):
            for batch in loader:          # torch_geometric.data.Data
                ...

Imports only graphfeed.proto, torch, torch_geometric and grpc (never graphfeed.server).
"""
from .client import Client, connect
from .errors import ClusterError, InvalidRequest, NotFound, ServerError
from .loader import RemoteNeighborLoader

__all__ = ["connect", "Client", "RemoteNeighborLoader", "ClusterError", "ServerError", "InvalidRequest", "NotFound"]
