"""Opening a partition folder: memory-mapped arrays of one part, or of all of them.

A part is read per type: ``part.nodes(ntype)`` (a :class:`NodeStore`) and ``part.edges(etype)``
(an :class:`EdgeStore`). ``Partition``'s own ``x``, ``y``, ``orig_id``, ``split``, ``book``,
``start``/``stop``, ``to_global`` and ``topology`` are shortcuts to one node type (``ntype``,
by default the label type) and one edge type (``etype``, see :func:`default_edge_type`): for a
homogeneous graph, the graph.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import torch

from graphfeed.core.columns import NODE_COLUMNS, TIME, NodeColumn
from graphfeed.core.constants import SPLITS
from graphfeed.core.spec import (
    QUANTIZED_DTYPE,
    LinkInput,
    LoaderSpec,
    NodeInput,
    SamplingSpec,
    SeedInput,
    check_link_ids,
)
from graphfeed.server.partition.format.book import RangePartitionBook
from graphfeed.server.partition.format.hard_negatives import HardNegatives
from graphfeed.server.partition.format.layout import (
    DEFAULT_EDGE_TYPE,
    PartitionFormatError,
    PartitionMeta,
    PartitionPaths,
    edge_type_dirname,
    load_array,
    of_node_type,
    read_meta,
)
from graphfeed.server.partition.format.weights import EdgeWeights

EdgeType = tuple[str, str, str]


@dataclass(frozen=True)
class Topology:
    """Compressed adjacency of one part's owned nodes (CSC: in-edges, CSR: out-edges).

    ``indptr[i]:indptr[i+1]`` are the edges of the part's i-th owned node; ``indices``
    holds the other endpoint's global id and ``eid`` the original edge id.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    eid: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    def centers(self, start: int = 0) -> torch.Tensor:
        """The owned node of each edge, in ``indices``' order, as ``start`` + its local id (int64)."""
        return torch.repeat_interleave(torch.arange(self.num_nodes, dtype=torch.int64),
                                       self.indptr.to(torch.int64).diff()) + start


def _tensor(path) -> torch.Tensor:
    return torch.from_numpy(load_array(path))


