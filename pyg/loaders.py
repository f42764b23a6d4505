"""PyG's own loaders over graphfeed's stores: graphfeed's sampler picked, link inputs named, batches ahead.

``import graphfeed.pyg`` (which the stores need anyway) calls :func:`install`, which teaches three steps of
PyG's loaders about :class:`~graphfeed.pyg.stores.GraphfeedFeatureStore` /
:class:`~graphfeed.pyg.stores.GraphfeedGraphStore`; over any other data each step does what PyG does:

* ``NeighborLoader((fs, gs), num_neighbors=...)`` and ``LinkNeighborLoader`` without ``neighbor_sampler``
  get a :class:`~graphfeed.pyg.sampler.GraphfeedSampler` over the stores' client (PyG's ``NeighborSampler``
  would pull the whole topology into the trainer, and needs pyg-lib to sample it);
* a link loader's ``edge_label_index`` as a plain ``[2, E]`` tensor, or None (every edge), means the graph's
  one edge type, as over a ``Data``; on a typed graph it is a ``ValueError`` naming the
  ``(edge type, edge_label_index)`` form (PyG's own check is a bare ``AssertionError``);
* ``NodeLoader`` / ``LinkLoader`` (and their subclasses) with a ``GraphfeedSampler`` and ``num_workers=0``
  read their batch indices ``prefetch`` batches per server ahead and hand each to
  :meth:`GraphfeedSampler.start_ahead`, so the servers sample while the trainer steps, as they do for
  graphfeed's own loaders.
"""
from __future__ import annotations

import functools
from collections import deque
from typing import Any, Callable, Iterable, Iterator

from torch.utils.data.dataloader import _SingleProcessDataLoaderIter
from torch_geometric.loader import link_loader, link_neighbor_loader, neighbor_loader
from torch_geometric.loader.link_loader import LinkLoader
from torch_geometric.loader.node_loader import NodeLoader
from torch_geometric.sampler import NeighborSampler

from graphfeed.pyg.sampler import GraphfeedSampler
from graphfeed.pyg.stores import GraphfeedFeatureStore, GraphfeedGraphStore

_MARK = "_graphfeed_stores"   # set on what install() put in place, so a second install() changes nothing


def install() -> None:
    """Make PyG's loaders read graphfeed's stores as the module doc says (once; idempotent)."""
    if getattr(NodeLoader._get_iterator, _MARK, False):
        return
    neighbor_loader.NeighborSampler = StoreAwareNeighborSampler   # type: ignore[misc]
    link_neighbor_loader.NeighborSampler = StoreAwareNeighborSampler   # type: ignore[misc]
    link_loader.get_edge_label_index = _marked(_edge_label_index(link_loader.get_edge_label_index))
    NodeLoader._get_iterator = _marked(_reading_ahead(NodeLoader._get_iterator, "node_sampler"))  # type: ignore[method-assign]
    LinkLoader._get_iterator = _marked(_reading_ahead(LinkLoader._get_iterator, "link_sampler"))  # type: ignore[method-assign]


def _marked(fn: Callable) -> Callable:
    setattr(fn, _MARK, True)
    return fn


def graphfeed_stores(data: Any) -> tuple[GraphfeedFeatureStore, GraphfeedGraphStore] | None:
    """``data`` as graphfeed's ``(feature store, graph store)``, or None when it is other data."""
    if not (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], GraphfeedFeatureStore)
            and isinstance(data[1], GraphfeedGraphStore)):
        return None
    if data[0].client is not data[1].client:
        raise ValueError("the feature store and the graph store are over different clients: build both from "
                         "the same graphfeed.client.connect(...)")
    return data[0], data[1]


# ---- the sampler ----------------------------------------------------------------------------------------


class StoreAwareNeighborSampler(NeighborSampler):
    """PyG's ``NeighborSampler``, except over graphfeed's stores, where it is a :class:`GraphfeedSampler`
    (PyG's loaders construct it when no ``neighbor_sampler`` is passed)."""

    def __new__(cls, data, *args, **kwargs):
        stores = graphfeed_stores(data)
        if stores is not None:
            return sampler_for(stores, *args, **kwargs)
        return super().__new__(cls)


