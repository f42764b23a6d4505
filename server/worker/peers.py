"""Sampling over a trainer's group: this worker's part locally, the other parts via their workers.

:func:`worker_graph` builds the worker's :class:`graphfeed.server.sampling.graph.PartitionedGraph`:
a :class:`graphfeed.server.sampling.source.LocalSource` for its own part and a
:class:`RemoteSource` for every peer.  A remote request is an asynchronous call to the peer
worker (:func:`graphfeed.server.worker.rpc_api.one_hop` / ``gather``) through the group's
:class:`~graphfeed.transport.calls.DataCalls` -- torch RPC, or the secure data path -- so the
graph sends all of a hop's remote pieces at once and samples the local piece meanwhile.
"""
from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

import torch

from graphfeed.core.spec import EdgeType, SamplingSpec
from graphfeed.server.partition.format.layout import part_files_identity
from graphfeed.server.partition.format.store import Partition
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.server.sampling.source import LocalSource, PartSource, Rows
from graphfeed.server.sampling.types import NodeRows, OneHop
from graphfeed.server.worker import peer_cache
from graphfeed.server.worker.peer_cache import RowCache
from graphfeed.server.worker.telemetry import WorkerTelemetry
from graphfeed.transport import wire
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.path import first_line
from graphfeed.transport.pending import Pending

# what peers answer one_hop and gather with travels on the secure data path as these records
wire.register_record(OneHop)
wire.register_record(NodeRows)

T = TypeVar("T")


class PeerError(RuntimeError):
    """A peer worker failed (or is unreachable) while serving a hop or a feature lookup."""


def worker_graph(part: Partition, rpc_timeout: float, telemetry: WorkerTelemetry | None = None,
                 own: PartSource | None = None, calls: DataCalls | None = None) -> PartitionedGraph:
    """The graph a session worker samples: ``part`` here (``own``: its source, e.g. a
    :class:`~graphfeed.server.sampling.gpu.GpuSource`; default a CPU :class:`LocalSource`), every other
    part on its peer worker (reached through ``calls``; default torch RPC)."""
    telemetry = telemetry if telemetry is not None else WorkerTelemetry()
    if calls is None:
        from graphfeed.transport.torch_rpc import TorchRpcCalls

        calls = TorchRpcCalls()
    mine = own if own is not None else LocalSource(part)
    sources: list[PartSource] = [mine if p == part.part_id else RemoteSource(p, rpc_timeout, telemetry, calls)
                                 for p in range(part.meta.num_parts)]
    return PartitionedGraph(sources, telemetry)


def colocate(graph: PartitionedGraph, part: Partition, timeout: float,
             make_source: Callable[[Partition], PartSource | None] | None = None) -> list[int]:
    """Read every peer's part whose files this process sees as the very files its worker reads -- the
    same host and the same folder (:func:`part_files_identity`) -- from those files, not over RPC.

    They share the host's page cache, so this costs no memory, and a remote row is then copied once
    (into the batch) instead of three times (the peer's gather, the transfer, the copy into place).
    Call once every worker of the group has joined (each peer answers ``part_identity``); a peer
    that does not answer within ``timeout`` seconds, or whose files differ, stays on RPC.  ``make_source(part)``
    makes the source that reads such a part (default a CPU :class:`LocalSource`).  Returns the parts now
    read locally.
    """
    local = []
    for source in list(graph.sources):
        if source.local or not isinstance(source, RemoteSource):
            continue
        p = source.part_id
        mine = part_files_identity(part.paths.root, p)
        if mine is None:
            continue
        try:
            theirs = source.calls.call_sync(p, "part_identity", (), timeout)
        except Exception:  # noqa: BLE001 -- no answer: the peer stays on RPC
            continue
        if theirs is None or tuple(theirs) != mine:
            continue
        peer = Partition(part.paths.root, p, meta=part.meta)
        graph.read_locally(peer, None if make_source is None else make_source(peer))
        local.append(p)
    return local


def replicate_hot_rows(graph: PartitionedGraph, part: Partition, budget_bytes: int, timeout: float) -> int:
    """Copy the rows of the other parts' nodes that ``part``'s edges reach most (:mod:`.peer_cache`), up to
    ``budget_bytes``, onto the peers' :class:`RemoteSource` here, so their ``gather`` calls ask only for the
    rest.  Parts read locally (:func:`colocate`) are skipped.  Each peer ``gather`` is bounded by
    ``timeout`` seconds; a peer that fails leaves its source without a cache (:class:`PeerError` is raised
    after the others are filled).  Returns the bytes replicated."""
    remote = {s.part_id: s for s in graph.sources if isinstance(s, RemoteSource)}
    chosen = peer_cache.pick(part, budget_bytes, remote)
    failed: list[str] = []
    total = 0
    for p, source in remote.items():
        wanted = {t: g[part.nodes(t).book.owner(g) == p] for t, g in chosen.items()}
        wanted = {t: g for t, g in wanted.items() if g.numel()}
        def gather(q: int, ntype: str, gids: torch.Tensor, calls: DataCalls = source.calls) -> NodeRows:
            return _node_rows(calls.call_sync(q, "gather", (ntype, gids), timeout))

        try:
            caches = peer_cache.fill(part, wanted, gather)
        except Exception as exc:  # noqa: BLE001 -- that peer stays uncached; reported below
            failed.append(f"part{p}: {first_line(exc)}")
            continue
        source.cached = caches.get(p, {})
        total += sum(c.nbytes for c in source.cached.values())
    if failed:
        raise PeerError(f"could not replicate hot rows of {'; '.join(failed)}")
    return total


