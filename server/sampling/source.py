"""Where one part's hops and features come from: the source protocol and the local source.

A :class:`graphfeed.server.sampling.graph.PartitionedGraph` holds one source per part.  A
source *starts* a request and hands back a :class:`Handle`; ``wait()`` gives the result.  A
remote source (a peer worker, :class:`graphfeed.server.worker.peers.RemoteSource`) returns
while the request is in flight, so the driver starts every remote piece first and works on
the local pieces meanwhile; a :class:`LocalSource` does the work when started and returns
a :class:`Ready` handle.

Requests are typed: a hop names its edge type (the frontier ids are of the type the hop
expands: the destination type for in-edges, the source type for out-edges) and a feature
read names its node type.  A homogeneous graph is the one-type case (``"_N"``,
``("_N", "to", "_N")``).  Ids are global ids within their node type.
"""
from __future__ import annotations

import dataclasses
from typing import Generic, Protocol, TypeVar

import torch

from graphfeed.core.spec import EdgeType, SamplingSpec
from graphfeed.server.partition.format.store import NodeStore, Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.types import NodeRows, OneHop

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# the rows of some nodes of one type, named as the batch's node fields (x, y, n_id; x / y None where the type has none)
Rows = NodeRows


class Handle(Protocol[T_co]):
    """A started request; ``wait()`` blocks until its result is there and returns it (or raises)."""

    def wait(self) -> T_co: ...


class Ready(Generic[T]):
    """A handle whose result is already there: what a local source returns."""

    __slots__ = ("value",)

    def __init__(self, value: T):
        self.value = value

    def wait(self) -> T:
        return self.value


class PartSource(Protocol):
    """The nodes of one part: sample a hop of an edge type for some of them, read their features.

    ``part_id`` is the part it serves; ``device`` where it samples and gathers (a peer's source:
    the CPU, where its answers arrive).  ``local`` is True when the source works in the caller's
    thread as it is started (the driver then starts it after every remote source, and times it as
    ``local_sample``); :meth:`held` then gives the part's arrays in this process.  Every id passed
    is a global id of the named type that the part owns; results are on the ids' device.
    """

    part_id: int
    local: bool
    device: torch.device

    def held(self) -> HeldPart | None:
        """This part's arrays and in-process reads when they are in this process, else None (a peer)."""
        ...

    def start_one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                      hop: int, seed_time: torch.Tensor | None = None) -> Handle[OneHop]: ...

    def start_gather(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None = None) -> Handle[Rows]:
        """The rows of ``gids``; ``dtype``: the batch's feature transport dtype, which a peer may send ``x`` in
        (:meth:`NodeRows.in_transport_dtype`: the batch ends the same); a held part reads its rows as stored."""
        ...

    # link loaders (edge type / node type None: the default one, a homogeneous graph's) and edge features
    # (the default edge type)

    def start_has_edges(self, pairs: torch.Tensor, kind: str,
                        etype: EdgeType | None = None) -> Handle[torch.Tensor]: ...

    def start_edge_attr(self, pairs: torch.Tensor, kind: str) -> Handle[torch.Tensor]: ...

    def start_to_global(self, orig_ids: torch.Tensor,
                        ntype: str | None = None) -> Handle[tuple[torch.Tensor, torch.Tensor]]: ...


class HeldPart(Protocol):
    """A part whose arrays are in this process (:meth:`PartSource.held`): read and sampled directly."""

    part: Partition
    device: torch.device

    def one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                hop: int, seed_time: torch.Tensor | None = None) -> OneHop: ...

    def gather(self, ntype: str, gids: torch.Tensor) -> Rows: ...

    def gather_to(self, ntype: str, gids: torch.Tensor, out: Rows, pos: torch.Tensor) -> None: ...


def center_type(etype: EdgeType, direction: str) -> str:
    """The node type a hop of ``etype`` expands: its destination for in-edges, its source for out-edges."""
    return etype[2] if direction == "in" else etype[0]