def sampler_for(stores: tuple[GraphfeedFeatureStore, GraphfeedGraphStore], num_neighbors,
                subgraph_type="directional", replace: bool = False, disjoint: bool = False,
                temporal_strategy: str = "uniform", time_attr: str | None = None, weight_attr: str | None = None,
                is_sorted: bool = False, share_memory: bool = False, directed: bool = True,
                sample_direction: str = "forward") -> GraphfeedSampler:
    """The :class:`GraphfeedSampler` for PyG's ``NeighborSampler`` arguments over graphfeed's stores
    (``is_sorted`` and ``share_memory`` mean nothing there; ``num_workers > 0`` is refused when sampling)."""
    if sample_direction != "forward":
        raise ValueError(f"sample_direction={sample_direction!r} is not offered over graphfeed's stores: pass "
                         f"neighbor_sampler=GraphfeedSampler(client, ..., direction='out') for out-edges")
    fs, _ = stores
    return GraphfeedSampler(fs.client, num_neighbors, feature_store=fs, replace=replace, disjoint=disjoint,
                            weight_attr=weight_attr, subgraph_type=subgraph_type if directed else "induced",
                            time_attr=time_attr, temporal_strategy=temporal_strategy)


# ---- link inputs ----------------------------------------------------------------------------------------


def _edge_label_index(pyg_rule: Callable) -> Callable:
    """PyG's ``get_edge_label_index``, with a plain tensor (or None) over graphfeed's stores meaning the graph's
    one edge type."""

    @functools.wraps(pyg_rule)
    def get_edge_label_index(data, edge_label_index):
        stores = graphfeed_stores(data)
        if stores is None or isinstance(edge_label_index, (list, tuple)):
            return pyg_rule(data, edge_label_index)
        edge_types = [tuple(e) for e in stores[1].client.edge_types]
        if len(edge_types) != 1:
            raise ValueError(f"edge_label_index names no edge type and the graph has {len(edge_types)}: pass "
                             f"edge_label_index=((src, rel, dst), edge_label_index), one of "
                             f"{', '.join(map(str, edge_types))}")
        if edge_label_index is None:   # every edge of the type, as PyG over a Data
            return pyg_rule(data, edge_types[0])
        return edge_types[0], edge_label_index

    return get_edge_label_index


# ---- batches ahead --------------------------------------------------------------------------------------


def _reading_ahead(get_iterator: Callable, sampler_attr: str) -> Callable:
    """A loader's ``_get_iterator`` that, for a :class:`GraphfeedSampler`, reads the batch indices ahead."""

    @functools.wraps(get_iterator)
    def _get_iterator(loader) -> Iterator:
        iterator = get_iterator(loader)
        sampler = getattr(loader, sampler_attr, None)
        base = getattr(iterator, "iterator", iterator)   # PyG's DataLoaderIterator wraps torch's
        if (isinstance(sampler, GraphfeedSampler) and sampler.prefetch > 0
                and isinstance(base, _SingleProcessDataLoaderIter) and base._auto_collation):
            base._sampler_iter = LookAhead(base._sampler_iter, _starter(loader, sampler, sampler_attr),
                                           sampler.prefetch * len(sampler.client.servers), lambda: sampler.drops)
        return iterator

    return _get_iterator


def _starter(loader, sampler: GraphfeedSampler, sampler_attr: str) -> Callable[[Any], bool]:
    """Start the batch of one index list of ``loader`` (the sampler input its ``collate_fn`` will build)."""
    if sampler_attr == "node_sampler":
        return lambda index: sampler.start_ahead(loader.input_data[index])
    return lambda index: sampler.start_ahead(loader.input_data[index], loader.neg_sampling)


class LookAhead:
    """A loader's batch indices, read up to ``depth`` batches beyond the one handed out; each is handed to
    ``start`` once, in order (a refused one is offered again before any later one), and every index not yet
    handed out again when ``drops()`` changes (the sampler dropped what was started: another call came
    between the loader's, or ``set_epoch``)."""

    def __init__(self, indices: Iterable, start: Callable[[Any], bool], depth: int, drops: Callable[[], int]):
        self._indices, self._start, self._depth, self._drops = iter(indices), start, depth, drops
        self._read: deque = deque()   # indices read, in order
        self._started = 0             # how many of them (from the front) were started
        self._seen_drops = drops()

    def __iter__(self) -> LookAhead:
        return self

    def __next__(self):
        while len(self._read) <= self._depth:
            try:
                self._read.append(next(self._indices))
            except StopIteration:
                break
        if self._drops() != self._seen_drops:
            self._seen_drops, self._started = self._drops(), 0
        while self._started < len(self._read) and self._start(self._read[self._started]):
            self._started += 1
        if not self._read:
            raise StopIteration
        self._started = max(0, self._started - 1)
        return self._read.popleft()
