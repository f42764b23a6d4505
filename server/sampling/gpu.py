"""Sampling on a GPU: one part's topology in device memory (or read through UVA), its features
behind a :class:`~graphfeed.cuda_ext.feature_cache.GpuFeatureCache`.

The multi-hop driver (:func:`graphfeed.server.sampling.neighbor.sample_typed`) is device
agnostic: its tensors follow the seeds' device, and :mod:`.dispatch` sends CUDA tensors to the
CUDA kernels (``one_hop``, ``relabel``).  So a GPU sample is the driver over topologies whose
arrays the GPU reads; with the same RNG it gives the CPU sample's nodes and edges, bit for bit
(the CUDA one-hop kernel draws with the same counter-based generator).

:class:`GpuSource` is the part source of a daemon with ``device: cuda[:N]`` (its session workers
sample every batch on the GPU: :func:`graphfeed.server.worker.peers.worker_graph`) and of
``graphfeed bench sample --device cuda``.  :class:`GpuPart` is the one-part homogeneous case the
single-process bench measured first.  What the GPU does not sample yet (weighted and temporal
hops: no CUDA kernel) is refused when a session opens (:func:`unsupported_on_gpu`).
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from graphfeed.core.columns import FEATURES
from graphfeed.core.spec import EdgeType, LoaderSpec, SamplingSpec
from graphfeed.server.partition.format.store import Partition, Topology
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.hot import hottest
from graphfeed.server.sampling.neighbor import sample_subgraph
from graphfeed.server.sampling.source import LocalSource, Ready, Rows, center_type, check_owned
from graphfeed.server.sampling.types import NodeRows, OneHop, SampledSubgraph

TOPOLOGY_PLACEMENTS = ("auto", "gpu", "uva")
TOPOLOGY_SHARE = 0.5      # "auto": the topology goes to GPU memory when it takes at most this share of the free memory
log = logging.getLogger("graphfeed.gpu")


def cuda_unavailable_reason() -> str | None:
    """Why GPU sampling cannot run here (None when it can)."""
    from graphfeed import cuda_ext

    if not torch.cuda.is_available():
        return "torch sees no GPU (torch.cuda.is_available() is False)"
    if cuda_ext.load_ops() is None:
        return f"the native op library is not loaded: {cuda_ext.load_error()}"
    if not cuda_ext.has_cuda_kernels():
        return ("the native op library has no CUDA kernels: rebuild it with a CUDA torch and the CUDA toolkit "
                "present (`python cuda_ext/build.py` or `graphfeed build-native --force`)")
    return None


class GpuPart:
    """A whole homogeneous graph (a one-part partition) on ``device`` for sampling and feature reads.

    ``cache_bytes`` bounds the feature rows kept in device memory: the rows of the highest-degree
    nodes (in the sampled direction) that fit; the other rows are read by the GPU from pinned host
    memory.  Labels and original ids are small and go to the device whole.
    """

    def __init__(self, part: Partition, spec: SamplingSpec, cache_bytes: int, device: str = "cuda"):
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"GPU sampling needs a GPU and graphfeed's CUDA kernels: {reason}")
        if part.meta.num_parts != 1 or not part.meta.is_homogeneous:
            raise ValueError("GPU sampling takes a one-part homogeneous partition (partition the graph with "
                             "--num-parts 1)")
        from graphfeed.cuda_ext.feature_cache import GpuFeatureCache

        self.device = torch.device(device)
        self.spec = spec
        topo = part.topology(spec.topology)
        self.topo = Topology(*(t.to(self.device) for t in (topo.indptr, topo.indices, topo.eid)))
        self.offset = part.nodes(part.ntype).start
        degree = (topo.indptr[1:] - topo.indptr[:-1]).to(torch.float64)
        x = part.x
        self.cache = None if x is None else GpuFeatureCache.from_hotness(x, degree, cache_bytes, self.device)
        self.y = None if part.y is None else part.y.to(self.device)
        self.orig_id = part.orig_id.to(self.device)

    @property
    def cached_rows(self) -> int:
        return 0 if self.cache is None else self.cache.num_cached

    def sample(self, seeds: torch.Tensor, seed: int) -> SampledSubgraph:
        """The driver's multi-hop sample of ``seeds`` (global ids; moved to the device) with batch seed ``seed``."""
        topo, offset, replace = self.topo, self.offset, self.spec.hop_replace

        def hop(gids: torch.Tensor, fanout: int, rng_hop: int) -> OneHop:
            return dispatch.one_hop(topo, gids - offset, gids, fanout, replace, seed, rng_hop)

        return sample_subgraph(seeds.to(self.device), self.spec, hop)

    def gather(self, gids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """``(x, y, original ids)`` of nodes ``gids`` (device tensors)."""
        rows = gids.to(self.device) - self.offset
        x = None if self.cache is None else self.cache.gather(rows)
        y = None if self.y is None else self.y.index_select(0, rows)
        return x, y, self.orig_id.index_select(0, rows)


def check_device(device: str) -> torch.device:
    """``device`` (``"cuda"`` or ``"cuda:N"``) as a torch device; RuntimeError with one line saying why it cannot
    sample here (no GPU, no such GPU, no CUDA kernels)."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"GPU sampling needs a GPU and graphfeed's CUDA kernels (device {device}): {reason}")
    dev = torch.device(device)
    index = 0 if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise RuntimeError(f"device {device} cannot sample here: torch sees {torch.cuda.device_count()} GPU(s) "
                           f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return torch.device("cuda", index)


def unsupported_on_gpu(spec: LoaderSpec) -> str | None:
    """The loader option a GPU worker cannot sample yet, named with the fix (None: every option is on the GPU)."""
    sampling = spec.sampling
    if sampling.weight_attr is not None:
        return (f"weight_attr={sampling.weight_attr!r} (weighted sampling) is not on the GPU yet: open this loader "
                f"on a daemon with device: cpu")
    if sampling.time_attr is not None:
        return (f"time_attr={sampling.time_attr!r} (temporal sampling) is not on the GPU yet: open this loader on a "
                f"daemon with device: cpu")
    return None


def topology_bytes(part: Partition) -> int:
    """Bytes of every topology (every edge type, every stored kind) of ``part``."""
    total = 0
    for kind in part.meta.topologies:
        for etype in part.edge_types:
            topo = part.edges(etype).topology(kind)
            total += sum(t.numel() * 8 for t in (topo.indptr, topo.indices, topo.eid))
    return total


def choose_placement(part: Partition, device: torch.device, placement: str = "auto") -> str:
    """Where ``part``'s topology lives on ``device``: ``"gpu"`` (device memory) or ``"uva"`` (pinned host memory the
    GPU reads).  ``"auto"`` takes device memory when the topology needs at most :data:`TOPOLOGY_SHARE` of
    what is free."""
    if placement not in TOPOLOGY_PLACEMENTS:
        raise ValueError(f"gpu_topology must be one of {', '.join(TOPOLOGY_PLACEMENTS)}, got {placement!r}")
    if placement != "auto":
        return placement
    free, _ = torch.cuda.mem_get_info(device)
    return "gpu" if topology_bytes(part) <= TOPOLOGY_SHARE * free else "uva"


class _DeviceView:
    """``__cuda_array_interface__`` of a pinned host tensor: its device-mapped address (unified virtual
    addressing gives pinned memory the same address on the GPU), so torch makes a CUDA tensor of it, no copy."""

    def __init__(self, host: torch.Tensor):
        self.__cuda_array_interface__ = {"shape": tuple(host.shape), "typestr": "<i8",
                                         "data": (host.data_ptr(), False), "strides": None, "version": 2}


def uva_tensor(t: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pinned host copy of t, a CUDA tensor reading it through UVA)``; keep the first alive as long as the second."""
    host = t.to(torch.int64).contiguous().pin_memory()
    with torch.cuda.device(device):
        return host, torch.as_tensor(_DeviceView(host), device=device)


