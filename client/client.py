"""``connect()`` and the :class:`Client`: a trainer process's connection to a graphfeed cluster."""
from __future__ import annotations

import atexit
import collections
import dataclasses
import gc
import logging
import os
import threading
import time
import warnings
import weakref
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, Mapping, NoReturn, Sequence, TypeVar

from typing_extensions import Unpack

from graphfeed.client.cluster import ServerConn, parse_cluster
from graphfeed.client.embedding import RemoteEmbedding
from graphfeed.client.errors import InvalidRequest, NotFound, ServerError, unanswered
from graphfeed.client.group import PROBE_TIMEOUT, DataGroup
from graphfeed.client.loader import RemoteNeighborLoader
from graphfeed.client.online import OnlineSampler, online_spec, to_batch
from graphfeed.client.replicas import Replicas, open_replicas
from graphfeed.client.security import from_cluster
from graphfeed.client.served import ServersServed
from graphfeed.client.sessions import CONTROL_THREADS, SessionSet
from graphfeed.client.settings import ConnectSettings
from graphfeed.core.compat import check_not_graph, take_loader_extras
from graphfeed.core.data_check import check_data
from graphfeed.core.embedding import EmbeddingSpec
from graphfeed.core.spec import (
    LinkInput,
    LoaderOptions,
    LoaderSpec,
    RemoteLoaderOptions,
    check_link_ids,
    split_options,
)
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto.convert import graph_schema
from graphfeed.transport import registry
from graphfeed.transport.errors import lost_in_text, peer_lost

log = logging.getLogger("graphfeed.client")
TRANSPORT_ENV = "GRAPHFEED_TRANSPORT"   # connect(transport="auto")'s value when set: a transport asked by name
CHANNELS = (registry.AUTO, "rpc")   # connect(channel=...)'s values, deprecated: transport= names them
RECONNECT_RETRY = 1.0               # seconds between attempts to re-form the group
WORKER_DEATH_WAIT = 10.0            # seconds a lost data-path connection waits for its server to see the death
MAX_RECOVERIES = 3                  # re-formed groups one call_with_recovery() waits through before it gives up
AT_EXIT_BOUND = 30.0                # seconds closing this process's clients at interpreter exit may take in all
T = TypeVar("T")
_OPEN: list["Client"] = []   # this process's open clients (one: torch allows one RPC group per process)
_OPEN_LOCK = threading.Lock()


