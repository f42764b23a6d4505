"""The functions a session worker runs for others -- and nothing else -- over either data path.

* The secure data path (:mod:`graphfeed.transport.secure`, a daemon with a token or TLS):
  :func:`listener_functions` is the table the worker's listener answers; a caller reaches it only
  after proving the trainer group's key, every frame is authenticated, nothing is unpickled.
* torch RPC (trusted networks): torch lets a peer name any importable function; a worker
  process installs :func:`install_guard`, which refuses every call that did not resolve
  through :func:`graphfeed.transport.rpc_group.remote_function` -- an allow-listed name *and*
  the group's key -- (torch's own RPC helpers aside, which the group needs for start-up and
  shutdown).  The limit of this guard: torch unpickles a request before it runs, so the data
  port must only be reachable by trusted hosts; the guard stops stray and cross-group calls, it
  is not a sandbox.

Credentials: every call carries the group's credentials (on the secure path the connection's proof
of its party's pair key -- a peer worker may call only ``rpc_group.PEER_FUNCTIONS``; under torch RPC
the group key in the function reference); the session calls (``pull``, ``pull_into``, ``sample``)
also carry the session's secret.

* ``pull(session_id, epoch, seq, secret)`` -- the trainer takes batch ``seq`` of an epoch
  (async: completes when the batch is ready).  ``secret`` must be the session's secret
  (derived from the group's key by the daemon and by the trainer, never sent: ``transport.secure.keys``),
  compared in constant time: a process that did not open the session cannot pull.
* ``attach(names, size, ids)`` / ``pull_into(session_id, epoch, seq, secret, slot)`` /
  ``detach(ids)`` -- the same-host shared-memory channel (:mod:`graphfeed.transport.shm`): map
  (a generation of) the trainer's ring of slots, pull a batch by copying it into one slot
  (answering with its layout only), and drop the slots the trainer retired.
* ``sample(session_id, secret, node_ids, seed)`` -- online sampling (``Client.sample``): one batch
  for arbitrary original node ids with the session's sampling options, outside any epoch (async:
  runs on the worker's online threads; bad ids fail the call with ValueError).
* ``sample_seeds(session_id, secret, seeds, positions, batch_seed)`` -- PyG's samplers
  (:mod:`graphfeed.pyg`): one batch for a seed record (a ``NodeInput`` of original ids of one node type,
  or a ``LinkInput`` of seed edges with their negative sampling) at the caller's input ``positions``, with
  the batch seed the caller names (:func:`graphfeed.server.sampling.adhoc.produce_for_seeds`; async).
* ``node_rows(ntype, orig_ids)`` / ``part_edges(etype, max_edges)`` -- PyG's ``FeatureStore`` /
  ``GraphStore`` (:mod:`graphfeed.pyg.stores`): the stored rows of the original ids this part owns, and
  this part's edges of one type (refused when the type has more than ``max_edges`` edges).
* ``one_hop(etype, gids, spec, ...)`` / ``gather(ntype, gids, dtype)`` -- peer workers sample a frontier
  through one edge type (``spec``: the session's :class:`SamplingSpec`, passed whole) / read features
  (a :class:`~graphfeed.server.sampling.types.NodeRows`, ``x`` in the batch's feature transport dtype) of
  nodes of one type that this worker's part owns (a homogeneous graph: ``("_N", "to", "_N")`` / ``"_N"``).
* ``has_edges(pairs, kind)`` / ``to_global(orig_ids)`` -- a link loader's peer workers check
  drawn negatives against this part's edges / resolve seed edges' endpoints to global ids.
* ``edge_attr(pairs, kind)`` -- peer workers read the features of edges this part sampled.
* ``input_seeds(seed_input)`` -- a peer producing a packed batch (seeds of several parts, ``drop_last`` or
  ``pack_partial``: :mod:`graphfeed.core.epoch`) reads this part's input nodes of a loader
  (:func:`.session.part_input_seeds`).
* ``part_identity()`` -- which files this worker's part is (host boot id, device, inode): a peer
  that sees the same files on the same host reads them directly (:func:`.peers.colocate`).
* ``emb_create(spec, replica)`` / ``emb_close(name)`` / ``emb_attach(session_id, secret, names)`` /
  ``emb_push(name, gids, grads, update, number)`` / ``emb_save(name, tag)`` / ``emb_load(name, tag)`` -- the trainer's
  learnable embedding tables (:mod:`graphfeed.server.embedding`): this part's rows, a session's batches carrying
  them, a sparse optimizer step, a checkpoint written by this owner.  ``emb_rows(name, gids)`` -- rows by
  global id (peers filling a batch, the trainer reading a table).
* ``hot_rows(ntype, start, count, dtype)`` -- a trainer fills its hot-feature cache: original ids and
  feature rows of this part's highest in-degree nodes of a type, in chunks (:mod:`.hot_rows`).

The worker process hosts exactly one :class:`SessionWorker`; :func:`bind` registers it
here once at start-up (torch RPC calls module-level functions, so this module is the one
place that finds it).
"""
from __future__ import annotations