class RemoteSource:
    """Part ``part_id`` on its worker in the group, through ``calls``.

    Each call's latency and outcome are recorded on ``telemetry`` when it completes; a failed
    call raises :class:`PeerError` naming the peer when waited for.
    """

    local = False
    device = torch.device("cpu")     # where its answers arrive (torch RPC sends host tensors)

    def __init__(self, part_id: int, rpc_timeout: float, telemetry: WorkerTelemetry, calls: DataCalls):
        self.part_id, self.calls = part_id, calls
        self.rpc_timeout = float(rpc_timeout)
        self.telemetry = telemetry
        self.cached: dict[str, RowCache] = {}   # per node type: this peer's rows replicated here (peer_cache)

    def held(self) -> None:
        return None

    def start_one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                      hop: int, seed_time: torch.Tensor | None = None) -> PeerCall[OneHop]:
        fut = self._call("one_hop", tuple(etype), gids, spec, fanout, seed, hop, seed_time)
        return PeerCall(self, fut, "one_hop", _one_hop)

    def start_gather(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None = None) -> PeerCall[Rows]:
        """The peer's rows of ``gids``, ``x`` sent in ``dtype`` when it is a floating transport dtype (the
        batch's ``feature_dtype``: half the bytes of fp32 with bf16/fp16)."""
        cache = self.cached.get(ntype)
        if cache is None:
            return PeerCall(self, self._gather_call(ntype, gids, dtype), "gather", _node_rows)
        hit, index = cache.find(gids)
        n = gids.numel()
        if bool(hit.all()):   # nothing to ask the peer
            return PeerCall(self, Pending.completed(None), "gather", lambda _: cache.assemble(n, hit, index, None))
        fut = self._gather_call(ntype, gids[~hit], dtype)
        return PeerCall(self, fut, "gather", lambda value: cache.assemble(n, hit, index, _node_rows(value)))

    def _gather_call(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None) -> Pending:
        args = (ntype, gids) if dtype is None else (ntype, gids, str(dtype).removeprefix("torch."))
        return self._call("gather", *args)

    def start_has_edges(self, pairs: torch.Tensor, kind: str, etype: EdgeType | None = None) -> PeerCall[torch.Tensor]:
        return PeerCall(self, self._call("has_edges", pairs, kind, etype), "has_edges", _same)

    def start_edge_attr(self, pairs: torch.Tensor, kind: str) -> PeerCall[torch.Tensor]:
        return PeerCall(self, self._call("edge_attr", pairs, kind), "edge_attr", _same)

    def start_to_global(self, orig_ids: torch.Tensor,
                        ntype: str | None = None) -> PeerCall[tuple[torch.Tensor, torch.Tensor]]:
        return PeerCall(self, self._call("to_global", orig_ids, ntype), "to_global", tuple)

    def _call(self, call: str, *args) -> Pending:
        """Worker function ``call(*args)`` on the peer; its latency and outcome are recorded when it completes."""
        tel, part = self.telemetry, self.part_id
        t0 = tel.clock()
        fut = self.calls.call(part, call, args, self.rpc_timeout)

        def done(f: Pending) -> None:
            try:
                f.result()
                ok = True
            except Exception:  # noqa: BLE001 -- the waiter raises it; here it is only counted
                ok = False
            tel.observe_remote(part, call, tel.clock() - t0, ok)

        fut.add_done_callback(done)
        return fut


class PeerCall(Generic[T]):
    """A request in flight to a peer worker (the handle :class:`RemoteSource` starts)."""

    def __init__(self, source: RemoteSource, fut: Pending, what: str, convert: Callable[[Any], T]):
        self.source, self.fut, self.what, self.convert = source, fut, what, convert

    def wait(self) -> T:
        """The peer's answer; :class:`PeerError` (counted as a ``remote`` error) when the call failed."""
        try:
            res = self.fut.result()
        except Exception as exc:  # RPC errors arrive as RuntimeError with the peer's message
            self.source.telemetry.count_error("remote")
            raise PeerError(f"{self.what} on peer worker part{self.source.part_id} failed: {first_line(exc)}") \
                from exc
        return self.convert(res)


def _one_hop(value) -> OneHop:
    if not isinstance(value, OneHop):
        raise PeerError(f"one_hop answered {type(value).__name__}, not OneHop: the peer runs another graphfeed version")
    return value


def _node_rows(value) -> NodeRows:
    if not isinstance(value, NodeRows):
        raise PeerError(f"gather answered {type(value).__name__}, not NodeRows: the peer runs another graphfeed "
                        f"version")
    return value


def _same(value):
    return value