def connect(cluster, *, transport: str = registry.AUTO, settings: ConnectSettings | None = None,
            **options: Any) -> Client:
    """Connect to the servers of ``cluster`` (a YAML file with ``servers: [host:port, ...]`` or a list).

    Checks that the servers hold one graph's parts, each once or more (replicas: daemons serving the same part
    of the same partition files), uses one server per part (at random among a part's replicas), starts a
    session worker on each and forms the data-path group (rank 0 here).  A listed server that cannot be reached
    is an error unless the others serve every part (it is then kept for failover, with a warning).

    ``transport`` (:func:`graphfeed.transport.registry.connect_choices`): how batches and calls travel.

    * ``"auto"`` (the default; ``GRAPHFEED_TRANSPORT`` replaces it when set): the authenticated data path,
      ``"secure"``, with or without a token.  A server that offers a weaker one (torch RPC) is refused with a
      :class:`ServerError` naming it, never followed: ask for torch RPC by name.
    * ``"secure"``: the authenticated data path -- every connection proves the group's key, nothing is
      unpickled, TLS when this client uses TLS.
    * ``"torch-rpc"``: torch RPC (trusted networks only), only with servers whose ``data_path`` names it too.
    * ``"shm"``: the same as ``"auto"``, said explicitly.

    Whatever the data path, batches from servers on this host come through shared memory (``"shm"``): a
    ring of ``shm_slots`` slots per same-host server (see :mod:`graphfeed.transport.shm`; a batch's
    tensors are views of its slot, reused once they are freed); the data path carries the calls, the
    other servers' batches and a batch too big for its slot.  Slots start at 64 MiB and grow to the
    batches (the first batch too big for a slot comes over the data path, then the part's ring moves to
    slots of 1.25x its size, at most ``shm_max_slot_mb`` MiB); ``shm_slot_mb=N`` fixes them at N MiB
    instead (larger batches always come over the data path); ``shm_slots=0`` sends every pull over the
    data path.

    ``channel=`` (deprecated, one release): ``channel="rpc"`` is ``shm_slots=0``, ``channel="auto"`` the
    default; both warn (DeprecationWarning).

    ``settings`` (:class:`~graphfeed.client.settings.ConnectSettings`) holds everything else; keywords named
    as its fields replace its values (or the defaults'): ``timeout`` bounds each control call and the
    group's formation (s); ``rpc_timeout`` bounds each batch pull (s); ``advertise_host`` is the address
    the servers reach this process at (default: the local address on the route to the first server);
    ``lease_seconds`` how long servers keep this trainer's workers without a heartbeat (0/None: server
    default).

    Server restarts: when a server dies under an open client, a running epoch takes another replica of its part
    that serves now (:mod:`graphfeed.client.replicas`), or waits up to ``reconnect_timeout`` seconds for a
    server of the same graph and part to answer at that address (or at a replica's), re-forms the data-path
    group with every server, re-opens the loaders' sessions and continues at the first batch the trainer has
    not received (each seed still exactly once; batches equal to an uninterrupted run's).  ``0`` fails at once with
    :class:`ServerError`, as does a server that comes back with another partition, and a server
    that stops on purpose: one whose health said NOT_SERVING (a daemon drains on SIGTERM/SIGINT;
    its trainers keep pulling during ``drain_grace_seconds``), as nothing will come back to wait for -- unless
    its part has another replica, which the part then moves to.

    ``job`` names the job (1-64 letters, digits, ``.``, ``_``, ``-``; "" = ``default``): the servers keep
    its embedding tables' checkpoints in that namespace only (``embedding_dir/<job>/``).  Every call on the
    trainer's group carries the capability its ``OpenGroup`` returned, so other jobs holding the same token
    cannot close, heartbeat, re-point or list it.

    Security (see :mod:`graphfeed.client.security`): ``token`` is sent as a bearer token on
    every control call; ``tls_ca`` (CA bundle) turns TLS on, ``tls_cert``/``tls_key`` add a
    client certificate (mTLS).  Defaults come from the cluster YAML (``token_file:``,
    ``tls: {ca:, cert:, key:}``) and ``GRAPHFEED_TOKEN``.

    One client per process (torch allows one RPC group): ``connect()`` with the same servers while a
    client is open returns that client (as when a module that connects is imported twice -- PyG's
    ``to_hetero`` re-imports the script), and it closes when each ``connect()`` that returned it was
    closed.  An open client closes itself at interpreter exit (a script that ``break``s out of an
    epoch and never calls ``close()`` exits 0, and the servers free its workers at once), within
    ``AT_EXIT_BOUND`` (30 s, logged when hit) and without waiting on other DDP ranks.

    Pauses are not deaths: a server whose control calls time out (SIGSTOP, a frozen VM, an overloaded host) is
    waited for up to ``reconnect_timeout`` while the loaders keep pulling from its worker, and a StartEpoch it
    does not answer is sent again; a server that is gone -- its port refuses, it no longer knows the group, or its
    heartbeat answers with a new daemon incarnation (it restarted) -- is recovered from as above.

    Raises :class:`ClusterError` (a ValueError) for a wrong cluster, ValueError for a bad setting or
    transport, TypeError for an unknown keyword, :class:`ServerError` if a server fails, RuntimeError if
    this process already has an open client to other servers.
    """
    route = _route(transport, options.pop("channel", None))
    settings = ConnectSettings.of(settings, options, "connect")
    if settings.shm_slots == 0:
        route = route.network_only()
    addresses = parse_cluster(cluster)
    reused = _open_client(addresses, settings.job)
    if reused is not None:
        return reused
    security = from_cluster(cluster, token=settings.token, tls_ca=settings.tls_ca, tls_cert=settings.tls_cert,
                            tls_key=settings.tls_key)
    replicas = open_replicas(addresses, settings.timeout, security)
    try:
        group = DataGroup(replicas.active(), transport=route, settings=settings)
        group.start()
    except BaseException:
        for s in replicas.all():
            s.close()
        raise
    return Client(group.servers, group, timeout=settings.timeout, rpc_timeout=settings.rpc_timeout,
                  reconnect_timeout=settings.reconnect_timeout, replicas=replicas)