import torch
import torch.distributed.rpc as rpc
import torch.distributed.rpc.internal as rpc_internal

from graphfeed.core.compact import pack
from graphfeed.core.embedding import EmbeddingSpec, SparseUpdate
from graphfeed.core.spec import QUANTIZED_DTYPE, LinkInput, NodeInput, SamplingSpec, feature_dtype
from graphfeed.server.partition.format.layout import part_files_identity
from graphfeed.server.sampling.types import NodeRows, OneHop
from graphfeed.server.worker.hot_rows import HotRows
from graphfeed.server.worker.session import part_input_seeds
from graphfeed.transport import rpc_group
from graphfeed.transport.calls import Function
from graphfeed.transport.pending import Pending
from graphfeed.transport.shm import RingWriter

_worker = None   # the process's SessionWorker (set once by bind())
_ring = RingWriter()   # this worker's mappings of its trainer's shared-memory slots (one trainer per worker)
_hot: HotRows | None = None   # this part's ranked feature rows (made at the first hot_rows call)


def bind(worker) -> None:
    global _worker
    _worker = worker


def _bound():
    if _worker is None:
        raise RuntimeError("this process hosts no graphfeed session worker")
    return _worker


@rpc.functions.async_execution
def pull(session_id: str, epoch: int, seq: int, secret: bytes = b"") -> torch.futures.Future:
    """Batch ``seq`` of ``epoch`` of a session (wire dict of :mod:`graphfeed.core.batch`).

    The torch RPC half of :class:`graphfeed.transport.torch_rpc.TorchRpcChannel`: the
    worker's pending batch (:class:`graphfeed.transport.pending.Pending`) becomes the
    ``torch.futures.Future`` that async execution answers with.  PermissionError when
    ``secret`` is not the session's secret.
    """
    return _as_remote_errors(pull_pending(session_id, epoch, seq, secret))


def pull_pending(session_id: str, epoch: int, seq: int, secret: bytes = b"") -> Pending:
    """:func:`pull` in no transport's terms: the pending batch in its compact wire form
    (:func:`graphfeed.core.compact.pack`), or the PermissionError for a wrong secret."""
    worker = _bound()
    try:
        worker.authorize(session_id, secret)
    except PermissionError as exc:  # through the pending result, so the caller gets the PermissionError itself
        return Pending.failed(exc)
    return worker.pull(session_id, int(epoch), int(seq)).then(pack)


@rpc.functions.async_execution
def pull_into(session_id: str, epoch: int, seq: int, secret: bytes, slot: int) -> torch.futures.Future:
    """:func:`pull`, with the batch copied into the trainer's shared-memory ``slot``: answers
    ``("shm", layout)``, or ``("inline", batch, bytes needed)`` when the batch does not fit the slot
    (:meth:`graphfeed.transport.shm.RingWriter.answer`).  PermissionError for a wrong ``secret``."""
    return _as_remote_errors(pull_into_pending(session_id, epoch, seq, secret, slot))


def pull_into_pending(session_id: str, epoch: int, seq: int, secret: bytes, slot: int) -> Pending:
    """:func:`pull_into` in no transport's terms."""
    worker = _bound()
    try:
        worker.authorize(session_id, secret)
    except PermissionError as exc:
        return Pending.failed(exc)
    out = Pending()

    def fill(p: Pending) -> None:
        try:
            out.set_result(_ring.answer(int(slot), p.result()))
        except Exception as exc:  # noqa: BLE001 -- the pull's error or a copy failure, to the trainer
            out.set_exception(exc)

    worker.pull(session_id, int(epoch), int(seq)).add_done_callback(fill)
    return out


