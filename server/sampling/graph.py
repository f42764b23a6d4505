"""One partitioned graph over per-part sources: the sampler of the local loader, the bench and the workers.

A :class:`PartitionedGraph` is a :class:`graphfeed.server.sampling.producer.SamplingGraph`
built from one source per part (:mod:`.source`).  In-process (:meth:`PartitionedGraph.in_process`)
every part is a :class:`LocalSource`; in a session worker
(:func:`graphfeed.server.worker.peers.worker_graph`) its own part is local and the other parts
are its peer workers.

Sampling is typed (:meth:`PartitionedGraph.sample_typed`, PyG's heterogeneous semantics); a
homogeneous graph is its one-type case.  When one local part holds every node, a homogeneous
batch is sampled by the fused multi-hop op and its features are read without a second copy.
Otherwise each hop of each edge type splits the frontier by the owner book *of the frontier's
node type*, starts the remote pieces first, samples the local pieces meanwhile, and stitches the
pieces back into frontier order.  The counter-based RNG keys every choice by (seed, hop, node),
so every split of a frontier gives the same sample, bit for bit.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, Iterator, Mapping, Protocol, Sequence, TypeVar

import torch

from graphfeed.core.spec import EdgeType, SamplingSpec
from graphfeed.server.partition.format.book import RangePartitionBook
from graphfeed.server.partition.format.store import Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.budget import WorkBudget
from graphfeed.server.sampling.neighbor import sample_subgraph, sample_typed, stitch
from graphfeed.server.sampling.source import Handle, HeldPart, LocalSource, PartSource, Rows, center_type
from graphfeed.server.sampling.types import NodeRows, OneHop, SampledSubgraph, TypedSubgraph

T = TypeVar("T")
Start = Callable[[PartSource, torch.Tensor], Handle[T]]   # starts a request for some ids at one source


class StageTelemetry(Protocol):
    """Where the driver records its stages (a worker's :class:`~graphfeed.server.worker.telemetry.WorkerTelemetry`)."""

    def clock(self) -> float: ...

    def stage(self, stage: str) -> ContextManager[None]: ...

    def observe_stage(self, stage: str, seconds: float) -> None: ...


class NoTelemetry:
    """Records nothing: the in-process graph's telemetry."""

    @staticmethod
    def clock() -> float:
        return 0.0

    def stage(self, stage: str) -> ContextManager[None]:
        return nullcontext()

    def observe_stage(self, stage: str, seconds: float) -> None:
        pass


def sample_topology(topo, node_offset: int, seeds: torch.Tensor, spec: SamplingSpec, seed: int) -> SampledSubgraph:
    """All hops over one homogeneous topology holding every reachable node (rows = gid - node_offset).

    The fused native op when loaded; otherwise the multi-hop driver over
    :func:`dispatch.one_hop`.  Same result either way.  ``seeds`` must be distinct global ids.
    """
    if dispatch.has_fused_sampler() and not spec.per_hop:
        return dispatch.fused_sample_subgraph(topo, node_offset, seeds, spec, seed)

    def hop_fn(gids: torch.Tensor, fanout: int, hop: int) -> OneHop:
        return dispatch.one_hop(topo, gids - node_offset, gids, fanout, spec.replace_at(hop), seed, hop)

    return sample_subgraph(seeds, spec, hop_fn)


class PartitionedGraph:
    """A graph partitioned by range books (one per node type); ``sources[p]`` serves part ``p``.

    At least one source must hold its part in this process (:meth:`PartSource.held`): its
    :class:`Partition` gives the schema (node and edge types, label type), the books, and the
    feature rows' shape and type of every node type; its device is the graph's :attr:`device`,
    where frontiers, stitched hops and gathered rows live (a GPU worker's: its GPU).
    ``telemetry`` records ``local_sample``, ``remote_sample`` (per hop and edge type) and
    ``feature_gather``.
    """

    def __init__(self, sources: Sequence[PartSource], telemetry: StageTelemetry | None = None):
        local = [h for h in (s.held() for s in sources) if h is not None]
        if not local:
            raise ValueError("a PartitionedGraph needs at least one part in this process")
        like = local[0].part
        if [s.part_id for s in sources] != list(range(like.meta.num_parts)):
            raise ValueError(f"need one source per part 0..{like.meta.num_parts - 1} in order, "
                             f"got parts {[s.part_id for s in sources]}")
        self.sources = list(sources)
        self.telemetry: StageTelemetry = telemetry if telemetry is not None else NoTelemetry()
        self.books = {t: like.nodes(t).book for t in like.node_types}
        self._num_nodes = {t: b.num_nodes for t, b in self.books.items()}
        self.node_types, self.edge_types, self.label_type = like.node_types, like.edge_types, like.label_type
        self.is_homogeneous = like.meta.is_homogeneous
        self._like: HeldPart = local[0]                                        # feature rows' shape and type
        self._whole = local[0] if like.meta.num_parts == 1 else None           # one local part holds every node
        self.device: torch.device = local[0].device
        self.budget: WorkBudget | None = None   # caps of one sample (a session worker's); None = none

    @classmethod
    def in_process(cls, parts: Sequence[Partition]) -> PartitionedGraph:
        """Every part of a graph in this process (``parts`` in part order, as :func:`open_parts` gives them)."""
        return cls([LocalSource(p) for p in parts])

    @property
    def num_parts(self) -> int:
        return len(self.sources)

    @property
    def book(self) -> RangePartitionBook:
        """The label type's book (for a homogeneous graph: the graph's)."""
        return self.books[self.label_type]

    @property
    def parts(self) -> list[Partition]:
        """The partitions held in this process, in part order."""
        return [h.part for h in (s.held() for s in self.sources) if h is not None]

    def read_locally(self, part: Partition, source: PartSource | None = None) -> None:
        """Serve part ``part.part_id`` from ``part`` (its files, mapped in this process) instead of its
        current source: a session worker does so for a peer's part whose files it shares on the same host
        (:func:`graphfeed.server.worker.peers.colocate`).  Samples are the same either way (the RNG keys
        every draw by seed, hop and node, not by who draws).  ``source``: the source reading it (default a CPU
        :class:`LocalSource`; a GPU worker's is a :class:`~graphfeed.server.sampling.gpu.GpuSource`)."""
        if not 0 <= part.part_id < self.num_parts:
            raise ValueError(f"part {part.part_id} is not a part of this graph (0..{self.num_parts - 1})")
        self.sources[part.part_id] = source if source is not None else LocalSource(part)

    # ---- the SamplingGraph protocol -------------------------------------------------------------

    def sample_typed(self, seeds: Mapping[str, torch.Tensor], spec: SamplingSpec, seed: int,
                     input_type: str | None = None, subgraphs: Mapping[str, torch.Tensor] | None = None,
                     subgraph_time: torch.Tensor | None = None,
                     exclude: Mapping[EdgeType, torch.Tensor] | None = None) -> TypedSubgraph:
        """``spec.num_hops`` hops from ``seeds`` (per node type: distinct global ids) with batch seed ``seed``.

        ``spec``'s fanouts apply to the graph's edge types (:meth:`SamplingSpec.fanouts_for`:
        ValueError for a dict naming an edge type the graph lacks).  ``input_type``, ``subgraphs``
        and ``subgraph_time`` (``spec.disjoint``; ``spec.temporal``) as
        :func:`~graphfeed.server.sampling.neighbor.sample_typed`; so is ``exclude`` (edges no hop may sample:
        a link batch's seed edges), which takes the driver (the fused ops cannot leave edges out).
        """
        fanouts = spec.fanouts_for(self.edge_types)
        if spec.temporal and subgraph_time is None:
            raise ValueError("temporal sampling needs each subgraph's seed time")
        if self.budget is not None:
            self.budget.check_hops(spec.num_hops)
        if self.device.type != "cpu":    # the frontier lives where the graph samples
            seeds, subgraphs, subgraph_time = _to_device(self.device, seeds, subgraphs, subgraph_time)
        if self._whole is not None and not spec.disjoint and not exclude:
            sub = self._sample_one_part(seeds, spec, fanouts, seed, input_type)
            if self.budget is not None:   # one native call: checked as a whole (bounded by the graph's size)
                self.budget.check_sample(sum(int(n.numel()) for n in sub.nodes.values()),
                                         sum(int(e.numel()) for e in sub.eids.values()), spec.num_hops - 1)
            return sub

        def one_hop(etype: EdgeType, gids: torch.Tensor, fanout: int, rng_hop: int,
                    seed_time: torch.Tensor | None = None) -> OneHop:
            hop_spec = spec.at_hop(rng_hop // len(fanouts))   # the driver's rng_hop = hop * edge types + k
            return self._one_hop(etype, gids, hop_spec, fanout, seed, rng_hop, seed_time)

        return sample_typed(seeds, fanouts, spec.direction, one_hop, input_type,
                            subgraphs if spec.disjoint else None, subgraph_time, num_nodes=self._num_nodes,
                            budget=self.budget, exclude=exclude)

    def gather_typed(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None = None) -> Rows:
        """The :class:`NodeRows` (x, y, n_id) of the nodes ``gids`` of type ``ntype`` (x / y None where the type
        has none), in the stored dtypes.  ``dtype``: the dtype the batch's features are cast to next (a loader's
        ``feature_dtype``), which peers may send their rows in (:meth:`NodeRows.in_transport_dtype`)."""
        with self.telemetry.stage("feature_gather"):
            if self._whole is not None:
                return self._whole.gather(ntype, gids.to(self._whole.device))
            return self._gather(ntype, gids, dtype)

    def quant_scales(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Every node type's int8 feature scales (``(scale, offset)``, the same in every part: read from a held
        part); ValueError naming the fix when a type with floating-point features has none."""
        part, out = self._like.part, {}
        for ntype in self.node_types:
            store = part.nodes(ntype)
            if store.x is None or not store.x.is_floating_point():
                continue
            scales = store.quant_scales
            if scales is None:
                raise ValueError(f"feature_dtype='int8' needs the per-column scales stored at partition time, and this "
                                 f"partition has none: run `graphfeed quantize {part.paths.root}`")
            out[ntype] = scales
        return out

    def hard_negatives(self, etype: EdgeType | None, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """int64 [n, k]: the stored hard-negative destinations (global ids, -1 padding) of seed edges ``(src[i],
        dst[i])`` (global ids) of ``etype`` (None: the homogeneous graph's), read from the parts owning the
        sources, which must be in this process (a link batch's are: its seed edges' sources are its part's).
        ValueError naming the fix when the partition stores none."""
        etype = self.edge_types[0] if etype is None else etype
        pieces = []
        for p, pos in self.books[etype[0]].split(src):
            held = self.sources[p].held()
            stored = None if held is None else held.part.edges(etype).hard_negatives
            if held is None or stored is None:
                raise ValueError(f"num_hard_negatives needs the hard negatives of part {p}, which "
                                 f"{'is not in this process' if held is None else 'stores none'}: partition the "
                                 f"graph with hard_neg_dst.npy, or leave num_hard_negatives out")
            pieces.append((pos, stored.lookup(src[pos], dst[pos])))
        width = max((t.size(1) for _, t in pieces), default=0)
        out = torch.full((src.numel(), width), -1, dtype=torch.int64)
        for pos, rows in pieces:
            out[pos] = rows
        return out

    def local_node_time(self, ntype: str, gids: torch.Tensor) -> torch.Tensor:
        """Stored timestamps of nodes ``gids`` of type ``ntype``, all owned by parts in this process (a
        node batch's seeds are); ValueError naming the fix when the type stores no times."""
        out = torch.empty(gids.numel(), dtype=torch.int64)
        for p, pos in self.books[ntype].split(gids):
            held = self.sources[p].held()
            if held is None:
                raise ValueError(f"node times of part {p} are not in this process")
            store = held.part.nodes(ntype)
            if store.time is None:
                raise ValueError("the seeds have no stored node times: pass input_time (one time per input node), "
                                 "or partition the graph with node_time.npy (Data.time)")
            out[pos] = store.time.index_select(0, gids[pos] - store.start)
        return out

    # ---- the one-type shortcuts (a homogeneous graph; a typed graph's label type) ------------------

    def sample(self, seeds: torch.Tensor, spec: SamplingSpec, seed: int) -> SampledSubgraph:
        """:meth:`sample_typed` from seeds of the label type, as a :class:`SampledSubgraph`
        (ValueError unless the sample has one node type and one edge type)."""
        return self.sample_typed({self.label_type: seeds}, spec, seed).homogeneous()

    def gather(self, gids: torch.Tensor) -> Rows:
        """:meth:`gather_typed` of the label type."""
        return self.gather_typed(self.label_type, gids)

    # ---- one part holds every node ----------------------------------------------------------------

    def _sample_one_part(self, seeds: Mapping[str, torch.Tensor], spec: SamplingSpec,
                         fanouts: Mapping[EdgeType, Sequence[int]], seed: int,
                         input_type: str | None) -> TypedSubgraph:
        """Every hop on the one local part, in one native call when the op library is loaded: the fused
        homogeneous op for the one-type graph, the fused typed op (``dispatch.fused_sample_typed``)
        otherwise; else (or when ``spec.weighted``: the fused ops sample uniformly) the driver over the
        part's hops (the same sample either way).
        """
        assert self._whole is not None
        part, whole = self._whole.part, self._whole
        with self.telemetry.stage("local_sample"):
            if whole.device.type != "cpu":    # the fused ops run on the CPU: the driver over the device's hops
                return self._driver_one_part(seeds, spec, fanouts, seed, input_type)
            if self.is_homogeneous and not spec.is_typed and not spec.weighted and set(seeds) == {self.label_type}:
                sub = sample_topology(part.topology(spec.topology), part.start, seeds[self.label_type], spec, seed)
                return TypedSubgraph.of_homogeneous(sub, self.label_type, self.edge_types[0])
            topos = {e: part.edges(e).topology(spec.topology) for e in fanouts}
            if not spec.weighted and not spec.per_hop and dispatch.has_fused_typed_sampler(topos):
                # the fused ops sample uniformly, with one replace for every hop
                stores = {t: part.nodes(t) for t in self.node_types}
                return dispatch.fused_sample_typed(topos, {t: n.start for t, n in stores.items()}, seeds, fanouts,
                                                   spec.direction, spec.replace_at(0), seed, input_type,
                                                   node_bounds={t: n.stop for t, n in stores.items()})
            return self._driver_one_part(seeds, spec, fanouts, seed, input_type)

    def _driver_one_part(self, seeds: Mapping[str, torch.Tensor], spec: SamplingSpec,
                         fanouts: Mapping[EdgeType, Sequence[int]], seed: int, input_type: str | None) -> TypedSubgraph:
        """The typed driver over the one part's hops, on its device."""
        whole = self._whole
        assert whole is not None

        def one_hop(etype: EdgeType, gids: torch.Tensor, fanout: int, rng_hop: int) -> OneHop:
            return whole.one_hop(etype, gids, spec.at_hop(rng_hop // len(fanouts)), fanout, seed, rng_hop)

        return sample_typed(seeds, fanouts, spec.direction, one_hop, input_type, num_nodes=self._num_nodes)

    # ---- what link loaders ask: edge membership and id resolution -------------------------------

    @property
    def num_nodes(self) -> int:
        return self.book.num_nodes

    def edge_check_topology(self) -> str:
        """The topology :meth:`has_edges` searches: ``"csr"`` (the source's part answers) when the
        partition has it, else ``"csc"`` (the destination's part answers)."""
        topologies = self._like.part.meta.topologies
        return "csr" if "csr" in topologies else "csc"

    def has_edges(self, src: torch.Tensor, dst: torch.Tensor, etype: EdgeType | None = None) -> torch.Tensor:
        """bool [n]: whether each ``(src[i], dst[i])`` (global ids) is an edge of edge type ``etype`` (None:
        the homogeneous graph's), asked of the part that owns ``src[i]`` (``dst[i]`` without CSR topology)
        -- a peer worker when not local."""
        kind = self.edge_check_topology()
        pairs = torch.stack([src.to(torch.int64), dst.to(torch.int64)], dim=1)
        owner_type = self.label_type if etype is None else etype[0] if kind == "csr" else etype[2]
        split = self.books[owner_type].split((pairs[:, 0] if kind == "csr" else pairs[:, 1]).contiguous())
        out = torch.zeros(pairs.size(0), dtype=torch.bool)
        for pos, found in self._pieces(pairs, split, lambda source, ids: source.start_has_edges(ids, kind, etype)):
            out[pos] = found.cpu()
        return out

    @property
    def has_edge_features(self) -> bool:
        return bool(self._like.part.meta.edge_features)

    def edge_attr(self, sub: SampledSubgraph, spec: SamplingSpec) -> torch.Tensor | None:
        """Edge features of ``sub``'s sampled edges, aligned with ``sub.eids`` (None when the graph has
        none), read from the part that sampled each edge: the owner of its destination for
        ``direction="in"`` (CSC), of its source for ``"out"`` (CSR) -- a peer worker when not local."""
        if not self.has_edge_features:
            return None
        kind = spec.topology
        center = sub.nodes.index_select(0, sub.col if kind == "csc" else sub.row).cpu()   # edge features: host
        pairs = torch.stack([center, sub.eids.to(torch.int64).cpu()], dim=1)
        like = self._like.part.edges(self._like.part.etype).edge_attr(kind)
        assert like is not None
        out = torch.empty((pairs.size(0),) + tuple(like.shape[1:]), dtype=like.dtype)
        if pairs.size(0) == 0:
            return out
        with self.telemetry.stage("feature_gather"):
            for pos, rows in self._pieces(pairs, self.book.split(center),
                                          lambda source, ids: source.start_edge_attr(ids, kind)):
                out.index_copy_(0, pos, rows.cpu())
        return out

    def num_nodes_of(self, ntype: str | None) -> int:
        """Nodes of type ``ntype`` (None: the label type) in the whole graph."""
        return self.books[self.label_type if ntype is None else ntype].num_nodes

    def to_global(self, orig_ids: torch.Tensor, ntype: str | None = None) -> torch.Tensor:
        """Global ids of original ids ``orig_ids`` of node type ``ntype`` (None: the label type; -1 where no
        part holds one), asking every part."""
        orig_ids = torch.as_tensor(orig_ids, dtype=torch.int64).reshape(-1)
        out = torch.full_like(orig_ids, -1)
        every = [(p, torch.arange(orig_ids.numel())) for p in range(self.book.num_parts)]
        for _, (mask, gids) in self._pieces(orig_ids, every,
                                            lambda source, ids: source.start_to_global(ids, ntype)):
            out[mask.cpu()] = gids.cpu()
        return out

    # ---- the multi-part driver ------------------------------------------------------------------

    def _one_hop(self, etype: EdgeType, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int,
                 hop: int, seed_time: torch.Tensor | None = None) -> OneHop:
        """One hop of ``etype`` for frontier ``gids`` (of the hop's center type), split by that type's
        owners and stitched back into frontier order."""
        tel = self.telemetry
        t0 = tel.clock()
        split = self.books[center_type(etype, spec.direction)].split(gids)

        # positions travel with the ids so that each piece's seed times can be picked out
        keyed = gids if seed_time is None else \
            torch.stack([gids, torch.arange(gids.numel(), device=gids.device)], dim=1)

        def start(src: PartSource, ids: torch.Tensor) -> Handle[OneHop]:   # ids on src's device (_pieces)
            if seed_time is None:
                return src.start_one_hop(etype, ids, spec, fanout, seed, hop)
            return src.start_one_hop(etype, ids[:, 0].contiguous(), spec, fanout, seed, hop,
                                     seed_time.index_select(0, ids[:, 1].to(seed_time.device)).to(src.device))

        pieces = list(self._pieces(keyed, split, start, local_stage="local_sample"))
        if any(not self.sources[p].local for p, _ in split):
            tel.observe_stage("remote_sample", tel.clock() - t0)
        return stitch(gids.numel(), pieces, gids.device)

    def _gather(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None = None) -> Rows:
        """Rows of ``gids`` (type ``ntype``) from their owners, copied into place (one local owner: its
        rows as they are).  Remote pieces are asked for first; local rows are copied straight into
        place meanwhile (one copy), then each remote piece as it arrives."""
        split = self.books[ntype].split(gids)
        only = self.sources[split[0][0]].held() if len(split) == 1 else None
        if only is not None and only.device == gids.device:
            return only.gather(ntype, gids)
        n, store, device = gids.numel(), self._like.part.nodes(ntype), gids.device
        out = NodeRows.read(store, lambda column: dispatch.empty_rows(column, n, device)).with_fields(
            n_id=torch.empty(n, dtype=torch.int64, device=device))
        remote = [(pos, self.sources[p].start_gather(ntype, gids[pos].to(self.sources[p].device), dtype))
                  for p, pos in split if self.sources[p].held() is None]
        for p, pos in split:
            held = self.sources[p].held()
            if held is not None:
                held.gather_to(ntype, gids[pos], out, pos)
        for pos, handle in remote:
            rows = handle.wait()
            for name, dst in out.items():
                src = getattr(rows, name)
                if dst is not None and src is not None:
                    # a peer's rows in the transport dtype are widened back exactly
                    dispatch.gather_rows_to(src.to(device, dst.dtype, non_blocking=True), None, dst, pos)
            del rows   # freed before the next piece is read, which then reuses its memory (no page faults)
        return out

    def _pieces(self, gids: torch.Tensor, split: list[tuple[int, torch.Tensor]],
                start: Start[T], local_stage: str | None = None) -> Iterator[tuple[torch.Tensor, T]]:
        """``(positions, result)`` of ``start(source, ids)`` for the piece of ``gids`` each owner holds.

        Every remote piece is started first (in flight meanwhile); then each local piece is done
        (inside ``local_stage`` when given) and yielded at once; then each remote piece as it
        arrives.  Nothing here holds a piece once it is yielded.
        """
        def ids(p: int, pos: torch.Tensor) -> torch.Tensor:   # a piece goes where its source works
            return gids[pos].to(self.sources[p].device)

        remote = [(pos, start(self.sources[p], ids(p, pos))) for p, pos in split if not self.sources[p].local]
        for p, pos in split:
            if self.sources[p].local:
                yield pos, self._local_piece(self.sources[p], ids(p, pos), start, local_stage)
        for pos, handle in remote:
            yield pos, handle.wait()

    def _local_piece(self, source: PartSource, ids: torch.Tensor, start: Start[T], stage: str | None) -> T:
        """``start(source, ids)`` of a local source (done when started), inside ``stage`` when given."""
        with self.telemetry.stage(stage) if stage else nullcontext():
            return start(source, ids).wait()


def _to_device(device: torch.device, seeds: Mapping[str, torch.Tensor], subgraphs: Mapping[str, torch.Tensor] | None,
               subgraph_time: torch.Tensor | None):
    """A batch's seeds (and disjoint subgraphs, seed times) on ``device``."""
    return ({t: s.to(device) for t, s in seeds.items()},
            None if subgraphs is None else {t: s.to(device) for t, s in subgraphs.items()},
            None if subgraph_time is None else subgraph_time.to(device))