class NodeStore:
    """One node type of one part: the nodes with global ids ``[start, stop)`` of that type."""

    def __init__(self, paths: PartitionPaths, meta: PartitionMeta, part_id: int, ntype: str):
        self.paths, self.meta, self.part_id, self.ntype = paths, meta, part_id, ntype
        self.book = RangePartitionBook(meta.node_ranges[ntype])
        self.start, self.stop = self.book.range(part_id)

    @property
    def num_nodes(self) -> int:
        return self.stop - self.start

    @property
    def num_classes(self) -> int:
        return self.meta.classes_of(self.ntype)

    def column(self, name: str) -> torch.Tensor | None:
        """Stored column ``name`` (:data:`graphfeed.core.columns.NODE_COLUMNS`) of these nodes, memory-mapped, in
        the column's dtype; None when this type has none.  Each column is opened once."""
        columns = self.__dict__.setdefault("_columns", {})
        if name not in columns:
            columns[name] = self._open(NODE_COLUMNS[name])
        return columns[name]

    def _open(self, column: NodeColumn) -> torch.Tensor | None:
        if column.listed and column.name not in self.meta.features.get(self.ntype, {}):
            return None
        t = _tensor(self.paths.node_file(self.part_id, column.name, self.ntype))
        return t if column.dtype is None else t.to(getattr(torch, column.dtype))

    @property
    def x(self) -> torch.Tensor | None:
        """Features [num_nodes, F], or None for a featureless type."""
        return self.column("x")

    @property
    def y(self) -> torch.Tensor | None:
        """Labels [num_nodes, ...], or None for an unlabelled type."""
        return self.column("y")

    @property
    def orig_id(self) -> torch.Tensor:
        ids = self.column("orig_id")
        assert ids is not None   # every type stores its nodes' original ids
        return ids

    @cached_property
    def quant_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(scale, offset)`` float32 [F] of ``x``'s int8 quantization (:mod:`.quantize`), or None when the
        partition has none (a featureless type, or a partition written before they were stored)."""
        files = [self.paths.quant_file(self.part_id, name, self.ntype) for name in ("scale", "offset")]
        if self.x is None or not all(f.is_file() for f in files):
            return None
        scale, offset = (_tensor(f).to(torch.float32) for f in files)
        return scale, offset

    @property
    def time(self) -> torch.Tensor | None:
        """int64 node timestamps [num_nodes], or None when the type has none."""
        return self.column(TIME)

    def split(self, name: str) -> torch.Tensor:
        """Global ids of this part's nodes in split ``name`` (sorted); only the label type has splits."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}: use one of {', '.join(SPLITS)} or pass a tensor of node ids")
        if self.ntype != self.meta.label_type:
            raise ValueError(f"node type {self.ntype!r} has no splits (they are on {self.meta.label_type!r}); "
                             f"use the {self.meta.label_type!r} splits or pass a tensor of {self.ntype!r} ids")
        return _tensor(self.paths.split_file(self.part_id, name, self.ntype))

    @cached_property
    def _orig_lookup(self) -> tuple[torch.Tensor, torch.Tensor]:
        sorted_orig, perm = torch.sort(self.orig_id)
        return sorted_orig, perm

    def to_global(self, orig_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, gids)``: which of ``orig_ids`` this part owns, and their global ids."""
        sorted_orig, perm = self._orig_lookup
        if sorted_orig.numel() == 0:
            return torch.zeros(orig_ids.numel(), dtype=torch.bool), torch.empty(0, dtype=torch.int64)
        pos = torch.searchsorted(sorted_orig, orig_ids).clamp(max=sorted_orig.numel() - 1)
        mask = sorted_orig[pos] == orig_ids
        return mask, perm[pos[mask]] + self.start

    def input_nodes(self, node_input: NodeInput) -> torch.Tensor:
        """Global ids of the seeds ``node_input`` names that this part owns, in input order
        (a split's stored order; ``ids``' given order; every node in id order)."""
        if node_input.split is not None:
            return self.split(node_input.split).clone()
        if node_input.ids is None:
            return torch.arange(self.start, self.stop)
        ids = node_input.ids
        n = self.book.num_nodes
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise ValueError(f"node ids out of range: original {self.ntype!r} node ids are 0..{n - 1}"
                             if not self.meta.is_homogeneous else
                             f"node ids out of range: original node ids are 0..{n - 1}")
        return self.to_global(ids)[1]


class EdgeStore:
    """One edge type ``(src, rel, dst)`` of one part: CSC over its owned ``dst`` nodes (global ``src`` ids),
    CSR over its owned ``src`` nodes (global ``dst`` ids)."""

    def __init__(self, paths: PartitionPaths, meta: PartitionMeta, part_id: int, etype: EdgeType,
                 owned: dict[str, int]):
        self.paths, self.meta, self.part_id, self.etype = paths, meta, part_id, etype
        self._owned = {"csc": owned[etype[2]], "csr": owned[etype[0]]}  # nodes each topology covers

    @property
    def typed_label(self) -> str:
        """``" of edge type (src, rel, dst)"`` on a typed graph (for messages), ``""`` on a homogeneous one."""
        return "" if self.meta.is_homogeneous else f" of edge type {self.etype}"

    @property
    def num_edges(self) -> int:
        """Edges of this type in the whole graph."""
        return int(self.meta.num_edges[edge_type_dirname(self.etype)])

    @cached_property
    def hard_negatives(self) -> HardNegatives | None:
        """This part's stored hard negatives (:mod:`.hard_negatives`), or None when there are none."""
        num_dst = RangePartitionBook(self.meta.node_ranges[self.etype[2]]).num_nodes
        return HardNegatives.load(self.paths, self.part_id, self.etype, num_dst)

    def topology(self, kind: str = "csc") -> Topology:
        if kind not in self.meta.topologies:
            raise PartitionFormatError(
                f"{self.paths.root} was partitioned without {kind.upper()} topology "
                f"(needed for {'out' if kind == 'csr' else 'in'}-edge sampling); "
                f"re-run `graphfeed partition --topology {kind}` or `--topology both`")
        return self._topologies[kind]

    @cached_property
    def _topologies(self) -> dict[str, Topology]:
        out = {}
        for kind in self.meta.topologies:
            indptr, indices, eid = (_tensor(self.paths.edge_file(self.part_id, kind, name, self.etype))
                                    for name in ("indptr", "indices", "eid"))
            topo = Topology(indptr, indices, eid)
            if topo.num_nodes != self._owned[kind]:
                raise PartitionFormatError(
                    f"{self.paths.edge_dir(self.part_id, self.etype)}: {kind} indptr covers {topo.num_nodes} nodes, "
                    f"the part owns {self._owned[kind]}; the folder is corrupt, re-run `graphfeed partition`")
            out[kind] = topo
        return out

    def edge_attr(self, kind: str = "csc") -> torch.Tensor | None:
        """Edge features aligned with ``topology(kind).indices``, or None when the type has none."""
        if edge_type_dirname(self.etype) not in self.meta.edge_features:
            return None
        self.topology(kind)  # the same checks
        return _tensor(self.paths.edge_file(self.part_id, kind, "edge_attr", self.etype))

    def edge_weight(self, kind: str = "csc") -> torch.Tensor | None:
        """Sampling weights (the input's ``edge_weight``) aligned with ``topology(kind).indices``, or None."""
        if edge_type_dirname(self.etype) not in self.meta.edge_weights:
            return None
        self.topology(kind)  # the same checks
        return _tensor(self.paths.edge_file(self.part_id, kind, "edge_weight", self.etype))

    def times(self, kind: str, time_attr: str) -> torch.Tensor:
        """int64 timestamps aligned with ``topology(kind).indices``: each edge's own (``"edge_time"``) or its
        neighbor's node time (``"time"``); ValueError naming the fix when the partition stores none."""
        stored = self.stored_times()
        if time_attr not in stored:
            have = f"it stores {', '.join(map(repr, stored))}" if stored else "it stores no timestamps"
            if self.meta.is_homogeneous:
                raise ValueError(f"time_attr={time_attr!r} names no stored time column ({have}): partition the "
                                 f"graph with node_time.npy (Data.time) for time_attr='time' or edge_time.npy "
                                 f"(Data.edge_time) for time_attr='edge_time'")
            src, dst, name = self.etype[0], self.etype[2], edge_type_dirname(self.etype)
            fix = (f"{name}/edge_time.npy (data[{self.etype}].edge_time)" if time_attr == "edge_time" else
                   f"node_time.npy in {src}/ and {dst}/ (data[{src!r}].time, data[{dst!r}].time)")
            edges = "" if time_attr == "edge_time" else \
                f"; times the edges carry are edge times: store them as data[{self.etype}].edge_time and pass " \
                f"time_attr='edge_time'"
            raise ValueError(f"time_attr={time_attr!r} names no stored time column{self.typed_label} ({have}): "
                             f"partition the graph with {fix}, or give this edge type fanout 0{edges}")
        self.topology(kind)  # the same checks
        name = "edge_time" if time_attr == "edge_time" else "nbr_time"
        cache = self.__dict__.setdefault("_times", {})
        if (kind, name) not in cache:
            cache[(kind, name)] = _tensor(self.paths.edge_file(self.part_id, kind, name, self.etype)).to(torch.int64)
        return cache[(kind, name)]

    def stored_times(self) -> list[str]:
        """The ``time_attr`` values this edge type can serve."""
        features = self.meta.features
        out = ["time"] if all("time" in features.get(t, {}) for t in (self.etype[0], self.etype[2])) else []
        return out + (["edge_time"] if edge_type_dirname(self.etype) in self.meta.edge_times else [])


