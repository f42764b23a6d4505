"""The work budget of one batch: caps on its hops, sampled nodes, sampled edges and bytes.

Set by the daemon (``max_hops``, ``max_batch_nodes``, ``max_batch_edges``,
``max_batch_bytes`` in its config) and applied twice:

- **before the work**, when a session opens: :func:`estimate` bounds a batch from the loader's
  fanouts and batch size (and, unless ``disjoint``, the graph's size: a non-disjoint sample holds
  each node and edge at most once); a loader whose estimate exceeds a cap is refused then.
- **during sampling**: the multi-hop driver checks its running totals after every edge type of
  every hop (:meth:`WorkBudget.check_sample`), so a batch the estimate could not bound (fanout
  ``-1``, typed fanouts) stops within one hop of its cap instead of taking the worker's memory;
  a finished batch larger than ``max_batch_bytes`` is not buffered.

Exceeding a cap raises :class:`BudgetExceeded` (a ValueError) naming the cap, the setting and
the fix; the batch fails, the worker lives on.

**A loader's footprint** bounds the loader, not one batch (:func:`footprint`): its session worker
holds up to ``num_producers`` batches being produced, each about ``WORKING_SET`` times its bytes (the
sampler's ids and maps beside the rows being gathered), plus the finished batches its buffer keeps
(``buffer_batches`` / ``buffer_bytes``, soft by one batch).  :meth:`Footprint.check` refuses a loader
whose footprint exceeds the memory it may have (the daemon's ``loader_memory``, by default half of
what this process's cgroup or the host allows and the host has available), naming the estimate, the
limit, where the limit came from and the settings to change.
"""
from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

SETTINGS_HINT = "in the server config"


class BudgetExceeded(ValueError):
    """A batch (or a loader's estimate) exceeds one of the daemon's work caps; the message names the setting."""


@dataclass(frozen=True)
class BatchEstimate:
    """Upper bounds of one batch of a loader (see :func:`estimate`); ``None`` where unbounded (fanout -1)."""

    nodes: int | None
    edges: int | None
    bytes: int | None


_BATCH = threading.local()   # per producing thread: when its batch began (see timed_batch)


@contextmanager
def timed_batch(started: float | None = None) -> Iterator[None]:
    """The batch produced in this thread inside the block is held to ``WorkBudget.max_seconds`` by
    :meth:`WorkBudget.check_sample` (``started``: its ``time.monotonic()`` start, now by default)."""
    _BATCH.started = time.monotonic() if started is None else started
    try:
        yield
    finally:
        _BATCH.started = None


@dataclass(frozen=True)
class WorkBudget:
    """Caps of one batch (0 = no cap); ``max_seconds``: how long producing one may take (a fraction of
    ``rpc_timeout``: a pull waiting for it must get its error, not the data path's timeout)."""

    max_hops: int = 0
    max_nodes: int = 0
    max_edges: int = 0
    max_bytes: int = 0
    max_seconds: float = 0.0

    def check_hops(self, hops: int) -> None:
        if self.max_hops and hops > self.max_hops:
            raise BudgetExceeded(f"num_neighbors has {hops} hops, more than this server's max_hops={self.max_hops}: "
                                 f"use at most {self.max_hops} hops, or raise max_hops {SETTINGS_HINT}")

    def check_sample(self, nodes: int, edges: int, hop: int) -> None:
        """Raise once a batch being sampled holds more nodes or edges than allowed (``hop``: 0-based)."""
        for have, cap, what, setting in ((nodes, self.max_nodes, "nodes", "max_batch_nodes"),
                                         (edges, self.max_edges, "edges", "max_batch_edges")):
            if cap and have > cap:
                raise BudgetExceeded(f"the batch reached {have:,} sampled {what} at hop {hop + 1}, more than this "
                                     f"server's {setting}={cap:,}: use smaller fanouts, fewer hops or a smaller "
                                     f"batch_size, or raise {setting} {SETTINGS_HINT}")
        self._check_time(nodes, edges, hop)

    def _check_time(self, nodes: int, edges: int, hop: int) -> None:
        started = getattr(_BATCH, "started", None)
        if not self.max_seconds or started is None:
            return
        took = time.monotonic() - started
        if took > self.max_seconds:
            raise BudgetExceeded(f"the batch took {took:.1f} s up to hop {hop + 1} ({nodes:,} nodes and {edges:,} "
                                 f"edges sampled so far), more than the {self.max_seconds:g} s this server allows "
                                 f"(3/4 of its rpc_timeout, within which the trainer's pull must be answered): use "
                                 f"smaller fanouts, fewer hops or a smaller batch_size, or raise rpc_timeout "
                                 f"{SETTINGS_HINT} and connect(rpc_timeout=...) on the trainer")

    def check_bytes(self, nbytes: int) -> None:
        if self.max_bytes and nbytes > self.max_bytes:
            raise BudgetExceeded(f"the batch is {nbytes:,} bytes, more than this server's max_batch_bytes="
                                 f"{self.max_bytes:,}: use smaller fanouts, fewer hops, a smaller batch_size or "
                                 f"feature_dtype='bf16', or raise max_batch_bytes {SETTINGS_HINT}")

    def check_estimate(self, est: BatchEstimate) -> None:
        """Refuse a loader whose batches are bound to exceed a cap (its estimate is over it)."""
        for have, cap, what, setting in ((est.nodes, self.max_nodes, "nodes", "max_batch_nodes"),
                                         (est.edges, self.max_edges, "edges", "max_batch_edges"),
                                         (est.bytes, self.max_bytes, "bytes", "max_batch_bytes")):
            if cap and have is not None and have > cap:
                raise BudgetExceeded(f"a batch of this loader may sample up to {have:,} {what} (batch size x "
                                     f"fanouts per hop), more than this server's {setting}={cap:,}: use smaller "
                                     f"fanouts, fewer hops or a smaller batch_size, or raise {setting} "
                                     f"{SETTINGS_HINT}")