class LocalSource:
    """A part whose arrays are in this process (memory-mapped :class:`Partition`), sampled on the CPU."""

    local = True
    device = torch.device("cpu")

    def __init__(self, part: Partition):
        self.part = part
        self.part_id = part.part_id

    def held(self) -> LocalSource:
        return self

    # ---- the PartSource protocol ------------------------------------------------------------------

    def start_one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                      hop: int, seed_time: torch.Tensor | None = None) -> Ready[OneHop]:
        return Ready(self.one_hop(etype, gids, spec, fanout, seed, hop, seed_time))

    def start_gather(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None = None) -> Ready[Rows]:
        """Rows (as stored) the driver copies into place next (``index_copy_``): read with torch's ``index_select``,
        so both copies stay on torch's thread pool (the native gather's pool and torch's spinning
        OpenMP threads contend for the cores: measured ~1.5x slower on a busy 2-core machine)."""
        store = self.part.nodes(ntype)
        local = gids - store.start
        return Ready(NodeRows.read(store, lambda column: column.index_select(0, local)))

    def gather_to(self, ntype: str, gids: torch.Tensor, out: NodeRows, pos: torch.Tensor) -> None:
        """Rows of ``gids`` (type ``ntype``, this part's) written straight to rows ``pos`` of ``out``
        (the driver's per-batch arrays; fields None where the type has none)."""
        store = self.part.nodes(ntype)
        local = (gids - store.start).cpu()     # a GPU graph's batch arrays (out) are filled from here too
        for name, dst in out.items():
            src = store.column(NodeRows.COLUMNS[name])
            if dst is not None and src is not None:
                dispatch.gather_rows_to(src, local, dst, pos)

    def start_has_edges(self, pairs: torch.Tensor, kind: str, etype: EdgeType | None = None) -> Ready[torch.Tensor]:
        return Ready(self.has_edges(pairs, kind, etype))

    def start_edge_attr(self, pairs: torch.Tensor, kind: str) -> Ready[torch.Tensor]:
        return Ready(self.edge_attr(pairs, kind))

    def start_to_global(self, orig_ids: torch.Tensor,
                        ntype: str | None = None) -> Ready[tuple[torch.Tensor, torch.Tensor]]:
        store = self.part.nodes(self.part.label_type if ntype is None else ntype)
        return Ready(store.to_global(torch.as_tensor(orig_ids, dtype=torch.int64)))

    # ---- the work ---------------------------------------------------------------------------------

    def has_edges(self, pairs: torch.Tensor, kind: str, etype: EdgeType | None = None) -> torch.Tensor:
        """bool [n]: whether each ``pairs[i] = (src, dst)`` (global ids) is an edge of edge type ``etype``
        (None: the part's default edge type, a homogeneous graph's one).

        ``kind="csr"`` looks in the out-edges of ``src`` (this part must own every ``src``),
        ``"csc"`` in the in-edges of ``dst`` (this part must own every ``dst``).  A binary search
        per pair: neighbor lists are sorted by global id (the partition format's invariant).
        ValueError for an unknown kind or ids the part does not own.
        """
        if kind not in ("csr", "csc"):
            raise ValueError(f"kind must be 'csr' or 'csc', got {kind!r}")
        pairs = torch.as_tensor(pairs, dtype=torch.int64).reshape(-1, 2)
        own, other = (pairs[:, 0], pairs[:, 1]) if kind == "csr" else (pairs[:, 1], pairs[:, 0])
        edges = self.part.edges(self.part.etype if etype is None else etype)
        store = self.part.nodes(edges.etype[0] if kind == "csr" else edges.etype[2])
        topo = edges.topology(kind)
        rows = check_owned(store, own) - store.start
        return _contains_sorted(topo.indptr, topo.indices, rows, other)

    def one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                hop: int, seed_time: torch.Tensor | None = None) -> OneHop:
        """One hop of ``etype`` in ``spec``'s direction for nodes ``gids`` (of the hop's center type,
        owned by this part); ``hop`` is the RNG hop.  Weighted by ``spec.weight_attr`` when set
        (``etype``'s weights: ValueError naming the edge type when it has none); temporal (``spec.time_attr``) with
        ``seed_time`` (one per node of ``gids``): only edges whose time is not later than it."""
        topo = self.part.edges(etype).topology(spec.topology)
        start = self.part.nodes(center_type(etype, spec.direction)).start
        if spec.time_attr is not None:
            if seed_time is None:
                raise ValueError("temporal sampling needs a seed time per frontier node")
            edge_time = self.part.edge_times(etype, spec.topology, spec.time_attr)
            sample = dispatch.temporal_one_hop if spec.temporal_strategy == "uniform" else dispatch.last_one_hop
            return sample(topo, edge_time, gids - start, gids, seed_time, fanout, spec.hop_replace, seed, hop)
        if spec.weight_attr is not None:
            weight = self.part.edge_weights(etype, spec.topology, spec.weight_attr)
            return dispatch.weighted_one_hop(topo, weight, gids - start, gids, fanout, spec.hop_replace, seed, hop)
        return dispatch.one_hop(topo, gids - start, gids, fanout, spec.hop_replace, seed, hop)

    def edge_attr(self, pairs: torch.Tensor, kind: str) -> torch.Tensor:
        """Edge features of ``pairs[i] = (center node, original edge id)``, in order: the edges of the
        ``kind`` topology of center nodes this part owns (the center is the destination for ``"csc"``,
        the source for ``"csr"``).  ValueError when the graph has no edge features, a center is not
        this part's, or an edge id is not among its edges."""
        attr = self.part.edges(self.part.etype).edge_attr(kind)
        if attr is None:
            raise ValueError("the graph has no edge features (partition it with edge_attr.npy)")
        pairs = torch.as_tensor(pairs, dtype=torch.int64).reshape(-1, 2)
        check_owned(self.part.nodes(self.part.ntype), pairs[:, 0])
        sorted_eid, perm = self._eid_lookup(kind)
        eids = pairs[:, 1].contiguous()
        pos = torch.searchsorted(sorted_eid, eids).clamp(max=max(sorted_eid.numel() - 1, 0))
        if sorted_eid.numel() == 0 or not bool((sorted_eid.index_select(0, pos) == eids).all()):
            raise ValueError(f"part {self.part_id} holds no {kind.upper()} edge with some of the edge ids asked for")
        return attr.index_select(0, perm.index_select(0, pos))

    def _eid_lookup(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``kind`` topology's edge ids sorted, and their positions (made once per topology)."""
        cache = self.__dict__.setdefault("_eid_sorted", {})
        if kind not in cache:
            cache[kind] = torch.sort(self.part.topology(kind).eid.to(torch.int64))
        return cache[kind]

    def gather(self, ntype: str, gids: torch.Tensor) -> Rows:
        """The :class:`NodeRows` of nodes ``gids`` of type ``ntype`` as the answer (no second copy
        follows; x / y None where the type has none); ValueError when the part does not own them all.

        The dispatched row gather (native: parallel, GIL released), straight from the part's arrays.
        """
        store = self.part.nodes(ntype)
        local = check_owned(store, gids) - store.start
        return NodeRows.read(store, lambda column: dispatch.gather_rows(column, local))

    # ---- what peers ask of this part (their RemoteSource, via rpc_api.one_hop; rpc_api.gather: gather) ---

    def serve_one_hop(self, etype, gids, spec: SamplingSpec, fanout: int, seed: int, hop: int,
                      seed_time: torch.Tensor | None = None) -> OneHop:
        """One hop of edge type ``etype`` for ``gids`` (checked to be this part's nodes of the hop's center
        type) as a peer asked for it: ``spec`` (the session's, passed whole) is checked again as the
        record checks itself, ``seed_time`` to have one entry per node; ValueError naming the problem
        (an unknown edge type names the graph's)."""
        if not isinstance(spec, SamplingSpec):
            raise ValueError(f"one_hop needs a SamplingSpec, got {type(spec).__name__}")
        spec = dataclasses.replace(spec)    # runs the record's checks: a peer's word is not trusted
        etype = self.part.edges(tuple(etype)).etype     # ValueError naming the graph's edge types
        gids = check_owned(self.part.nodes(center_type(etype, spec.direction)), gids)
        if seed_time is not None:
            seed_time = torch.as_tensor(seed_time, dtype=torch.int64).reshape(-1)
            if seed_time.numel() != gids.numel():
                raise ValueError(f"seed_time has {seed_time.numel()} entries for {gids.numel()} nodes")
        return self.one_hop(etype, gids, spec, fanout, seed, hop, seed_time)


def check_owned(store: NodeStore, gids) -> torch.Tensor:
    """``gids`` as int64; ValueError naming the part's range of the type when one of them is not the part's."""
    gids = torch.as_tensor(gids, dtype=torch.int64)
    if gids.numel() and (int(gids.min()) < store.start or int(gids.max()) >= store.stop):
        what = "node" if store.meta.is_homogeneous else f"{store.ntype!r} node"
        raise ValueError(f"part {store.part_id} owns {what} ids {store.start}..{store.stop - 1}, "
                         f"got ids in {int(gids.min())}..{int(gids.max())}")
    return gids


def _contains_sorted(indptr: torch.Tensor, indices: torch.Tensor, rows: torch.Tensor,
                     targets: torch.Tensor) -> torch.Tensor:
    """bool [n]: whether ``targets[i]`` is in row ``rows[i]`` (``indices[indptr[r]:indptr[r+1]]``, sorted).

    A vectorized lower-bound search: ``log2(max degree) + 1`` steps over all pairs at once.
    """
    indptr = indptr.to(torch.int64)
    lo, end = indptr.index_select(0, rows), indptr.index_select(0, rows + 1)
    if indices.numel() == 0 or rows.numel() == 0:
        return torch.zeros(rows.numel(), dtype=torch.bool)
    hi, last = end.clone(), indices.numel() - 1
    active = lo < hi
    while bool(active.any()):
        mid = (lo + hi) // 2
        less = indices.index_select(0, mid.clamp(max=last)).to(torch.int64) < targets
        lo = torch.where(active & less, mid + 1, lo)
        hi = torch.where(active & ~less, mid, hi)
        active = lo < hi
    return (lo < end) & (indices.index_select(0, lo.clamp(max=last)).to(torch.int64) == targets)