class GpuSource(LocalSource):
    """Part ``part`` sampled and gathered on ``device`` (a CUDA device): a session worker's own part in a
    daemon with ``device: cuda``, or every part of ``bench sample --device cuda``.

    Topologies (every edge type of the stored kinds) live in device memory or, with ``placement="uva"``,
    in pinned host memory the kernels read directly (:func:`choose_placement` picks).  Each node type's
    feature rows are behind a :class:`GpuFeatureCache` holding its highest in-degree rows within its share
    of ``cache_bytes`` (shares by the types' feature bytes); ``y`` and original ids go to the device whole.
    Results come back on the device of the ids asked with: a peer's request (host ids) is answered with
    host tensors, sampled on this GPU.  Weighted and temporal hops run on the CPU (no CUDA kernel; a GPU
    daemon refuses such sessions, so only a CPU peer's requests can ask for them).
    """

    def __init__(self, part: Partition, device: str | torch.device = "cuda", *, cache_bytes: int = 0,
                 placement: str = "auto"):
        super().__init__(part)
        self.device = check_device(str(device))
        self.placement = choose_placement(part, self.device, placement)
        self._pinned: list[torch.Tensor] = []
        self._topos: dict[tuple[EdgeType, str], Topology] = {}
        for kind in part.meta.topologies:
            for etype in part.edge_types:
                self._topos[(etype, kind)] = self._place(part.edges(etype).topology(kind))
        self.caches = self._make_caches(cache_bytes)
        # every stored row column but the features (small: whole on the device; x is behind the cache)
        self._columns = {t: {name: _on_device(part.nodes(t).column(column), self.device)
                             for name, column in NodeRows.COLUMNS.items() if name != FEATURES}
                         for t in part.node_types}
        self.hits = 0     # rows read from the device cache (hits) and in all (reads), for the hit rate
        self.reads = 0

    def _place(self, topo: Topology) -> Topology:
        if self.placement == "gpu":
            return Topology(*(t.to(self.device, torch.int64) for t in (topo.indptr, topo.indices, topo.eid)))
        arrays = []
        for t in (topo.indptr, topo.indices, topo.eid):
            host, dev = uva_tensor(t, self.device)
            self._pinned.append(host)
            arrays.append(dev)
        return Topology(*arrays)

    def _make_caches(self, cache_bytes: int) -> dict:
        from graphfeed.cuda_ext.feature_cache import GpuFeatureCache

        stores = {t: self.part.nodes(t) for t in self.part.node_types}
        sizes = {t: s.x.numel() * s.x.element_size() for t, s in stores.items() if s.x is not None}
        total = max(1, sum(sizes.values()))
        caches = {}
        for t, size in sizes.items():
            x = stores[t].x
            assert x is not None
            row_bytes = max(1, x[0].numel() * x.element_size()) if x.size(0) else 1
            rows = min(x.size(0), int(cache_bytes * size / total) // row_bytes)
            caches[t] = GpuFeatureCache(x, hottest(self.part, t)[:rows], self.device)
        return caches

    @property
    def cached_rows(self) -> int:
        return sum(c.num_cached for c in self.caches.values())

    # ---- sampling and reads on the GPU --------------------------------------------------------------

    def one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                hop: int, seed_time: torch.Tensor | None = None) -> OneHop:
        if spec.weighted or spec.temporal:   # no CUDA kernel: the CPU's (only a CPU peer asks for these)
            res = super().one_hop(etype, gids.cpu(), spec, fanout, seed, hop,
                                  None if seed_time is None else seed_time.cpu())
            return _moved(res, gids.device)
        topo = self._topos[(etype, spec.topology)]
        start = self.part.nodes(center_type(etype, spec.direction)).start
        g = gids.to(self.device, torch.int64)
        return _moved(dispatch.one_hop(topo, g - start, g, fanout, spec.hop_replace, seed, hop), gids.device)

    def gather(self, ntype: str, gids: torch.Tensor) -> Rows:
        """The :class:`NodeRows` of ``gids`` (checked to be the part's), on ``gids``' device."""
        store = self.part.nodes(ntype)
        if gids.device.type == "cpu":    # a peer's request: ids checked here
            check_owned(store, gids)
        local = gids.to(self.device, torch.int64) - store.start
        cache = self.caches.get(ntype)
        rows: dict[str, Any] = {name: None if c is None else c.index_select(0, local)
                                for name, c in self._columns[ntype].items()}
        rows[FEATURES] = None if cache is None else cache.gather(local)
        if cache is not None:
            self.reads += local.numel()
            self.hits += int((cache.slot.index_select(0, local) >= 0).sum()) if cache.num_cached else 0
        on = gids.device   # answered where the ids are (a peer's request: the host)
        moved: dict[str, Any] = {name: None if r is None else r.to(on) for name, r in rows.items()}
        return NodeRows(**moved)

    # membership, edge features and id lookups read the host arrays (link loaders' negatives, edge features:
    # not the sampling path); asked with device ids, they answer on that device

    def has_edges(self, pairs: torch.Tensor, kind: str, etype: EdgeType | None = None) -> torch.Tensor:
        pairs = torch.as_tensor(pairs)
        return super().has_edges(pairs.cpu(), kind, etype).to(pairs.device)

    def edge_attr(self, pairs: torch.Tensor, kind: str) -> torch.Tensor:
        pairs = torch.as_tensor(pairs)
        return super().edge_attr(pairs.cpu(), kind).to(pairs.device)

    def start_to_global(self, orig_ids: torch.Tensor,
                        ntype: str | None = None) -> Ready[tuple[torch.Tensor, torch.Tensor]]:
        orig_ids = torch.as_tensor(orig_ids)
        mask, gids = super().start_to_global(orig_ids.cpu(), ntype).wait()
        return Ready((mask.to(orig_ids.device), gids.to(orig_ids.device)))

    def start_gather(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None = None) -> Ready[Rows]:
        return Ready(self.gather(ntype, gids))

    def gather_to(self, ntype: str, gids: torch.Tensor, out: Rows, pos: torch.Tensor) -> None:
        rows = self.gather(ntype, gids.to(self.device))
        for name, dst in out.items():
            src = getattr(rows, name)
            if dst is not None and src is not None:
                dispatch.gather_rows_to(src, None, dst, pos)

    def describe(self) -> str:
        """One line for the log and ``graphfeed status``: the device, where the topology lives, the cache."""
        free, total = torch.cuda.mem_get_info(self.device)
        return (f"{self.device} ({torch.cuda.get_device_name(self.device)}) topology={self.placement} "
                f"cached_rows={self.cached_rows} gpu_free={free >> 20}MiB/{total >> 20}MiB")


def _on_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)


def _moved(res: OneHop, device: torch.device) -> OneHop:
    if res.counts.device == device:
        return res
    return OneHop(res.counts.to(device), res.neighbors.to(device), res.eids.to(device))