@rpc.functions.async_execution
def sample(session_id: str, secret: bytes, node_ids: torch.Tensor, seed: int) -> torch.futures.Future:
    """Online sampling: one batch (wire dict) for original ids ``node_ids`` (any parts) with session
    ``session_id``'s sampling options and batch seed from ``seed``
    (:func:`graphfeed.server.sampling.producer.produce_online`).  ValueError (naming the bad id and the
    valid range) for bad ids; PermissionError for a wrong ``secret``."""
    return _as_remote_errors(sample_pending(session_id, secret, node_ids, seed))


def sample_pending(session_id: str, secret: bytes, node_ids: torch.Tensor, seed: int) -> Pending:
    """:func:`sample` in no transport's terms."""
    worker = _bound()
    try:
        worker.authorize(session_id, secret)
        if not isinstance(node_ids, torch.Tensor):
            raise ValueError(f"node_ids must be a tensor of original node ids, got {type(node_ids).__name__}")
        return worker.sample(session_id, node_ids, int(seed)).then(pack)
    except (PermissionError, LookupError, ValueError) as exc:
        return Pending.failed(exc)


@rpc.functions.async_execution
def sample_seeds(session_id: str, secret: bytes, seeds, positions: torch.Tensor,
                 batch_seed: int) -> torch.futures.Future:
    """One batch (wire dict) for ``seeds`` (a :class:`NodeInput` with ids or a :class:`LinkInput` with
    seed edges, original ids, any parts) at input ``positions`` with session ``session_id``'s sampling
    options and batch seed ``batch_seed`` (:func:`graphfeed.server.sampling.adhoc.produce_for_seeds`).
    ValueError (one line) for bad seeds; PermissionError for a wrong ``secret``."""
    return _as_remote_errors(sample_seeds_pending(session_id, secret, seeds, positions, batch_seed))


def sample_seeds_pending(session_id: str, secret: bytes, seeds, positions: torch.Tensor, batch_seed: int) -> Pending:
    """:func:`sample_seeds` in no transport's terms."""
    worker = _bound()
    try:
        worker.authorize(session_id, secret)
        if not isinstance(seeds, (NodeInput, LinkInput)):
            raise ValueError(f"seeds must be a NodeInput or a LinkInput record, got {type(seeds).__name__}")
        return worker.sample_seeds(session_id, seeds, positions, int(batch_seed)).then(pack)
    except (PermissionError, LookupError, ValueError) as exc:
        return Pending.failed(exc)