def default_edge_type(meta: PartitionMeta, ntype: str) -> EdgeType:
    """The edge type ``Partition.topology`` reads: the homogeneous one, else the first whose destination is
    ``ntype``, else the first one."""
    etypes = meta.edge_type_tuples()
    if DEFAULT_EDGE_TYPE in etypes or not etypes:
        return DEFAULT_EDGE_TYPE
    return next((e for e in etypes if e[2] == ntype), etypes[0])


class Partition:
    """One part of a partitioned graph, memory-mapped (nothing is read until used)."""

    def __init__(self, root: str | os.PathLike, part_id: int, meta: PartitionMeta | None = None,
                 ntype: str | None = None, etype: EdgeType | None = None):
        self.paths = PartitionPaths(root)
        self.meta = meta if meta is not None else read_meta(root)
        if not 0 <= part_id < self.meta.num_parts:
            raise PartitionFormatError(
                f"part {part_id} does not exist: {root} has parts 0..{self.meta.num_parts - 1}")
        self.part_id = part_id
        self._nodes = {t: NodeStore(self.paths, self.meta, part_id, t) for t in self.meta.node_types}
        owned = {t: store.num_nodes for t, store in self._nodes.items()}
        self._edges = {e: EdgeStore(self.paths, self.meta, part_id, e, owned) for e in self.meta.edge_type_tuples()}
        self.ntype = ntype if ntype is not None else self.meta.label_type
        self.etype: EdgeType = (etype[0], etype[1], etype[2]) if etype is not None else \
            default_edge_type(self.meta, self.ntype)
        node = self.nodes(self.ntype)
        self.book, self.start, self.stop = node.book, node.start, node.stop
        self._weights = {e: EdgeWeights(store) for e, store in self._edges.items()}
        self.weights = self._weights[self.etype]   # the default edge type's (a homogeneous graph's)

    # ---- the typed API

    @property
    def node_types(self) -> list[str]:
        return list(self.meta.node_types)

    @property
    def edge_types(self) -> list[EdgeType]:
        return self.meta.edge_type_tuples()

    @property
    def label_type(self) -> str:
        return self.meta.label_type

    def nodes(self, ntype: str) -> NodeStore:
        return of_node_type(self._nodes, ntype)

    def edges(self, etype: EdgeType) -> EdgeStore:
        store = self._edges.get((etype[0], etype[1], etype[2])) if len(etype) == 3 else None
        if store is None:
            raise ValueError(f"unknown edge type {tuple(etype)!r}: the graph has edge types "
                             f"{', '.join(map(repr, self._edges))}; use one of them")
        return store

    def input_nodes(self, node_input: SeedInput) -> torch.Tensor:
        """Global ids (of ``node_input``'s node type; None = the label type) of the seeds ``node_input``
        names that this part owns, in input order (a split's stored order; ``ids``' given order; every
        node in id order).  For a :class:`LinkInput`: the positions (in ``edge_label_index``, ascending)
        of the seed edges whose source this part owns; ValueError for ids outside the graph."""
        if isinstance(node_input, LinkInput):
            return self.input_edges(node_input)
        ntype = getattr(node_input, "node_type", None)
        return self.nodes(ntype if ntype is not None else self.label_type).input_nodes(node_input)

    def input_positions(self, node_input: SeedInput) -> torch.Tensor | None:
        """Positions in ``node_input.ids`` of the seeds :meth:`input_nodes` returns (same order), or None
        for a split or every node (whose positions follow from the parts' counts:
        :func:`graphfeed.core.epoch.input_positions`)."""
        if isinstance(node_input, LinkInput):   # a link loader's seeds are already positions
            return self.input_edges(node_input)
        if node_input.ids is None:
            return None
        ntype = node_input.type_or(self.label_type)
        mask, _ = self.nodes(ntype).to_global(node_input.ids)
        return mask.nonzero().view(-1)

    def edge_weights(self, etype: EdgeType, kind: str, weight_attr: str) -> torch.Tensor:
        """Checked weights aligned with edge type ``etype``'s ``kind`` topology (:meth:`.weights.EdgeWeights.get`)."""
        self.edges(etype)   # ValueError naming the graph's edge types
        return self._weights[(etype[0], etype[1], etype[2])].get(kind, weight_attr)

    def edge_times(self, etype: EdgeType, kind: str, time_attr: str) -> torch.Tensor:
        """Timestamps aligned with edge type ``etype``'s ``kind`` topology (:meth:`EdgeStore.times`)."""
        return self.edges(etype).times(kind, time_attr)

    def check_loader(self, spec: LoaderSpec) -> None:
        """:meth:`check_sampling` of ``spec``, and what its other options need of this part: int8 feature
        scales for ``feature_dtype="int8"``, stored hard negatives for ``num_hard_negatives``.  ValueError
        (one line naming the fix) otherwise."""
        self.check_sampling(spec.sampling, spec.input)
        if spec.feature_dtype == QUANTIZED_DTYPE:
            for ntype in self.node_types:
                store = self.nodes(ntype)
                if store.x is not None and store.x.is_floating_point() and store.quant_scales is None:
                    raise ValueError(f"feature_dtype='int8' needs the per-column scales stored at partition time, "
                                     f"and this partition (written by an older graphfeed) has none: run `graphfeed "
                                     f"quantize {self.paths.root}` (or re-run graphfeed partition)")
        link = spec.input if isinstance(spec.input, LinkInput) else None
        neg = None if link is None else link.neg
        if link is not None and neg is not None and neg.num_hard:
            etype = link.edge_type or self.etype
            if self.edges(etype).hard_negatives is None:
                where = "hard_neg_dst.npy beside edge_index.npy" if self.meta.is_homogeneous else \
                    f"{edge_type_dirname(etype)}/hard_neg_dst.npy"
                raise ValueError(f"num_hard_negatives={neg.num_hard} needs hard negatives stored with the partition, "
                                 f"and it has none{self.edges(etype).typed_label}: partition the graph with {where} "
                                 f"([E, k] destination ids, -1 padding), or leave num_hard_negatives out")

    def check_sampling(self, sampling: SamplingSpec, seeds: SeedInput | None = None) -> None:
        """ValueError (naming the argument and the fix) unless this part can serve ``sampling``'s
        options on every edge type it samples (a non-zero fanout at some hop): for ``weight_attr``, valid
        weights (:class:`EdgeWeights`); for ``time_attr``, a stored time column and, for node ``seeds``
        without ``input_time``, stored node times of their type.  On a typed graph the message names the
        edge type that lacks the column."""
        if not sampling.weighted and not sampling.temporal:
            return
        sampled = [e for e, hops in sampling.fanouts_for(self.edge_types).items() if any(int(k) for k in hops)]
        for etype in sampled:
            if sampling.time_attr is not None:
                self.edge_times(etype, sampling.topology, sampling.time_attr)
            if sampling.weight_attr is not None:
                self.edge_weights(etype, sampling.topology, sampling.weight_attr)
        if sampling.time_attr is not None and isinstance(seeds, NodeInput) and seeds.time is None:
            ntype = seeds.type_or(self.label_type)
            if self.nodes(ntype).time is None:
                where = "node_time.npy (Data.time)" if self.meta.is_homogeneous else \
                    f"{ntype}/node_time.npy (data[{ntype!r}].time)"
                raise ValueError(f"time_attr={sampling.time_attr!r} needs the seeds' times: pass input_time (one "
                                 f"per input node id), or partition the graph with {where}")

    def input_edges(self, link: LinkInput) -> torch.Tensor:
        """Positions of the seed edges of ``link`` whose source node this part owns (ascending); ValueError
        for ids outside the graph, or typed seed edges without their edge type.  For a link split: the
        part's stored seed edges, at positions after every earlier part's (the parts' lists one after
        another, as a node split's)."""
        if link.split is not None or link.every_edge:
            return self.stored_link_seeds(link)[0]
        check_link_types(self.meta, link)
        check_link_ids(link, lambda t: self.nodes(t or self.label_type).book.num_nodes)
        assert link.index is not None   # a LinkInput has a split or an index
        mask, _ = self.nodes(link.type_or(self.label_type)).to_global(link.index[0])
        return mask.nonzero().view(-1)

    def link_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(positions, src, dst)`` of this part's seed edges of link split ``name``: their positions in
        the split (after every earlier part's) and global endpoint ids.  ValueError naming the fix
        (``graphfeed partition --link-split``) when the partition has no such split."""
        sizes = self.meta.link_splits.get(name, {}).get("sizes")
        if sizes is None:
            have = ", ".join(self.meta.link_split_sizes()) or "none"
            raise ValueError(f"edge_label_index={name!r}: the partition has no link split {name!r} (it has {have}); "
                             f"re-partition with `graphfeed partition --link-split val=0.05,test=0.10` or pass "
                             f"edge_label_index as a [2, E] tensor")
        start = int(sum(sizes[:self.part_id]))
        etype = self.meta.link_edge_type() or DEFAULT_EDGE_TYPE
        src, dst = (_tensor(self.paths.link_split_file(self.part_id, name, end, etype)) for end in ("src", "dst"))
        return torch.arange(start, start + int(sizes[self.part_id])), src, dst

    def every_edge(self, etype: EdgeType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(positions, src, dst)`` of this part's edges of type ``etype`` whose source it owns: their positions
        in the type's input ``edge_index`` (ascending) and global endpoint ids -- a link loader's seed edges for
        ``edge_label_index=etype``.  Read from this part's out-edges (CSR) or, in a partition of in-edges only,
        from every part's in-edges (CSC) in this folder; ValueError naming the fix when neither can be read."""
        edges = self.edges(etype)
        check_every_edge(self.meta, edges.etype, self.paths)
        if "csr" in self.meta.topologies:
            topo = edges.topology("csr")
            eid, src, dst = topo.eid.to(torch.int64), topo.centers(self.nodes(edges.etype[0]).start), topo.indices
        else:
            eid, src, dst = self._owned_sources_of_in_edges(edges.etype)
        order = torch.argsort(eid, stable=True)
        return eid[order], src[order], dst[order].to(torch.int64)

    def _owned_sources_of_in_edges(self, etype: EdgeType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(eid, src, dst)`` of every part's in-edges of ``etype`` whose source this part owns (one pass over
        each part's CSC files, memory-mapped)."""
        src_nodes, dst_book = self.nodes(etype[0]), RangePartitionBook(self.meta.node_ranges[etype[2]])
        pieces = []
        for k in range(self.meta.num_parts):
            topo = Topology(*(_tensor(self.paths.edge_file(k, "csc", name, etype))
                              for name in ("indptr", "indices", "eid")))
            indices = topo.indices.to(torch.int64)
            mine = (indices >= src_nodes.start) & (indices < src_nodes.stop)
            pieces.append((topo.eid.to(torch.int64)[mine], indices[mine], topo.centers(dst_book.range(k)[0])[mine]))
        eid, src, dst = (torch.cat(column) for column in zip(*pieces, strict=True))
        return eid, src, dst

    def stored_link_seeds(self, link: LinkInput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(positions, src, dst)`` of this part's seed edges of a link input the servers list: a stored link
        split (:meth:`link_split`) or every edge of a type (:meth:`every_edge`)."""
        if link.split is not None:
            check_link_split_type(self.meta, link)
            return self.link_split(link.split)
        if not link.every_edge:
            raise ValueError("the seed edges of edge_label_index as a tensor are the trainer's, not stored")
        check_link_types(self.meta, link)
        return self.every_edge(link.edge_type)  # type: ignore[arg-type]

    def link_split_eids(self, name: str) -> torch.Tensor:
        """Input edge positions (in the partitioned ``edge_index``) of this part's seed edges of ``name``."""
        self.link_split(name)   # the same check
        etype = self.meta.link_edge_type() or DEFAULT_EDGE_TYPE
        return _tensor(self.paths.link_split_file(self.part_id, name, "eid", etype))

    # ---- shortcuts to node type ``ntype`` and edge type ``etype`` (the graph, when homogeneous)

    @property
    def num_nodes(self) -> int:
        return self.stop - self.start

    def topology(self, kind: str = "csc") -> Topology:
        return self.edges(self.etype).topology(kind)

    @property
    def x(self) -> torch.Tensor | None:
        return self.nodes(self.ntype).x

    @property
    def y(self) -> torch.Tensor | None:
        return self.nodes(self.ntype).y

    @property
    def orig_id(self) -> torch.Tensor:
        return self.nodes(self.ntype).orig_id

    def split(self, name: str) -> torch.Tensor:
        """Global ids of this part's nodes in split ``name`` (sorted)."""
        return self.nodes(self.ntype).split(name)

    def to_global(self, orig_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, gids)``: which of ``orig_ids`` this part owns, and their global ids."""
        return self.nodes(self.ntype).to_global(orig_ids)


def check_link_types(meta: PartitionMeta, link: LinkInput) -> None:
    """ValueError naming the fix when ``link`` gives no edge type for a typed graph, or one the graph lacks."""
    etypes = meta.edge_type_tuples()
    if link.edge_type is None and not meta.is_homogeneous:
        raise ValueError(f"edge_label_index on a typed graph needs its edge type: pass ((src, rel, dst), index) "
                         f"with one of {', '.join(map(str, etypes))}")
    if link.edge_type is not None and link.edge_type not in etypes:
        raise ValueError(f"edge_label_index names edge type {link.edge_type}, which the graph does not have; its "
                         f"edge types are {', '.join(map(str, etypes))}")


def check_link_split_type(meta: PartitionMeta, link: LinkInput) -> None:
    """ValueError naming the fix unless ``link`` (a link split) names the edge type its splits were stored for
    (none on a homogeneous graph; on a typed graph ``((src, rel, dst), split)``)."""
    stored = meta.link_edge_type()
    if meta.is_homogeneous or link.edge_type == stored:
        return
    if stored is None:
        raise ValueError(f"edge_label_index={link.split!r}: this typed partition has no link splits; re-partition "
                         f"with `graphfeed partition --link-split val=0.05,test=0.10 --link-edge-type SRC,REL,DST` or "
                         f"pass edge_label_index=((src, rel, dst), index)")
    raise ValueError(f"edge_label_index={link.split!r}: the link splits are of edge type {stored}: pass "
                     f"edge_label_index=({stored}, {link.split!r})")


def check_every_edge(meta: PartitionMeta, etype: EdgeType, paths: PartitionPaths) -> None:
    """ValueError naming the fix unless the parts can list their edges of ``etype`` by source: from their
    out-edges (CSR), or, in a partition of in-edges only, from every part's in-edges (CSC), which the partition
    folder ``paths`` (this server's) must then hold."""
    if "csr" in meta.topologies:
        return
    files = (paths.edge_file(k, "csc", "eid", etype) for k in range(meta.num_parts))
    missing = next((f for f in files if not f.is_file()), None)
    if missing is None:
        return
    raise ValueError(f"edge_label_index={tuple(etype)} (every edge of the type) lists each part's out-edges, which "
                     f"this partition lacks (in-edges only), or else every part's in-edges, and {missing} is not "
                     f"in this server's folder: give each server the whole partition folder, re-partition with "
                     f"`graphfeed partition --topology both`, or pass ({tuple(etype)}, edge_index)")


def open_parts(root: str | os.PathLike) -> tuple[PartitionMeta, list[Partition]]:
    meta = read_meta(root)
    return meta, [Partition(root, k, meta) for k in range(meta.num_parts)]


def resolve_original_ids(parts: list[Partition], orig_ids: torch.Tensor, ntype: str | None = None) -> torch.Tensor:
    """Global ids of ``orig_ids`` (original ids of node type ``ntype``, default the label type), in the same
    order; raises on unknown ids."""
    orig_ids = torch.as_tensor(orig_ids, dtype=torch.int64).reshape(-1)
    ntype = ntype if ntype is not None else parts[0].label_type
    stores = [part.nodes(ntype) for part in parts]
    gids = torch.full_like(orig_ids, -1)
    for store in stores:
        mask, g = store.to_global(orig_ids)
        gids[mask] = g
    missing = gids < 0
    if bool(missing.any()):
        bad = orig_ids[missing][:5].tolist()
        what = "node" if parts[0].meta.is_homogeneous else f"{ntype!r} node"
        raise ValueError(f"{int(missing.sum())} input {what} id(s) are not in the graph (e.g. {bad}); "
                         f"pass original {what} ids in 0..{sum(s.num_nodes for s in stores) - 1}")
    return gids