def _route(transport: str, channel: str | None) -> registry.Route:
    """``transport=`` as a route, with the deprecated ``channel=`` (``"auto"``: shared memory with same-host
    servers; ``"rpc"``: every pull over the data path) folded in, and a DeprecationWarning naming the new form."""
    if transport == registry.AUTO and os.environ.get(TRANSPORT_ENV):
        transport = os.environ[TRANSPORT_ENV]
        if transport not in registry.connect_choices():
            raise ValueError(f"{TRANSPORT_ENV} must be {registry.listed(registry.connect_choices())}, "
                             f"got {transport!r}")
    route = registry.route(transport)
    if channel is None:
        return route
    if channel not in CHANNELS:
        raise ValueError(f"channel must be {registry.listed(CHANNELS)} (deprecated: use transport=), got {channel!r}")
    new = "nothing (shared memory with same-host servers is the default)" if channel == registry.AUTO else \
        "shm_slots=0 (every pull over the data path)"
    warnings.warn(f"connect(channel={channel!r}) is deprecated and goes in the next release: pass {new}",
                  DeprecationWarning, stacklevel=3)
    return route if channel == registry.AUTO else route.network_only()


class Client:
    """An open connection: make loaders with :meth:`neighbor_loader`; ``close()`` (or ``with``) when done."""

    def __init__(self, servers: Sequence[ServerConn], group: DataGroup, *, timeout: float, rpc_timeout: float,
                 reconnect_timeout: float = 0.0, replicas: Replicas | None = None):
        self.servers, self.group = list(servers), group   # the server in use of each part, in part order
        self.replicas = replicas if replicas is not None else Replicas(self.servers)   # every server of each part
        self.timeout, self.rpc_timeout = float(timeout), float(rpc_timeout)
        self.reconnect_timeout = float(reconnect_timeout)
        for s in self.replicas.all():   # a StartEpoch its server does not answer (paused, busy) is sent again this long
            s.patience = self.reconnect_timeout
        self.generation = 0      # +1 each time the data-path group is re-formed (sessions re-opened)
        self.reconnects = 0      # how often that happened (also in the log)
        self._recover_lock = threading.Lock()
        info = self.servers[0].cluster_info
        self.num_parts = int(info.num_parts)
        self.num_nodes = int(info.node_ranges[-1])   # of the label type (the graph's, when homogeneous)
        self.node_types, self.edge_types, self.label_type = graph_schema(info)
        # servers that predate num_nodes_by_type hold a homogeneous graph
        self.num_nodes_by_type = dict(info.num_nodes_by_type) or {self.label_type: self.num_nodes}
        self.num_classes = int(info.num_classes)
        self.features = {f.name: (tuple(f.shape), f.dtype) for f in info.features}
        self.split_sizes = dict(info.split_sizes)
        self._loaders: weakref.WeakSet[RemoteNeighborLoader] = weakref.WeakSet()   # a dropped loader is collected
        self._orphans: collections.deque[tuple[int, str]] = collections.deque()   # (part, session) of dropped loaders
        # re-opened by recover() after the group is re-formed (weak: a dropped loader's set goes with it)
        self._session_sets: weakref.WeakSet[SessionSet] = weakref.WeakSet()
        self._track_lock = threading.Lock()
        # every control call to all servers at once (SessionSet), at most CONTROL_THREADS in flight
        self.control_pool: Executor = ThreadPoolExecutor(max_workers=max(1, min(CONTROL_THREADS, len(self.servers))),
                                               thread_name_prefix="graphfeed-control")
        self._broken: ServerError | None = None
        self._closed = False
        self._online = OnlineSampler(self)
        self._watch(group)
        self._holds = 1   # connect() calls that returned this client and were not closed yet
        with _OPEN_LOCK:
            if not _OPEN:
                _at_exit(_close_at_exit)
            _OPEN.append(self)


    def neighbor_loader(self, input_nodes="train", num_neighbors: Sequence[int] | None = None, *, data=None,
                        verify: bool = True, **options: Unpack[RemoteLoaderOptions]) -> RemoteNeighborLoader:
        """A :class:`RemoteNeighborLoader` (one session per server) -- see its docstring.

        Arguments as PyG's ``NeighborLoader``: ``input_nodes`` is a split name, a tensor of
        original node ids or ``None`` (every node), or on a typed graph a tuple
        ``(node_type, split | ids | None)``; ``num_neighbors`` one list of per-hop fanouts or a dict
        ``{(src, rel, dst): [...]}``; the keywords are :class:`~graphfeed.core.spec.RemoteLoaderOptions`
        (documented there once: ``batch_size``, ``shuffle``, ``replace``, ``feature_dtype``, ``ordered``,
        ``feature_cache_mb``, ...).  They become one :class:`LoaderSpec` (:meth:`open_loader`).
        With ``shuffle=False`` over ids or every node the seeds come in input order, as PyG's
        (``ordered=None``).  ``data=data`` (the script's ``Data``/``HeteroData``, PyG's first argument) is
        checked against what the servers serve (:mod:`graphfeed.core.data_check`; ``verify=False`` warns
        instead of refusing); a ``Data`` as first argument is a TypeError saying where it goes.
        """
        own, spec_options = self._loader_options(
            "neighbor_loader", (input_nodes, "input_nodes", "NeighborLoader(data, num_neighbors=..., input_nodes=X) "
                                "is client.neighbor_loader(input_nodes=X, num_neighbors=..., data=data) (data= is "
                                "checked against the servers' graph)"), num_neighbors, options)
        spec = LoaderSpec.of(input_nodes, num_neighbors, **spec_options)
        return self.open_loader(spec, data=data, verify=verify, **own)

    def _loader_options(self, name: str, first: tuple, num_neighbors,
                        options: Mapping) -> tuple[dict, LoaderOptions]:
        """What every loader call checks first -- ``first`` (its first argument, that argument's name and the
        PyG call it stands for) is not a graph, the client is usable, ``num_neighbors`` is given -- and its
        ``options`` split into the loader's own and the :class:`LoaderSpec`'s."""
        value, argument, fix = first
        check_not_graph(value, f"{name}'s first argument ({argument})", fix)
        self._check_usable()
        if num_neighbors is None:
            raise ValueError("num_neighbors is required: one fanout per hop, e.g. num_neighbors=[15, 10]")
        return split_options(options, RemoteLoaderOptions, name)

    def link_neighbor_loader(self, num_neighbors: Sequence[int] | None = None, *, edge_label_index=None,
                             edge_label=None, neg_sampling=None, neg_sampling_ratio=None, edge_label_time=None,
                             num_hard_negatives: int | None = None, data=None, verify: bool = True,
                             **options: Unpack[RemoteLoaderOptions]) -> RemoteNeighborLoader:
        """A link loader through the servers, arguments and batches as PyG's ``LinkNeighborLoader`` and
        :class:`graphfeed.server.loader.link.LocalLinkNeighborLoader` (which it equals batch for batch):
        ``edge_label_index`` ([2, E] original node ids; on a typed graph ``((src, rel, dst), index)``, or the edge
        type alone / ``(edge type, None)`` for every edge of the type (listed by the servers); None (PyG's
        default): every edge of the graph's one edge type; or a link
        split stored at partition time: ``"train"``/``"val"``/``"test"``, resolved by the servers),
        ``edge_label``, ``neg_sampling`` (``"binary"``, ``"triplet"``, a dict with
        ``mode``/``amount``/``strict``) or ``neg_sampling_ratio``, ``edge_label_time`` one time per seed edge,
        ``num_hard_negatives`` per seed edge from the partition's stored lists (batches carry ``neg_is_hard``);
        the keywords are :class:`~graphfeed.core.spec.RemoteLoaderOptions` (``batch_size`` counts seed edges).
        ValueError (one line, naming the argument) for bad input."""
        own, spec_options = self._loader_options(
            "link_neighbor_loader", (num_neighbors, "num_neighbors", "LinkNeighborLoader(data, num_neighbors=..., "
                                     "edge_label_index=...) is client.link_neighbor_loader(num_neighbors=..., "
                                     "edge_label_index=..., data=data)"), num_neighbors, options)
        link = LinkInput.of(edge_label_index, edge_label, neg_sampling, neg_sampling_ratio, edge_label_time,
                            edge_types=self.edge_types, num_hard_negatives=num_hard_negatives)
        spec = LoaderSpec.of(link, num_neighbors, **spec_options)
        if link.split is None and link.edge_type is None and list(self.node_types) != [self.label_type]:
            raise ValueError(f"edge_label_index on a typed graph needs its edge type: pass ((src, rel, dst), index) "
                             f"with one of {', '.join(map(str, self.edge_types))}")
        spec.check_schema(self.node_types, self.edge_types)
        if link.index is not None:
            check_link_ids(link, self.num_nodes_of)
        return self.open_loader(spec, data=data, verify=verify, **own)

    def sample(self, node_ids, num_neighbors: Sequence[int] | None = None, *, seed: int = 0, replace: bool = False,
               direction: str = "in", weight_attr: str | None = None, feature_dtype=None):
        """One batch for arbitrary nodes, on demand (serving, ad-hoc evaluation): no epoch, no loader.

        ``node_ids``: original ids (of the label type on a typed graph; distinct, any parts; 1-D).
        The other arguments are the loaders' sampling options.  Returns the loaders' batch schema
        (``Data``/``HeteroData`` with ``n_id`` seeds first in ``node_ids`` order, ``input_id`` =
        ``0..n-1``, ``x``, ``y``, ``edge_index``, ``e_id``, ``batch_size``, ...), equal bit for bit to
        :func:`graphfeed.server.loader.local.sample_nodes` with the same arguments: batch 0 of epoch 0
        of loader seed ``seed``, so the same call gives the same sample.  Safe from several threads and
        while loaders run.  ValueError (:class:`InvalidRequest` when a server refused) naming the bad
        id and the valid range for ids that are empty, not 1-D, not integers, repeated or outside the
        graph; :class:`ServerError` when the server fails.
        """
        self._check_usable()
        if num_neighbors is None:
            raise ValueError("num_neighbors is required: one fanout per hop, e.g. num_neighbors=[15, 10]")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed must be an integer in 0..2**64-1, got {seed!r}")
        spec = online_spec(num_neighbors, replace=replace, direction=direction, weight_attr=weight_attr,
                           feature_dtype=feature_dtype)
        return to_batch(self._online.sample(node_ids, spec, seed))

    def embedding(self, ntype: str | None = None, dim: int = 128, *, name: str | None = None, init: str = "normal",
                  scale: float = 0.1, dtype: str = "float32", seed: int = 0, field: str = "emb") -> RemoteEmbedding:
        """A learnable table of ``dim`` values per node of type ``ntype`` (None: the label type), held by the
        servers: each makes the rows of the nodes its part owns, for this client's group only (another job's
        table of the same ``name``, default ``ntype``, is another table).  ``init``: ``"normal"`` (std
        ``scale``), ``"uniform"`` (``[-scale, scale]``) or ``"zeros"``.  Give it to a loader
        (``embeddings=[table]``): batches carry the rows of their nodes as ``batch[ntype].<field>``, a leaf
        tensor that requires grad; step it with :class:`graphfeed.client.SparseAdam` (or ``SparseSGD``,
        ``SparseAdagrad``).  ``table.save(tag)`` / ``load(tag)`` checkpoint it on the servers;
        ``close()`` frees it.  ValueError (one line) for a bad argument or a table over a server's
        ``embedding_bytes``."""
        self._check_usable()
        ntype = self.label_type if ntype is None else ntype
        self.num_nodes_of(ntype)   # ValueError naming the graph's types
        spec = EmbeddingSpec(ntype if name is None else name, ntype, dim, dtype, init, scale, seed)
        return RemoteEmbedding(self, spec, field)

    def num_nodes_of(self, ntype: str | None) -> int:
        """Nodes of type ``ntype`` (None: the label type); ValueError naming the graph's types for an unknown one."""
        ntype = self.label_type if ntype is None else ntype
        if ntype not in self.num_nodes_by_type:
            raise ValueError(f"input_nodes names node type {ntype!r}, which the graph does not have; its node types "
                             f"are {', '.join(map(repr, self.node_types))}")
        return int(self.num_nodes_by_type[ntype])

    def open_loader(self, spec: LoaderSpec, *, data=None, verify: bool = True, **options) -> RemoteNeighborLoader:
        """A :class:`RemoteNeighborLoader` for a ready-made :class:`LoaderSpec`; ``options`` are the loader's
        own keywords of :class:`~graphfeed.core.spec.RemoteLoaderOptions` (``prefetch``: pulls in flight per
        server; ``feature_cache_mb``: the loader's feature cache, MiB, None/0 = off; ``pin_memory`` / ``device``:
        how batches are handed over, :class:`~graphfeed.core.delivery.Delivery`).  ``data``: the script's own
        ``Data``/``HeteroData``, checked against what the servers serve before the sessions open
        (:func:`graphfeed.core.data_check.check_data`: ValueError naming the difference and the fix;
        ``verify=False`` warns instead)."""
        self._check_usable()
        options = dict(options)
        if data is not None:   # the script's own copy of the graph, against what the servers serve
            check_data(data, ServersServed(self), transform=options.get("transform"), verify=verify)
        transforms = take_loader_extras(options, spec.kind or "nodes")   # transform=, num_workers=, ...
        self._close_orphans()
        try:
            loader = RemoteNeighborLoader(self, spec, transforms=transforms, **options)
        except ServerError as exc:
            if "max_sessions_per_group" not in str(exc):
                raise
            gc.collect()   # loaders dropped in reference cycles (e.g. with a live iterator) are collected now
            if not self._close_orphans():
                raise
            loader = RemoteNeighborLoader(self, spec, transforms=transforms, **options)
        with self._track_lock:
            self._loaders.add(loader)
        return loader

    def _close_orphans(self) -> int:
        """Close the sessions of loaders that were dropped without close(); returns how many."""
        closed = 0
        while self._orphans:
            try:
                part, session_id = self._orphans.popleft()
            except IndexError:
                break
            try:
                self.servers[part].call("CloseSession", pb.CloseSessionRequest(session_id=session_id), timeout=5.0)
            except Exception:  # noqa: BLE001 -- closed already, or the group was re-formed: nothing left to free
                pass
            closed += 1
        return closed

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

    def track(self, sessions: SessionSet) -> None:
        """Re-open ``sessions`` whenever :meth:`recover` re-forms the group (until :meth:`untrack`)."""
        with self._track_lock:
            self._session_sets.add(sessions)

    def untrack(self, sessions: SessionSet) -> None:
        with self._track_lock:
            self._session_sets.discard(sessions)

    def remove_loader(self, loader: RemoteNeighborLoader) -> None:
        """Forget a closed loader (``close()`` no longer closes it; group failures no longer reach it)."""
        with self._track_lock:
            self._loaders.discard(loader)

    def fail_pulls(self, server: str, reason: str) -> None:
        """Fail every loader's pulls in flight at once: ``server`` is gone for ``reason`` (the data group's
        heartbeat calls it) or the group is being re-formed.  The loaders then :meth:`recover`."""
        with self._track_lock:
            loaders = list(self._loaders)
        for loader in loaders:
            loader.fail_pulls(server, reason)

    def recover(self, where: tuple[str, str], cause: BaseException | None, generation: int) -> int:
        """After a failed pull or control call seen at ``generation``: re-form the group once the dead
        servers are back, and re-open every tracked :class:`SessionSet` on it.

        Returns the new generation (another loader's thread may already have re-formed it).
        Fails the client (naming the server) when resuming is off
        (``reconnect_timeout=0``), when no server is gone (the pull failed for another reason),
        or when a server does not come back in time or comes back with another partition.
        """
        with self._recover_lock:
            if self.generation != generation:
                return self.generation
            self._check_usable()
            if self.reconnect_timeout <= 0:
                self._fail((where[0], f"{where[1]} (reconnect_timeout=0: the client does not wait for a lost "
                                      f"server to come back)"), cause)
            waited = self._wait_silent()
            dead = self._probe_dead(cause)
            if not dead and (waited or unanswered(cause)):
                # a pause, not a death: every server answers again and still holds the group -- the caller retries
                log.warning("graphfeed: every server answers again (%s); continuing on the same group", where[1])
                return self.generation
            if not dead:
                self._fail(where, cause)
            # a server without a replica that was silent past reconnect_timeout (it was waited for already) or that
            # drains (a stop on purpose: nothing comes back to wait for) ends the client; one with a replica moves
            silent = self._without_replica(name for name in dead if name in self.group.given_up)
            if silent:
                self._fail((", ".join(silent), f"{dead[silent[0]]}; {where[1]}"), cause)
            stopping = self._without_replica(self.group.stopping(dead))
            if stopping:
                self._fail((", ".join(stopping), f"is shutting down (it announced a drain: SIGTERM/SIGINT or graphfeed "
                                                 f"drain) and its part has no other replica, so the "
                                                 f"client does not wait to reconnect; {where[1]}"), cause)
            log.warning("graphfeed: %s; waiting up to %g s for %s to come back (%s)", where[1],
                        self.reconnect_timeout, ", ".join(dead), "; ".join(f"{k}: {v}" for k, v in dead.items()))
            try:
                self._reform(dead, time.monotonic() + self.reconnect_timeout)
            except ServerError as exc:
                self._broken = exc
                raise
            except Exception as exc:  # noqa: BLE001 -- any other failure to re-open also ends the client
                self._fail((", ".join(dead), f"re-opening after a restart failed: {exc}"), exc)
            self.generation += 1
            self.reconnects += 1
            log.warning("graphfeed: data-path group re-formed (reconnect %d): continuing the running epochs",
                        self.reconnects)
            return self.generation

    def call_with_recovery(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``; when it fails because a server is lost -- the data path's :class:`PeerLost`, a control
        call's error while a server is down, or the group re-formed under it -- wait for the server within
        ``reconnect_timeout``, re-form the group (:meth:`recover`: every tracked session set re-opened) and call
        ``fn()`` again.  ``what`` names the call in messages ("emb_push of table 'paper'").

        Every caller of the workers goes through here (embedding tables, ``sample``, the PyG backend), so a
        caller never sees a transport's own error for a lost server: past the bound it gets one
        :class:`ServerError` naming the server, what was waited for and ``reconnect_timeout``.  Any other
        failure of ``fn`` is raised as it is."""
        for attempt in range(MAX_RECOVERIES + 1):
            generation = self.generation
            try:
                return fn()
            except Exception as exc:
                where = self._lost_where(what, exc, generation)
                if where is None:
                    raise
                if attempt == MAX_RECOVERIES:
                    raise ServerError(where[0], f"{where[1]}; still failing after the group was re-formed "
                                                f"{MAX_RECOVERIES} times (reconnect_timeout="
                                                f"{self.reconnect_timeout:g} s each)") from exc
                self.recover(where, exc, generation)
        raise AssertionError("unreachable")

    def _lost_where(self, what: str, exc: BaseException, generation: int) -> tuple[str, str] | None:
        """``(server, message)`` for :meth:`recover` when ``exc`` means a server is lost (or the group was
        re-formed since ``generation``); None when it is the call's own failure."""
        if isinstance(exc, (InvalidRequest, TimeoutError)):
            return None
        lost = peer_lost(exc)
        if lost is not None:
            return self.server_name(lost.part), f"{what} failed: {lost}"
        if self.generation != generation:
            return "cluster", f"{what} failed while the group was re-formed: {exc}"
        if unanswered(exc):   # a control call that timed out: recover() waits for a paused server, or re-forms
            return exc.server, f"{what} failed: {exc}"
        if isinstance(exc, (ServerError, NotFound, ConnectionError)):
            dead = self.group.probe()
            if dead:
                return ", ".join(dead), f"{what} failed: {exc}"
        return None

    def _watch(self, group: DataGroup) -> None:
        """Hear ``group``'s lost servers (pulls waiting on them fail at once) and tell it which servers' parts
        have another replica (a silent one of those is waited for only until its heartbeats lapse)."""
        group.has_replica = lambda name: not self._without_replica([name])
        group.on_failure = self.fail_pulls

    def _without_replica(self, names) -> list[str]:
        """Those of the servers ``names`` in use whose part has no other server to move to."""
        by_name = {s.name: s for s in self.servers}
        return [n for n in names if n not in by_name or not self.replicas.has_other(by_name[n])]

    def server_name(self, part: int) -> str:
        """``host:port part K`` of part ``part``'s server (``part K`` when no server holds it)."""
        s = next((s for s in self.servers if s.part == part), None)
        return s.name if s is not None else f"part {part}"

    def _wait_silent(self) -> bool:
        """Wait while servers are silent (their control calls time out: paused or busy) until each answers or
        has been silent past the group's patience (it then counts as gone); True when there was one to wait for.
        Bounded by ``reconnect_timeout`` plus a probe."""
        group = self.group
        group.probe()
        if not group.silent:
            return False
        patience = max((group.patience(server=name) for name in list(group.silent)), default=group.patience())
        deadline = time.monotonic() + patience + PROBE_TIMEOUT
        while group.silent and not (set(group.silent) <= group.given_up) and time.monotonic() < deadline:
            time.sleep(RECONNECT_RETRY)
            if group.probe():   # one is gone (it answered that it lost the group, or refuses): recover() re-forms
                break
        return True

    def _probe_dead(self, cause: BaseException | None) -> dict[str, str]:
        """The servers that lost this trainer's group.  After a lost data-path connection (a session worker
        died while its server lives: a signal, the OOM killer) the server may not have noticed yet: probe
        again for up to WORKER_DEATH_WAIT s, so the case resumes like a server restart instead of failing."""
        dead = self.group.probe()
        if dead or not lost_in_text(cause):
            return dead
        deadline = time.monotonic() + min(WORKER_DEATH_WAIT, self.reconnect_timeout)
        while not dead and time.monotonic() < deadline:
            time.sleep(RECONNECT_RETRY / 4)
            dead = self.group.probe()
        return dead

    def _reform(self, dead: dict[str, str], deadline: float) -> None:
        """Leave the old group, wait for the ``dead`` servers, form a new group, re-open the loaders' sessions.

        torch RPC groups cannot admit a new member once one was killed, so the whole group is
        formed anew (a new worker on every server).  Retries until ``deadline`` while a server
        refuses (still starting); ServerError when it passes.
        """
        old = self.group
        old.on_failure = None
        old.close(gone=dead)
        self.fail_pulls(", ".join(dead), "the group is being re-formed")
        while True:
            for i, s in enumerate(self.servers):
                if s.name in dead:   # it, once back, or another replica of its part
                    self.servers[i] = self.replicas.replace(s, deadline, self.reconnect_timeout,
                                                            wait_for_lost=s.name not in old.given_up)
                    log.warning("graphfeed: %s serves part %d again", self.servers[i].name, s.part)
            group = DataGroup(self.servers, transport=old.route,
                              settings=dataclasses.replace(old.settings, advertise_host=old.host))
            try:
                group.start()
                self.group = group
                with self._track_lock:
                    session_sets = list(self._session_sets)
                for sessions in session_sets:
                    sessions.reopen()
                self._watch(group)
                return
            except (ServerError, NotFound) as exc:
                if time.monotonic() >= deadline:
                    raise ServerError(getattr(exc, "server", "cluster"), f"could not re-form the data-path group "
                                      f"within the reconnect timeout: {exc}") from None
                log.warning("graphfeed: re-forming the group failed (%s); retrying", exc)
                group.close()
                dead = {s.name: "" for s in self.servers}
                time.sleep(RECONNECT_RETRY)


    def close(self) -> None:
        """Close the loaders' sessions, leave the data-path group, release this trainer's workers.
        A client that more than one ``connect()`` returned closes at the last of their ``close()``s."""
        if self._closed:
            return
        with _OPEN_LOCK:
            self._holds -= 1
            if self._holds > 0:
                return
            if self in _OPEN:
                _OPEN.remove(self)
        self._closed = True
        for loader in list(self._loaders):
            loader.close()
        self._orphans.clear()   # the group's close frees them on every server
        self._online.close()
        try:
            self.group.close()
        finally:
            self.control_pool.shutdown(wait=False)
            for s in self.replicas.all():
                s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"Client({', '.join(s.name for s in self.servers)}, group={self.group.group_id})"


def _open_client(addresses: list[str], job: str = "") -> Client | None:
    """This process's open client when it is connected to ``addresses`` (one more hold on it); None when
    there is none; RuntimeError naming both server lists when it is connected to other servers, or both
    job names when it is another job's (its tables' checkpoints are another namespace)."""
    with _OPEN_LOCK:
        for client in _OPEN:
            if sorted(client.replicas.addresses) == sorted(addresses):
                if client.group.settings.job != job:
                    raise RuntimeError(f"this process already has an open graphfeed client to these servers for "
                                       f"job {client.group.settings.job or 'default'!r}, not {job or 'default'!r}: "
                                       f"a process is one job (one RPC group); close() it first, or connect "
                                       f"with the same job=")
                client._holds += 1
                log.info("graphfeed: connect() to the servers of the open client %r returns that client", client)
                return client
        if _OPEN:
            raise RuntimeError(f"this process already has an open graphfeed client, to "
                               f"{', '.join(_OPEN[0].replicas.addresses)}, and torch allows one RPC "
                               f"group per process: close() it before connecting to {', '.join(addresses)} (if "
                               f"connect() runs twice because a module was imported twice, pass the same servers: "
                               f"connect() then returns the open client)")
    return None


def _at_exit(fn) -> None:
    """Run ``fn`` at interpreter exit while thread pools still work: with the exit hooks of ``threading``
    (what ``concurrent.futures`` uses; they run last-registered first, before non-daemon threads are
    joined and before ``atexit``'s handlers, torch RPC's among them), else with ``atexit``."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(fn)
            return
    except RuntimeError:   # already shutting down
        return
    atexit.register(fn)


def _close_at_exit() -> None:
    """Close every client left open (at interpreter exit, before torch's own handlers stop RPC): the
    loaders' in-flight pulls are waited for, the sessions and groups closed on the servers.

    Bounded: at most AT_EXIT_BOUND seconds in all, logged when hit; the process then exits and the servers free
    what was left when its lease lapses.  Only this process's sessions and groups are closed -- nothing here
    waits on another rank of a DDP job (no collective call), so ranks that exit at different times each exit."""
    with _OPEN_LOCK:
        clients = list(_OPEN)
    if not clients:
        return
    started, done = time.monotonic(), threading.Event()

    def close_all() -> None:
        for client in clients:
            client._holds = 1
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 -- at exit a failure is reported, never raised
                log.warning("graphfeed: closing the client at exit failed: %s", exc)
        done.set()

    # a daemon thread: a close that never ends cannot keep the interpreter from exiting past the bound
    threading.Thread(target=close_all, name="graphfeed-close-at-exit", daemon=True).start()
    if done.wait(AT_EXIT_BOUND):
        log.info("graphfeed: closed %d client(s) at exit in %.1f s", len(clients), time.monotonic() - started)
        return
    log.warning("graphfeed: closing the client at exit took more than AT_EXIT_BOUND=%g s (%s); exiting without "
                "it: the servers free its workers when its lease lapses", AT_EXIT_BOUND,
                ", ".join(repr(c) for c in clients))