def node_rows(ntype: str, orig_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(mask, rows)``: which of original ids ``orig_ids`` of node type ``ntype`` this part owns, and the
    stored per-node fields of those (``{"x": ..., "y": ...}``: every :class:`NodeRows` field the type has
    besides ``n_id``), in the order of ``orig_ids[mask]``.  ValueError for an unknown type."""
    worker = _bound()
    ntype = str(ntype)
    if ntype not in worker.part.node_types:
        raise ValueError(f"unknown node type {ntype!r}; the graph's node types are {worker.part.node_types}")
    mask, gids = worker.part.nodes(ntype).to_global(torch.as_tensor(orig_ids, dtype=torch.int64).reshape(-1))
    rows = worker.graph.sources[worker.part.part_id].gather(ntype, gids)
    return mask, {name: t for name, t in rows.items() if t is not None and name != "n_id"}


def part_edges(etype: tuple, max_edges: int) -> dict:
    """The edges of type ``etype`` this part stores (each edge is stored by the part that owns its
    destination in CSC, else its source in CSR): ``{"src": global ids, "dst": global ids, "eid": original
    edge ids, "orig": {node type: (first global id, original ids of this part's nodes of the type)}}`` for
    both end types, so the caller maps global ids back to original ones once it has every part's answer.
    ValueError for an unknown type, and when the whole graph has more than ``max_edges`` edges of the type
    (the caller's bound on a topology pulled into one process)."""
    worker = _bound()
    etype = tuple(str(n) for n in etype)
    if etype not in worker.part.edge_types:
        raise ValueError(f"unknown edge type {etype}; the graph's edge types are {worker.part.edge_types}")
    store = worker.part.edges(etype)   # type: ignore[arg-type]
    if store.num_edges > int(max_edges):
        raise ValueError(f"edge type {etype} has {store.num_edges} edges, more than the {int(max_edges)} this "
                         f"graph store pulls into one process: keep the topology on the servers (sample with "
                         f"GraphfeedSampler) or raise max_edges")
    kind = "csc" if "csc" in worker.part.meta.topologies else "csr"
    topo = store.topology(kind)
    center_type, other_type = (etype[2], etype[0]) if kind == "csc" else (etype[0], etype[2])
    owned = worker.part.nodes(center_type)
    center = topo.centers(owned.start)
    other = topo.indices.to(torch.int64)
    src, dst = (other, center) if kind == "csc" else (center, other)
    orig = {t: (int(worker.part.nodes(t).start), worker.part.nodes(t).orig_id.clone()) for t in {etype[0], etype[2]}}
    return {"src": src, "dst": dst, "eid": topo.eid.to(torch.int64), "orig": orig}


def attach(names: list[str], size: int, ids: list[int] | None = None) -> list[bytes]:
    """Map the trainer's shared-memory slots ``names`` (``size`` bytes each) as slot ``ids`` (default
    ``0..``), beside the slots already mapped; returns their tokens -- none when they do not exist here
    (another host: the trainer then uses torch RPC).  OSError when they cannot be mapped; ValueError
    for an id in use."""
    _bound()
    return _ring.attach(list(names), int(size), None if ids is None else [int(i) for i in ids])


def detach(ids: list[int]) -> int:
    """Drop the trainer's retired shared-memory slots ``ids`` (unknown ids are ignored); how many were mapped."""
    _bound()
    return _ring.detach([int(i) for i in ids])


def _as_remote_errors(pending: Pending) -> torch.futures.Future:
    """A torch future completed with ``pending``'s batch, in the thread that completes ``pending``.

    torch sends a future's exception to the caller as a plain value; an error is wrapped the
    way torch wraps exceptions of synchronous functions, so the caller's ``wait()`` raises it."""
    out: torch.futures.Future = torch.futures.Future()

    def done(p: Pending) -> None:
        try:
            value = p.result()
        except Exception as exc:  # noqa: BLE001 -- forwarded to the caller
            where = rpc.get_worker_info().name if rpc.is_available() else "worker"
            value = rpc_internal.RemoteException(f"On {where}: {type(exc).__name__}: {exc}", _portable(type(exc)))
        out.set_result(value)

    pending.add_done_callback(done)
    return out


def _portable(kind: type) -> type:
    """``kind``, or its nearest built-in base when the trainer could not unpickle it (a class of the worker's
    ``__main__``, e.g. ``SessionNotFound``: the trainer would see an AttributeError instead of a LookupError)."""
    if kind.__module__ != "__main__":
        return kind
    return next(c for c in kind.__mro__ if c.__module__ == "builtins")


def one_hop(etype: tuple, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int, hop: int,
            seed_time: torch.Tensor | None = None) -> OneHop:
    """One hop of edge type ``etype`` (``(src, rel, dst)``) for nodes ``gids`` (of the hop's center type)
    owned by this worker's part, sampled as the session's :class:`SamplingSpec` ``spec`` says (passed
    whole; checked again here), temporal with one ``seed_time`` per node when ``spec.time_attr`` is set;
    ValueError for an unknown type or a spec the record refuses."""
    worker = _bound()
    own = worker.graph.sources[worker.part.part_id]   # the worker's LocalSource
    return own.serve_one_hop(etype, gids, spec, int(fanout), int(seed), int(hop), seed_time)


def gather(ntype: str, gids: torch.Tensor, dtype: str | None = None) -> NodeRows:
    """The :class:`NodeRows` (x, y, n_id) of nodes ``gids`` of type ``ntype`` owned by this worker's part
    (x / y None where the type has none), ``x`` in the feature transport dtype named ``dtype``
    (:meth:`NodeRows.in_transport_dtype`; None = as stored); ValueError for an unknown type, ids not owned
    or a dtype that is no feature transport dtype."""
    worker = _bound()
    name = feature_dtype(dtype)   # ValueError for anything but a feature transport dtype
    rows = worker.graph.sources[worker.part.part_id].gather(str(ntype), gids)   # checks type and ownership
    return rows if name is None else rows.in_transport_dtype(getattr(torch, name))


def has_edges(pairs: torch.Tensor, kind: str, etype: tuple | None = None) -> torch.Tensor:
    """bool [n]: which ``(src, dst)`` pairs are edges (of edge type ``etype``; None = the default one),
    looked up in this part's ``kind`` topology."""
    worker = _bound()
    etype = None if etype is None else tuple(str(n) for n in etype)
    return worker.graph.sources[worker.part.part_id].has_edges(pairs, str(kind), etype)   # checks ownership


def edge_attr(pairs: torch.Tensor, kind: str) -> torch.Tensor:
    """Edge features of ``(center node, edge id)`` pairs whose center this worker's part owns."""
    worker = _bound()
    return worker.graph.sources[worker.part.part_id].edge_attr(pairs, str(kind))   # checks ownership


def to_global(orig_ids: torch.Tensor, ntype: str | None = None):
    """``(mask, gids)``: which original ids (of node type ``ntype``; None = the label type) this worker's
    part owns, and their global ids; ValueError for an unknown type."""
    worker = _bound()
    store = worker.part.nodes(worker.part.label_type if ntype is None else str(ntype))
    return store.to_global(torch.as_tensor(orig_ids, dtype=torch.int64))


def input_seeds(seed_input) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """This part's seeds of a loader's input (a ``NodeInput`` or ``LinkInput``): ``(inputs, positions, ends)``
    as :func:`part_input_seeds`; ValueError for an input the part cannot resolve."""
    if not isinstance(seed_input, (NodeInput, LinkInput)):
        raise ValueError(f"input_seeds takes a NodeInput or LinkInput, not a {type(seed_input).__name__}")
    return part_input_seeds(_bound().part, seed_input)


def hot_rows(ntype: str, start: int, count: int, dtype: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(original ids, x rows)`` of this part's ``ntype`` nodes ranked ``start .. start + count - 1`` by
    in-degree, rows cast to torch dtype name ``dtype`` (None = as stored); ValueError for an unknown or
    featureless type (:meth:`HotRows.rows`)."""
    global _hot
    worker = _bound()
    if _hot is None:
        _hot = HotRows(worker.part)
    name = feature_dtype(dtype)   # ValueError for anything but a feature transport dtype
    if name == QUANTIZED_DTYPE:   # quantizing needs the batch's scales: rows travel as stored or cast to a float
        raise ValueError("hot rows are sent as stored or cast to a floating dtype, not int8: the client keeps no "
                         "cache for feature_dtype='int8' loaders")
    torch_dtype = None if name is None else getattr(torch, name)
    return _hot.rows(str(ntype), int(start), int(count), torch_dtype)


def part_identity() -> tuple | None:
    """The identity of the files of this worker's part (:func:`part_files_identity`): a peer on the same
    host that sees the same files reads them itself instead of calling ``one_hop``/``gather`` here."""
    worker = _bound()
    return part_files_identity(worker.part.paths.root, worker.part.part_id)


# ---- learnable embedding tables (graphfeed.server.embedding: the rows this part owns, per trainer group) ----

def emb_create(spec: EmbeddingSpec, replica: str = "") -> tuple[int, int, bool, int]:
    """Make this part's rows of table ``spec`` in the group (nothing when the same table exists: a retry is
    accepted); ``(start, stop)`` of the global ids it owns, whether this call made them and the table's push
    sequence number (a restarted owner's replayed update log: the pushes it holds).  ``replica``: the
    trainer's table whose update log this part keeps (``""``: none).  ValueError for an unknown type, a clash
    of names or a table over the budget."""
    if not isinstance(spec, EmbeddingSpec):
        raise ValueError(f"emb_create takes an EmbeddingSpec, got {type(spec).__name__}")
    return _bound().embeddings.create(spec, str(replica))


def emb_close(name: str) -> bool:
    """Free this part's rows of table ``name`` (its saved checkpoints stay); whether it existed."""
    return _bound().embeddings.close(str(name))


def emb_rows(name: str, gids: torch.Tensor, dtype: str | None = None) -> torch.Tensor:
    """Rows of table ``name`` for global ids ``gids`` (a peer asks for the ids this part owns; the trainer may
    ask for any), in ``dtype`` (a table dtype name; None: the table's); LookupError for an unknown table,
    ValueError for ids outside the type or a bad dtype."""
    return _bound().embeddings.rows(str(name), gids, None if dtype is None else str(dtype))


def emb_push(name: str, gids: torch.Tensor, grads: torch.Tensor, update: SparseUpdate,
             number: int | None = None) -> int:
    """Apply one optimizer step (rule ``update``) to this part's rows ``gids`` with gradient rows ``grads``
    (duplicates summed); how many rows changed.  ``number``: the push's place in the table's sequence (a push
    sent again after a re-formed group, applied already, is acknowledged with 0).  ValueError for ids not owned
    here or a bad shape."""
    if not isinstance(update, SparseUpdate):
        raise ValueError(f"emb_push takes a SparseUpdate, got {type(update).__name__}")
    return _bound().embeddings.push(str(name), gids, grads, update, None if number is None else int(number))


def emb_attach(session_id: str, secret: bytes, names: list[str]) -> None:
    """Session ``session_id``'s batches carry the rows of tables ``names`` (one per node type) from now on.
    PermissionError for a wrong ``secret``; LookupError for an unknown session or table."""
    worker = _bound()
    worker.authorize(str(session_id), secret)
    store = worker.embeddings
    tables = {store.table(str(n)).spec.ntype: str(n) for n in names}
    worker.session(str(session_id)).attach_embeddings(store, tables)


def emb_save(name: str, tag: str) -> str:
    """Write this part's rows and optimizer state of table ``name`` as checkpoint ``tag`` (under the daemon's
    ``embedding_dir``); the file's path."""
    return _bound().embeddings.save(str(name), str(tag))


def emb_load(name: str, tag: str) -> int:
    """Replace this part's rows and state of table ``name`` with its checkpoint ``tag``; the table's push sequence
    number after it."""
    return _bound().embeddings.load(str(name), str(tag))


ALLOWED = frozenset({pull, pull_into, attach, detach, sample, one_hop, gather, has_edges, edge_attr, to_global,
                     hot_rows, part_identity, sample_seeds, node_rows, part_edges, emb_create, emb_close, emb_rows,
                     emb_push, emb_attach, emb_save, emb_load, input_seeds})
assert {f.__name__ for f in ALLOWED} == set(rpc_group.WORKER_RPC_FUNCTIONS)
_TORCH_INTERNAL = "torch.distributed.rpc.api"   # _gather_to_leader, _broadcast_to_followers, ...


def listener_functions() -> dict[str, Function]:
    """What the worker's secure listener answers: the same functions, async ones answering with a Pending; peer
    workers may call only ``rpc_group.PEER_FUNCTIONS`` (the listener knows who called: the pair-key proof)."""
    table = {f.__name__: Function(f, peers=f.__name__ in rpc_group.PEER_FUNCTIONS) for f in ALLOWED}
    table.update(pull=Function(pull_pending, True), pull_into=Function(pull_into_pending, True),
                 sample=Function(sample_pending, True), sample_seeds=Function(sample_seeds_pending, True))
    return table


def install_guard() -> None:
    """Refuse RPCs to anything but :data:`ALLOWED` in this process (call before ``init_rpc``).

    torch's C++ handler looks ``internal._run_function`` up when the agent starts, so the
    wrapper must be in place first.
    """
    original = rpc_internal._run_function
    if getattr(original, "_graphfeed_guard", False):
        return

    def guarded(python_udf):
        func = getattr(python_udf, "func", None)
        verified = isinstance(func, rpc_group.Verified) and func.func in ALLOWED
        if (not isinstance(python_udf, AttributeError) and not verified
                and getattr(func, "__module__", None) != _TORCH_INTERNAL):
            name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
            return rpc_internal.RemoteException(
                f"{name} is not callable on a graphfeed session worker (allowed: "
                f"{', '.join(sorted(f.__name__ for f in ALLOWED))})",
                PermissionError)
        return original(python_udf)

    guarded._graphfeed_guard = True  # type: ignore[attr-defined]
    rpc_internal._run_function = guarded
