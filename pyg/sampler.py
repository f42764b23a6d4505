"""``GraphfeedSampler``: PyG's ``BaseSampler`` whose sampling runs on the graphfeed servers.

``NodeLoader(data=(feature_store, graph_store), node_sampler=GraphfeedSampler(client, [10, 5]), ...)`` and
``LinkLoader(..., link_sampler=...)`` keep the topology on the servers: each ``sample_from_nodes`` /
``sample_from_edges`` is one call to one session worker (round robin), which samples across every part
and gathers the batch's feature rows, as graphfeed's loaders do.  The rows come back with the sample
(``metadata[-1]``, :class:`~graphfeed.pyg.convert.BatchRows`) and are handed to the feature store, so the
loader's ``filter_fn`` reads ``x``/``y`` without a second round trip.

Seeding.  Batch ``i`` since :meth:`GraphfeedSampler.set_epoch` ``(e)`` is sampled with graphfeed's batch
seed ``batch_seed(seed, e, i)`` (:mod:`graphfeed.core.seeding`), and a seed edge's negatives are keyed by
its position in the loader's input, as in graphfeed's link loaders.  So a PyG loader with
``shuffle=False`` gives, batch for batch, what ``client.neighbor_loader`` / ``link_neighbor_loader`` give
over the same input ids with the same ``batch_size``, ``seed`` and epoch (``ordered`` input).  Without
``set_epoch`` the count simply goes on (every batch still has its own seed).

Batches ahead.  PyG calls a sampler once per batch and waits; alone, that leaves the servers idle while
the trainer steps.  PyG's ``NodeLoader`` / ``LinkLoader`` (and their ``Neighbor`` subclasses) over graphfeed's
stores tell the sampler their next ``prefetch`` batches per server as they read them
(:mod:`graphfeed.pyg.loaders`): :meth:`GraphfeedSampler.start_ahead` starts each one's call, and the
loader's own call for that batch then takes the answer.  A call for other seeds than the one started next
drops what was started (and its batch seeds: the count goes on from the first dropped one), so the
seeding above holds with or without batches ahead.

The sampler runs in the trainer's process (its client's data path lives there): a DataLoader worker
process (``num_workers > 0``) is refused with a one-line error; the servers already sample in parallel.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence, Union

import torch
from torch.utils.data import get_worker_info
from torch_geometric.sampler import BaseSampler, EdgeSamplerInput, NegativeSampling, NodeSamplerInput

from graphfeed.client.errors import InvalidRequest, ServerError
from graphfeed.client.sessions import SessionSet
from graphfeed.core import spec as specs
from graphfeed.core.compact import unpack
from graphfeed.core.seeding import batch_seed
from graphfeed.proto.convert import open_session_request
from graphfeed.pyg.calls import WAIT_SLACK, remote_message
from graphfeed.pyg.convert import to_sampler_output
from graphfeed.transport.errors import PeerLost

if TYPE_CHECKING:
    from graphfeed.client.client import Client
    from graphfeed.pyg.stores import GraphfeedFeatureStore
    from graphfeed.transport.pending import Pending

SESSION_KIND = "pyg"   # the sessions' metrics label
DEFAULT_PREFETCH = 4   # batches ahead per server, as graphfeed's loaders' ``prefetch``

Seeds = Union[specs.NodeInput, specs.LinkInput]


@dataclass
class _Ahead:
    """A batch started before the loader asked for it: the loader's request (PyG's sampler input and negative
    sampling), its seeds and input positions, its batch number and the call."""

    request: tuple
    seeds: Seeds
    positions: torch.Tensor
    index: int
    pending: Pending


class GraphfeedSampler(BaseSampler):
    """Neighbor sampling by the servers of ``client`` (a connected :class:`graphfeed.client.Client`).

    ``num_neighbors``: fanouts per hop, or ``{(src, rel, dst): [...]}`` on a typed graph (as PyG's
    ``NeighborSampler``); ``replace``, ``disjoint``, ``weight_attr`` as PyG's; ``direction`` (``"in"``,
    graphfeed's) samples in- or out-edges; ``feature_dtype`` casts the rows the servers send (``"bf16"``,
    ``"fp16"``); ``seed`` the loader seed of the module doc.  ``feature_store``: the
    :class:`~graphfeed.pyg.stores.GraphfeedFeatureStore` the loader reads, handed each batch's rows.
    ``prefetch``: batches started ahead per server when a PyG loader names them (0: none; module doc).
    Refused with one line (ValueError): ``subgraph_type`` other than ``"directional"``, ``time_attr`` /
    ``temporal_strategy`` (temporal sampling: use graphfeed's loaders), negative sampling ``weight``.
    """

    def __init__(self, client: Client, num_neighbors, *, feature_store: GraphfeedFeatureStore | None = None,
                 seed: int = 0, replace: bool = False, disjoint: bool = False, direction: str = "in",
                 weight_attr: str | None = None, feature_dtype=None, subgraph_type: str = "directional",
                 time_attr: str | None = None, temporal_strategy: str = "uniform",
                 prefetch: int = DEFAULT_PREFETCH):
        if str(getattr(subgraph_type, "value", subgraph_type)) != "directional":
            raise ValueError(f"subgraph_type={subgraph_type!r} is not offered by graphfeed's servers: use "
                             f"'directional' (direction='out' samples out-edges)")
        if time_attr is not None or temporal_strategy != "uniform":
            raise ValueError("temporal sampling (time_attr, temporal_strategy) is not offered through PyG's "
                             "loaders: use client.neighbor_loader(..., time_attr=...)")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed must be an integer in 0..2**64-1, got {seed!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be a non-negative integer, got {prefetch!r}")
        self.client, self.seed, self.feature_store, self.prefetch = client, seed, feature_store, prefetch
        self.spec = specs.LoaderSpec.of(specs.NodeInput(ids=torch.tensor([0])), num_neighbors, batch_size=1,
                                        replace=replace, disjoint=disjoint, direction=direction,
                                        weight_attr=weight_attr, feature_dtype=feature_dtype, rank=0,
                                        world_size=1, kind=SESSION_KIND, ordered=False)
        self.spec.check_schema(client.node_types, client.edge_types)
        self.epoch, self._index = 0, 0
        self._lock = threading.Lock()        # the batch counter and the batches ahead
        self._ahead: deque[_Ahead] = deque()
        #: how many times batches ahead were dropped (a reader ahead starts its unread batches again when it changes)
        self.drops = 0
        self._open_lock = threading.Lock()   # the sessions, opened at the first sample
        self._next_part = itertools.count()
        self._sessions: SessionSet | None = None
        self._finalizer: weakref.finalize | None = None

    # ---- seeding -------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The next batch is batch 0 of ``epoch`` (see the module doc)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        with self._lock:
            self.epoch, self._index = epoch, 0
            self._drop_ahead()

    def _take_index(self) -> int:
        with self._lock:
            index, self._index = self._index, self._index + 1
            return index

    # ---- PyG's contract ------------------------------------------------------------------------

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs):
        """One batch for the seeds of ``index`` (original ids of ``index.input_type``, None: the label type)."""
        wire, _ = self._sample((index, None), lambda: self._node_seeds(index))
        return self._output(wire, None, link=False)

    def sample_from_edges(self, index: EdgeSamplerInput, neg_sampling: NegativeSampling | None = None):
        """One link batch for the seed edges of ``index`` (original ids; ``input_type`` their edge type), with
        negatives drawn by the servers as graphfeed's link loaders draw them (strict: never an edge)."""
        wire, link = self._sample((index, neg_sampling), lambda: self._link_seeds(index, neg_sampling))
        neg = link.neg if isinstance(link, specs.LinkInput) else None
        return self._output(wire, None if neg is None else neg.mode, link=True)

    def start_ahead(self, index: NodeSamplerInput | EdgeSamplerInput,
                    neg_sampling: NegativeSampling | None = None) -> bool:
        """Start the batch of ``index`` now, the loader's call for it to come (:mod:`graphfeed.pyg.loaders`
        calls this with the loader's next batches, in order); False when ``prefetch`` batches per server are
        already ahead or the call could not start (the loader's own call then makes it, and raises)."""
        with self._lock:
            full = len(self._ahead) >= self.prefetch * len(self.client.servers)
        if full or get_worker_info() is not None:
            return False
        try:
            seeds = (self._node_seeds(index) if isinstance(index, NodeSamplerInput)
                     else self._link_seeds(index, neg_sampling))
            positions = _positions(seeds, index.input_id)
            with self._lock:   # numbered and started in the loader's order
                number = self._index + len(self._ahead)
                pending = self._start(self._next_server(), seeds, positions, self._seed(number))
                self._ahead.append(_Ahead((index, neg_sampling), seeds, positions, number, pending))
        except Exception:  # noqa: BLE001 -- a batch ahead is a hint: its own call raises what went wrong
            return False
        return True

    def _node_seeds(self, index: NodeSamplerInput) -> specs.NodeInput:
        if index.time is not None:
            raise ValueError("input_time (temporal sampling) is not offered through PyG's loaders: use "
                             "client.neighbor_loader(..., input_time=...)")
        return specs.NodeInput(ids=index.node, node_type=index.input_type)

    def _link_seeds(self, index: EdgeSamplerInput, neg_sampling: NegativeSampling | None) -> specs.LinkInput:
        if index.time is not None:
            raise ValueError("edge_label_time (temporal sampling) is not offered through PyG's loaders: use "
                             "client.link_neighbor_loader(..., edge_label_time=...)")
        neg = _negatives(neg_sampling)
        homogeneous = list(self.client.node_types) == [self.client.label_type] and len(self.client.edge_types) == 1
        etype = None if index.input_type is None or homogeneous else tuple(index.input_type)
        return specs.LinkInput(torch.stack([index.row, index.col]), index.label, neg, etype)  # type: ignore[arg-type]

    @property
    def edge_permutation(self):
        return None   # e_id are original edge ids already

    # ---- the call ------------------------------------------------------------------------------

    def _output(self, wire, neg_mode: str | None, link: bool):
        out, rows = to_sampler_output(wire, neg_mode, link)
        if self.feature_store is not None:
            self.feature_store.offer(rows)
        return out

    def _sample(self, request: tuple, seeds_of: Callable[[], Seeds]) -> tuple[dict[str, torch.Tensor], Seeds]:
        """The wire batch and seeds of ``request`` (PyG's sampler input and negative sampling): the batch started
        ahead for it, else one call now with the seeds ``seeds_of()`` makes (and checks)."""
        if get_worker_info() is not None:
            raise RuntimeError("GraphfeedSampler runs in the trainer process, where its client's data path is: "
                               "pass num_workers=0 to the loader (the servers sample in parallel already)")
        self.client._check_usable()
        ahead = self._started(request)
        if ahead is not None:
            try:
                return unpack(ahead.pending.result(timeout=self.client.rpc_timeout + WAIT_SLACK)), ahead.seeds
            except Exception:  # noqa: BLE001 -- the call again, which re-opens, recovers or names the failure
                return self._call(ahead.seeds, ahead.positions, self._seed(ahead.index)), ahead.seeds
        seeds = seeds_of()
        positions = _positions(seeds, request[0].input_id)
        return self._call(seeds, positions, self._seed(self._take_index())), seeds

    def _seed(self, index: int) -> int:
        return batch_seed(self.seed, self.epoch, index)

    def _started(self, request: tuple) -> _Ahead | None:
        """The batch started ahead for ``request`` (the next one, counted); another request drops every batch
        ahead, and the count goes back to the first of them."""
        with self._lock:
            if not self._ahead:
                return None
            head = self._ahead.popleft()
            if _same(head.request, request):
                self._index = head.index + 1
                return head
            self._index = head.index
            self._drop_ahead()
            return None

    def _drop_ahead(self) -> None:
        """Forget the batches ahead (under ``_lock``); their answers are never read."""
        self._ahead.clear()
        self.drops += 1

    def _start(self, part: int, seeds: Seeds, positions: torch.Tensor, seed: int) -> Pending:
        """The ``sample_seeds`` call of one batch on server ``part``."""
        sessions = self._open_sessions()
        return self.client.group.calls.call(part, "sample_seeds", (sessions.ids[part], sessions.secrets[part], seeds,
                                                                   positions, int(seed)), self.client.rpc_timeout)

    def _next_server(self) -> int:
        """The part whose worker samples the next batch (round robin)."""
        return next(self._next_part) % len(self.client.servers)

    def _call(self, seeds, positions: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
        """One ``sample_seeds`` call: an idle-expired session is re-opened once and a lost server waited for
        (:meth:`Client.call_with_recovery`), then the call is made again."""
        what = f"sample of {positions.numel()} seed(s)"
        return self.client.call_with_recovery(what, lambda: self._call_once(seeds, positions, seed, what))

    def _call_once(self, seeds, positions: torch.Tensor, seed: int, what: str) -> dict[str, torch.Tensor]:
        client = self.client
        for attempt in (0, 1):
            self._open_sessions()   # its errors are the servers' own answers, raised as they are
            part = self._next_server()
            server = client.servers[part].name
            try:
                value = self._start(part, seeds, positions, seed).result(timeout=client.rpc_timeout + WAIT_SLACK)
            except ValueError as exc:   # the worker refused the seeds: the server's INVALID_ARGUMENT
                raise InvalidRequest(f"{server}: sample: {remote_message(exc)}") from None
            except PeerLost:
                raise   # the client waits for the server
            except Exception as exc:    # noqa: BLE001 -- an expired session, a timeout, a failed sample
                message = f"{what} failed: {remote_message(exc)}"
                if attempt == 0 and "unknown session" in message:
                    self._open_sessions().reopen(close_old=True)
                    continue
                raise ServerError(server, message) from exc
            return unpack(value)   # the worker answers in the compact wire form (graphfeed.core.compact)
        raise AssertionError("unreachable")

    def _open_sessions(self) -> SessionSet:
        """This sampler's session on every server (opened at the first sample; re-opened by the client
        after it re-forms its group, as a loader's)."""
        with self._open_lock:
            if self._sessions is None or self._sessions.closed:
                spec, client = self.spec, self.client
                self._sessions = SessionSet(client, lambda: open_session_request(spec, client.group.group_id)).open()
                # dropped without close(): its sessions go to the client, which closes them as a dropped loader's
                self._finalizer = weakref.finalize(self, client._orphans.extend, _Orphaned(self._sessions.live_ids))
            return self._sessions

    def close(self) -> None:
        """Close the sampler's sessions on the servers (the client's close does it too)."""
        with self._lock:
            self._drop_ahead()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._sessions is not None:
            self._sessions.close()
            self._sessions = None


class _Orphaned:
    """The ``(part, session id)`` pairs of a dropped sampler's sessions (read when it is collected)."""

    def __init__(self, ids: list[str]):
        self.ids = ids

    def __iter__(self):
        return iter(list(enumerate(self.ids)))


def _positions(seeds: Seeds, input_id: torch.Tensor | None) -> torch.Tensor:
    """The seeds' positions in the loader's input (PyG's ``input_id``; None: 0, 1, ...)."""
    if input_id is not None:
        return input_id.to(torch.int64).reshape(-1)
    return torch.arange(seeds.num_edges if isinstance(seeds, specs.LinkInput) else seeds.ids.numel())  # type: ignore[union-attr]


def _same(a, b) -> bool:
    """Whether two requests are the same: records field by field, tensors by value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _negatives(neg: NegativeSampling | None) -> specs.NegativeSampling | None:
    """PyG's negative sampling as graphfeed's record; ValueError for PyG's per-node ``weight``."""
    if neg is None:
        return None
    if getattr(neg, "weight", None) is not None:
        raise ValueError("negative sampling weights are not offered by graphfeed's servers (destinations are "
                         "uniform over the nodes, strict): drop NegativeSampling(weight=...)")
    return specs.NegativeSampling.of(neg)


__all__: Sequence[str] = ["GraphfeedSampler"]
