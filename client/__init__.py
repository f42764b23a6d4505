"""graphfeed client: connect a trainer to sampler servers and iterate PyG mini-batches.

    import graphfeed.client as gf

    with gf.connect(["host1:7000", "host2:7000"]) as client:     # or "cluster.yaml"
        loader = client.neighbor_loader("train", [15, 10, 5], batch_size=1024, shuffle=True)
        for epoch in range(10):
            for batch in loader:          # torch_geometric.data.Data
                ...

Imports only graphfeed.proto, torch, torch_geometric and grpc (never graphfeed.server).

Faults (every wait is bounded):

* A server (daemon + its session worker) dies: TensorPipe fails the pending pulls at once
  (the connection closes); the loader then probes every server's control port and raises
  :class:`ServerError` naming the dead one (``host:port part K``) and the failed pull.  A
  server that hangs instead is caught by the heartbeat threads (two missed heartbeats) or
  by ``rpc_timeout``.  The client is unusable afterwards (its RPC group lost a member):
  ``close()`` it and ``connect()`` again once the server is back.
* ``close()`` leaves the group with ``rpc.shutdown(graceful=False)``: a graceful shutdown is
  a barrier over all members and would hang on a dead one.
* The trainer dies: its servers stop its workers when the lease runs out (no heartbeat).
* Bad requests: the server answers INVALID_ARGUMENT / NOT_FOUND, raised here as
  ``ValueError`` (:class:`InvalidRequest`) / ``LookupError`` (:class:`NotFound`).
* torch allows one RPC group per process at a time: a second ``connect()`` while one client
  is open raises RuntimeError; after ``close()`` a new ``connect()`` works.
"""
from graphfeed.client.client import Client, connect
from graphfeed.client.embedding import RemoteEmbedding
from graphfeed.client.errors import ClusterError, InvalidRequest, NotFound, ServerError
from graphfeed.client.loader import RemoteNeighborLoader
from graphfeed.client.metrics import start_metrics_server
from graphfeed.client.settings import ConnectSettings
from graphfeed.core.embedding import SparseAdagrad, SparseAdam, SparseSGD
from graphfeed.core.spec import LoaderSpec, NodeInput, SamplingSpec

__all__ = ["connect", "ConnectSettings", "Client", "RemoteNeighborLoader", "LoaderSpec", "SamplingSpec", "NodeInput",
           "ClusterError", "ServerError", "InvalidRequest", "NotFound", "start_metrics_server", "RemoteEmbedding",
           "SparseSGD", "SparseAdagrad", "SparseAdam"]
