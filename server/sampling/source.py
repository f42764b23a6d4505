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

from typing import Generic, Optional, Protocol, TypeVar

import torch

from graphfeed.core.spec import EdgeType, SamplingSpec
from graphfeed.server.partition.store import NodeStore, Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.types import OneHop

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# (x, y, original ids) of some nodes of one type; x / y are None for a type without features / labels
Rows = tuple[Optional[torch.Tensor], Optional[torch.Tensor], torch.Tensor]


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

    ``local`` is True when the source works in the caller's thread as it is started (the
    driver then starts it after every remote source, and times it as ``local_sample``).
    Every id passed is a global id of the named type that the part owns.
    """

    part_id: int
    local: bool

    def start_one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                      hop: int) -> Handle[OneHop]: ...

    def start_gather(self, ntype: str, gids: torch.Tensor) -> Handle[Rows]: ...


def center_type(etype: EdgeType, direction: str) -> str:
    """The node type a hop of ``etype`` expands: its destination for in-edges, its source for out-edges."""
    return etype[2] if direction == "in" else etype[0]


class LocalSource:
    """A part whose arrays are in this process (memory-mapped :class:`Partition`)."""

    local = True

    def __init__(self, part: Partition):
        self.part = part
        self.part_id = part.part_id

    # ---- the PartSource protocol ------------------------------------------------------------------

    def start_one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                      hop: int) -> Ready[OneHop]:
        return Ready(self.one_hop(etype, gids, spec, fanout, seed, hop))

    def start_gather(self, ntype: str, gids: torch.Tensor) -> Ready[Rows]:
        """Rows the driver copies into place next (``index_copy_``): read with torch's ``index_select``,
        so both copies stay on torch's thread pool (the native gather's pool and torch's spinning
        OpenMP threads contend for the cores: measured ~1.5x slower on a busy 2-core machine)."""
        store = self.part.nodes(ntype)
        local = gids - store.start
        x, y = store.x, store.y
        return Ready((None if x is None else x.index_select(0, local), None if y is None else y.index_select(0, local),
                      store.orig_id.index_select(0, local)))

    # ---- the work ---------------------------------------------------------------------------------

    def one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                hop: int) -> OneHop:
        """One hop of ``etype`` in ``spec``'s direction for nodes ``gids`` (of the hop's center type,
        owned by this part); ``hop`` is the RNG hop."""
        topo = self.part.edges(etype).topology(spec.topology)
        start = self.part.nodes(center_type(etype, spec.direction)).start
        return dispatch.one_hop(topo, gids - start, gids, fanout, spec.replace, seed, hop)

    def gather(self, ntype: str, gids: torch.Tensor) -> Rows:
        """``(x, y, original ids)`` of nodes ``gids`` of type ``ntype`` as the answer (no second copy
        follows; x / y None where the type has none); ValueError when the part does not own them all.

        The dispatched row gather (native: parallel, GIL released), straight from the part's arrays.
        """
        store = self.part.nodes(ntype)
        local = check_owned(store, gids) - store.start
        x, y = (None if t is None else dispatch.gather_rows(t, local) for t in (store.x, store.y))
        return x, y, dispatch.gather_rows(store.orig_id, local)

    # ---- what peers ask of this part (their RemoteSource, via rpc_api.one_hop; rpc_api.gather: gather) ---

    def serve_one_hop(self, etype, gids, fanout: int, replace: bool, direction: str, seed: int,
                      hop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(counts, neighbors, eids)`` of one hop of edge type ``etype`` for ``gids`` (checked to be
        this part's nodes of the hop's center type); ValueError for an unknown edge type."""
        etype = self.part.edges(tuple(etype)).etype     # ValueError naming the graph's edge types
        spec = SamplingSpec((fanout,), replace=replace, direction=direction)
        gids = check_owned(self.part.nodes(center_type(etype, direction)), gids)
        res = self.one_hop(etype, gids, spec, fanout, seed, hop)
        return res.counts, res.neighbors, res.eids


def check_owned(store: NodeStore, gids) -> torch.Tensor:
    """``gids`` as int64; ValueError naming the part's range of the type when one of them is not the part's."""
    gids = torch.as_tensor(gids, dtype=torch.int64)
    if gids.numel() and (int(gids.min()) < store.start or int(gids.max()) >= store.stop):
        what = "node" if store.meta.is_homogeneous else f"{store.ntype!r} node"
        raise ValueError(f"part {store.part_id} owns {what} ids {store.start}..{store.stop - 1}, "
                         f"got ids in {int(gids.min())}..{int(gids.max())}")
    return gids