EDGE_BYTES = 24   # per sampled edge in a batch: edge_index (2 x int64) + e_id (int64)
NODE_BYTES = 16   # per sampled node besides its features: n_id + batch / label


def estimate(seeds: int, hop_fanouts: Sequence[int], *, disjoint: bool, num_nodes: int, num_edges: int,
             row_bytes: int) -> BatchEstimate:
    """Upper bounds of one batch from ``seeds`` seed nodes expanded by ``hop_fanouts`` (per hop; ``-1`` = all
    neighbours, for typed fanouts the largest of the hop's edge types).

    Each hop samples at most ``frontier x fanout`` edges and reaches at most as many new nodes.  A
    non-disjoint batch holds every node and edge of the graph at most once (``num_nodes`` /
    ``num_edges`` bound it); a disjoint one is ``seeds`` such samples.  ``row_bytes``: the feature
    bytes of one node.  A ``-1`` hop leaves the batch unbounded here (None): sampling enforces the caps.
    """
    nodes, edges = _expand(1 if disjoint else seeds, hop_fanouts)
    if nodes is None or edges is None:   # a hop takes every neighbour: only sampling can tell
        return BatchEstimate(None, None, None)
    if disjoint:   # every seed's own sample, each bounded by the graph
        nodes, edges = seeds * min(nodes, num_nodes), seeds * min(edges, num_edges)
    else:
        nodes, edges = min(nodes, num_nodes), min(edges, num_edges)
    return BatchEstimate(nodes, edges, nodes * (row_bytes + NODE_BYTES) + edges * EDGE_BYTES)


def _expand(seeds: int, hop_fanouts: Sequence[int]) -> tuple[int | None, int | None]:
    """Nodes and edges of ``seeds`` expanded hop by hop (None once a hop takes every neighbour)."""
    frontier, nodes, edges = seeds, seeds, 0
    for fanout in hop_fanouts:
        if fanout < 0:
            return None, None
        frontier *= fanout
        nodes += frontier
        edges += frontier
    return nodes, edges


WORKING_SET = 2   # a batch being produced holds about twice its bytes: sampler ids / maps and the gathered rows


def graph_bound(seeds: int, *, disjoint: bool, num_nodes: int, num_edges: int, row_bytes: int) -> int:
    """Bytes of a batch that holds the whole graph (every seed's whole graph when ``disjoint``): the bound
    of a batch whose fanouts the estimate cannot follow (``-1``)."""
    copies = seeds if disjoint else 1
    return copies * (num_nodes * (row_bytes + NODE_BYTES) + num_edges * EDGE_BYTES)


@dataclass(frozen=True)
class Footprint:
    """What one loader may hold in its session worker at once: ``producers`` batches being produced
    (``WORKING_SET`` x ``batch_bytes`` each) and ``buffered`` finished ones."""

    batch_bytes: int
    producers: int
    buffered: int
    bounded_by: str   # how ``batch_bytes`` was bounded: "batch estimate", "max_batch_bytes", ...

    @property
    def bytes(self) -> int:
        return self.batch_bytes * (self.producers * WORKING_SET + self.buffered)

    def describe(self) -> str:
        return (f"{self.batch_bytes:,} bytes per batch ({self.bounded_by}) x ({self.producers} producers x "
                f"{WORKING_SET} working set + {self.buffered} buffered)")

    def check(self, limit: int, source: str) -> None:
        """BudgetExceeded naming the footprint, the limit, its source and the settings to change."""
        if self.bytes <= limit:
            return
        raise BudgetExceeded(f"this loader may hold up to {self.bytes:,} bytes in its session worker "
                             f"({self.describe()}), more than the {limit:,} bytes a loader may use on this server "
                             f"({source}): use a smaller batch_size, smaller fanouts or fewer hops, or lower "
                             f"num_producers, buffer_bytes or buffer_batches {SETTINGS_HINT}, or raise "
                             f"loader_memory {SETTINGS_HINT}")


def footprint(est: BatchEstimate, whole_graph: int, *, max_bytes: int, producers: int, buffer_batches: int,
              buffer_bytes: int) -> Footprint:
    """The footprint of a loader whose batches are bounded by ``est`` (None fields: fanout ``-1``), by
    ``whole_graph`` (:func:`graph_bound`) and by the per-batch cap ``max_bytes`` (0 = none), the tightest
    that applies; its buffer keeps at most ``buffer_batches`` batches, or as many as ``buffer_bytes`` holds
    plus one (the byte cap is soft by one batch)."""
    bounds = [(whole_graph, "the whole graph")]
    if est.bytes is not None:
        bounds.append((est.bytes, "batch estimate: batch size x fanouts per hop"))
    if max_bytes:
        bounds.append((max_bytes, "max_batch_bytes"))
    batch, how = min(bounds)
    batch = max(1, batch)
    buffered = min(max(1, buffer_batches), max(1, math.ceil(buffer_bytes / batch)))
    return Footprint(batch, max(1, producers), buffered, how)
