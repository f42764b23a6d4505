"""``connect()`` and the :class:`Client`: a trainer process's connection to a graphfeed cluster."""
from __future__ import annotations

from typing import NoReturn, Sequence

from graphfeed.client.cluster import ServerConn, open_servers, parse_cluster
from graphfeed.client.errors import ServerError
from graphfeed.client.group import DataGroup
from graphfeed.client.loader import RemoteNeighborLoader
from graphfeed.client.security import from_cluster
from graphfeed.core.spec import LoaderSpec
from graphfeed.proto.convert import graph_schema


def connect(cluster, *, timeout: float = 30.0, advertise_host: str | None = None,
            lease_seconds: float | None = None, rpc_timeout: float = 60.0, token: str | None = None,
            tls_ca=None, tls_cert=None, tls_key=None) -> "Client":
    """Connect to the servers of ``cluster`` (a YAML file with ``servers: [host:port, ...]`` or a list).

    Checks that the servers hold one graph's parts exactly once, starts a session worker on
    each and forms the data-path group (rank 0 here).  ``timeout`` bounds each control call
    and the group's formation (s); ``rpc_timeout`` bounds each batch pull (s);
    ``advertise_host`` is the address the servers reach this process at (default: the local
    address on the route to the first server); ``lease_seconds`` how long servers keep this
    trainer's workers without a heartbeat (0/None: server default).

    Security (see :mod:`graphfeed.client.security`): ``token`` is sent as a bearer token on
    every control call; ``tls_ca`` (CA bundle) turns TLS on, ``tls_cert``/``tls_key`` add a
    client certificate (mTLS).  Defaults come from the cluster YAML (``token_file:``,
    ``tls: {ca:, cert:, key:}``) and ``GRAPHFEED_TOKEN``.

    Raises :class:`ClusterError` (a ValueError) for a wrong cluster, :class:`ServerError` if
    a server fails, RuntimeError if this process already has an open client.
    """
    addresses = parse_cluster(cluster)
    security = from_cluster(cluster, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
    servers = open_servers(addresses, timeout, security)
    try:
        group = DataGroup(servers, advertise_host=advertise_host, timeout=timeout, rpc_timeout=rpc_timeout,
                          lease_seconds=lease_seconds)
        group.start()
    except BaseException:
        for s in servers:
            s.close()
        raise
    return Client(servers, group, timeout=timeout, rpc_timeout=rpc_timeout)


class Client:
    """An open connection: make loaders with :meth:`neighbor_loader`; ``close()`` (or ``with``) when done."""

    def __init__(self, servers: Sequence[ServerConn], group: DataGroup, *, timeout: float, rpc_timeout: float):
        self.servers, self.group = list(servers), group
        self.timeout, self.rpc_timeout = float(timeout), float(rpc_timeout)
        info = self.servers[0].cluster_info
        self.num_parts = int(info.num_parts)
        self.num_nodes = int(info.node_ranges[-1])   # of the label type (the graph's, when homogeneous)
        self.node_types, self.edge_types, self.label_type = graph_schema(info)
        # servers that predate num_nodes_by_type hold a homogeneous graph
        self.num_nodes_by_type = dict(info.num_nodes_by_type) or {self.label_type: self.num_nodes}
        self.num_classes = int(info.num_classes)
        self.features = {f.name: (tuple(f.shape), f.dtype) for f in info.features}
        self.split_sizes = dict(info.split_sizes)
        self._loaders: list[RemoteNeighborLoader] = []
        self._broken: ServerError | None = None
        self._closed = False

    def neighbor_loader(self, input_nodes="train", num_neighbors: Sequence[int] | None = None, *,
                        batch_size: int = 1, shuffle: bool = False, drop_last: bool = False, prefetch: int = 4,
                        seed: int = 0, replace: bool = False, direction: str = "in", rank: int | None = None,
                        world_size: int | None = None, kind: str | None = None) -> RemoteNeighborLoader:
        """A :class:`RemoteNeighborLoader` (one session per server) -- see its docstring.

        Arguments as PyG's ``NeighborLoader``: ``input_nodes`` is a split name, a tensor of
        original node ids or ``None`` (every node), or on a typed graph a tuple
        ``(node_type, split | ids | None)``; ``num_neighbors`` one list of per-hop fanouts or a dict
        ``{(src, rel, dst): [...]}``; ``rank``/``world_size`` default to
        ``torch.distributed``'s; ``kind`` labels the loader's metrics (default: the split's
        name, else ``"nodes"``).  They become one :class:`LoaderSpec` (:meth:`open_loader`).
        """
        self._check_usable()
        if num_neighbors is None:
            raise ValueError("num_neighbors is required: one fanout per hop, e.g. num_neighbors=[15, 10]")
        spec = LoaderSpec.of(input_nodes, num_neighbors, batch_size=batch_size, shuffle=shuffle,
                             drop_last=drop_last, replace=replace, direction=direction, seed=seed,
                             rank=rank, world_size=world_size, kind=kind or "")
        return self.open_loader(spec, prefetch=prefetch)

    def num_nodes_of(self, ntype: str | None) -> int:
        """Nodes of type ``ntype`` (None: the label type); ValueError naming the graph's types for an unknown one."""
        ntype = self.label_type if ntype is None else ntype
        if ntype not in self.num_nodes_by_type:
            raise ValueError(f"input_nodes names node type {ntype!r}, which the graph does not have; its node types "
                             f"are {', '.join(map(repr, self.node_types))}")
        return int(self.num_nodes_by_type[ntype])

    def open_loader(self, spec: LoaderSpec, *, prefetch: int = 4) -> RemoteNeighborLoader:
        """A :class:`RemoteNeighborLoader` for a ready-made :class:`LoaderSpec`; ``prefetch`` pulls
        in flight per server."""
        self._check_usable()
        loader = RemoteNeighborLoader(self, spec, prefetch=prefetch)
        self._loaders.append(loader)
        return loader

    # ---- state ----------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this graphfeed client is closed: connect() again")
        if self._broken is not None:
            raise ServerError(self._broken.server, f"the client is unusable after an earlier failure: "
                                                   f"{self._broken}; close() it and connect() again")

    def _fail(self, where: tuple[str, str], cause: BaseException | None = None) -> NoReturn:
        """Mark the client broken (its group lost a member) and raise the error naming the server."""
        server, message = where
        self._broken = ServerError(server, message)
        raise self._broken from cause

    def _forget(self, loader) -> None:
        if loader in self._loaders:
            self._loaders.remove(loader)

    def close(self) -> None:
        """Close the loaders' sessions, leave the data-path group, release this trainer's workers."""
        if self._closed:
            return
        self._closed = True
        for loader in list(self._loaders):
            loader.close()
        try:
            self.group.close()
        finally:
            for s in self.servers:
                s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"Client({', '.join(s.name for s in self.servers)}, group={self.group.group_id})"
