"""Where one part's hops and features come from: the source protocol and the local source.

A :class:`graphfeed.server.sampling.graph.PartitionedGraph` holds one source per part.  A
source *starts* a request and hands back a :class:`Handle`; ``wait()`` gives the result.  A
remote source (a peer worker, :class:`graphfeed.server.worker.peers.RemoteSource`) returns
while the request is in flight, so the driver starts every remote piece first and works on
the local pieces meanwhile; a :class:`LocalSource` does the work when started and returns
a :class:`Ready` handle.
"""
from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import torch

from graphfeed.core.spec import SamplingSpec
from graphfeed.server.partition.store import Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.types import OneHop

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # (x, y, original ids) of some nodes


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
    """The nodes of one part: sample a hop for some of them, read their features.

    ``local`` is True when the source works in the caller's thread as it is started (the
    driver then starts it after every remote source, and times it as ``local_sample``).
    Every id passed is a global id the part owns.
    """

    part_id: int
    local: bool

    def start_one_hop(self, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                      hop: int) -> Handle[OneHop]: ...

    def start_gather(self, gids: torch.Tensor) -> Handle[Rows]: ...


class LocalSource:
    """A part whose arrays are in this process (memory-mapped :class:`Partition`)."""

    local = True

    def __init__(self, part: Partition):
        self.part = part
        self.part_id = part.part_id

    # ---- the PartSource protocol ------------------------------------------------------------------

    def start_one_hop(self, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                      hop: int) -> Ready[OneHop]:
        return Ready(self.one_hop(gids, spec, fanout, seed, hop))

    def start_gather(self, gids: torch.Tensor) -> Ready[Rows]:
        """Rows the driver copies into place next (``index_copy_``): read with torch's ``index_select``,
        so both copies stay on torch's thread pool (the native gather's pool and torch's spinning
        OpenMP threads contend for the cores: measured ~1.5x slower on a busy 2-core machine)."""
        local = gids - self.part.start
        x, y = self.feature_arrays()
        return Ready((x.index_select(0, local), y.index_select(0, local), self.part.orig_id.index_select(0, local)))

    # ---- the work ---------------------------------------------------------------------------------

    def one_hop(self, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int, hop: int) -> OneHop:
        """One hop of ``spec``'s topology for nodes ``gids`` (owned by this part)."""
        topo = self.part.topology(spec.topology)
        return dispatch.one_hop(topo, gids - self.part.start, gids, fanout, spec.replace, seed, hop)

    def gather(self, gids: torch.Tensor) -> Rows:
        """``(x, y, original ids)`` of nodes ``gids`` as the answer (no second copy follows);
        ValueError when the part does not own them all.

        The dispatched row gather (native: parallel, GIL released), straight from the part's arrays.
        """
        local = self.check_owned(gids) - self.part.start
        x, y, orig = (dispatch.gather_rows(t, local) for t in (*self.feature_arrays(), self.part.orig_id))
        return x, y, orig

    def feature_arrays(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of the part's node type; ValueError when it has no features or no labels."""
        x, y = self.part.x, self.part.y
        if x is None or y is None:
            raise ValueError(f"node type {self.part.ntype!r} has no {'features' if x is None else 'labels'}: "
                             f"the node loaders need both on the input type")
        return x, y

    def check_owned(self, gids) -> torch.Tensor:
        """``gids`` as int64; ValueError naming the part's range when one of them is not the part's."""
        gids = torch.as_tensor(gids, dtype=torch.int64)
        p = self.part
        if gids.numel() and (int(gids.min()) < p.start or int(gids.max()) >= p.stop):
            raise ValueError(f"part {p.part_id} owns node ids {p.start}..{p.stop - 1}, "
                             f"got ids in {int(gids.min())}..{int(gids.max())}")
        return gids

    # ---- what peers ask of this part (their RemoteSource, via rpc_api.one_hop; rpc_api.gather: gather) ---

    def serve_one_hop(self, gids, fanout: int, replace: bool, direction: str, seed: int,
                      hop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(counts, neighbors, eids)`` of one hop for ``gids`` (checked to be this part's)."""
        gids = self.check_owned(gids)
        spec = SamplingSpec((fanout,), replace=replace, direction=direction)
        res = self.one_hop(gids, spec, fanout, seed, hop)
        return res.counts, res.neighbors, res.eids
