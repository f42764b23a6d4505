"""The one place that chooses the sampling implementation.

``native`` (the ``graphfeed.cuda_ext`` op library, when it was built and loads) or
``reference`` (pure torch).  Set ``GRAPHFEED_SAMPLER=reference`` to force the reference
path (``native`` makes a missing library an error).  Both give identical results (same
counter-based RNG, same selection rule); ``IMPLEMENTATION`` says which one runs.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import Mapping

import torch

from graphfeed.core.seeding import MASK64
from graphfeed.core.spec import EdgeType, SamplingSpec
from graphfeed.server.partition.format.store import Topology
from graphfeed.server.sampling import reference, reference_ext
from graphfeed.server.sampling.typed_plan import EdgeFanouts, TypedPlan, plan_typed
from graphfeed.server.sampling.types import OneHop, SampledSubgraph, TypedSubgraph

_FORCED = os.environ.get("GRAPHFEED_SAMPLER", "").strip().lower()
if _FORCED not in ("", "reference", "native"):
    raise ImportError(f"GRAPHFEED_SAMPLER={_FORCED!r} is not valid: use 'reference' or 'native' (or unset it)")


def _probe_native():
    if _FORCED == "reference":
        return None
    from graphfeed import cuda_ext

    ops = cuda_ext.load_ops()
    if ops is None:
        msg = (f"graphfeed native sampling ops unavailable ({cuda_ext.load_error()}); "
               "using the pure-torch reference sampler")
        if _FORCED == "native":
            raise ImportError(msg + " -- but GRAPHFEED_SAMPLER=native was set")
        if cuda_ext.build_was_expected():
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return ops


_NATIVE = _probe_native()
IMPLEMENTATION = "native" if _NATIVE is not None else "reference"


def fallback_reason() -> str | None:
    """Why the pure-torch reference runs, with the fix (``None`` when the native ops run)."""
    if _NATIVE is not None:
        return None
    if _FORCED == "reference":
        return "GRAPHFEED_SAMPLER=reference forces the pure-torch sampler (unset it to use the native ops)"
    from graphfeed import cuda_ext

    return f"{cuda_ext.load_error()} (the pure-torch sampler runs, about 3x slower)"


def describe() -> str:
    """One line for ``graphfeed info``/``bench``: the implementation and where its library came from."""
    if _NATIVE is None:
        return f"reference: {fallback_reason()}"
    from graphfeed import cuda_ext

    origin, path = cuda_ext.library_origin()
    return f"native ({origin}: {path})"


def _seed64(seed: int) -> int:
    """The batch seed as the int64 with the same 64 bits (what the ops' ``int`` argument holds)."""
    seed = int(seed) & MASK64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _long(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 else t.to(torch.int64)


def one_hop(topo, local_nodes: torch.Tensor, gids: torch.Tensor, fanout: int, replace: bool,
            seed: int, hop: int) -> OneHop:
    """Sample one hop for rows ``local_nodes`` of ``topo`` (global ids ``gids``)."""
    if _NATIVE is not None:
        return OneHop(*_NATIVE.one_hop(topo.indptr, topo.indices, topo.eid, _long(local_nodes), _long(gids),
                                       int(fanout), bool(replace), _seed64(seed), int(hop)))
    return reference.one_hop(topo.indptr, topo.indices, topo.eid, local_nodes, gids, fanout, replace, seed, hop)


def weighted_one_hop(topo, weight: torch.Tensor, local_nodes: torch.Tensor, gids: torch.Tensor, fanout: int,
                     replace: bool, seed: int, hop: int) -> OneHop:
    """Weighted one hop (``weight`` >= 0 per edge of ``topo``; scheme in :mod:`.reference_ext`)."""
    if _NATIVE is not None:
        return OneHop(*_NATIVE.weighted_one_hop(topo.indptr, topo.indices, topo.eid, weight.to(torch.float64),
                                                _long(local_nodes), _long(gids), int(fanout), bool(replace),
                                                _seed64(seed), int(hop)))
    return reference_ext.weighted_one_hop(topo.indptr, topo.indices, topo.eid, weight, local_nodes, gids, fanout,
                                          replace, seed, hop)


def temporal_one_hop(topo, edge_time: torch.Tensor, local_nodes: torch.Tensor, gids: torch.Tensor,
                     seed_time: torch.Tensor, fanout: int, replace: bool, seed: int, hop: int) -> OneHop:
    """Temporal one hop: only edges with ``edge_time <= seed_time`` of their frontier node."""
    if _NATIVE is not None:
        return OneHop(*_NATIVE.temporal_one_hop(topo.indptr, topo.indices, topo.eid, _long(edge_time),
                                                _long(local_nodes), _long(gids), _long(seed_time), int(fanout),
                                                bool(replace), _seed64(seed), int(hop)))
    return reference_ext.temporal_one_hop(topo.indptr, topo.indices, topo.eid, edge_time, local_nodes, gids,
                                          seed_time, fanout, replace, seed, hop)


def last_one_hop(topo, edge_time: torch.Tensor, local_nodes: torch.Tensor, gids: torch.Tensor,
                 seed_time: torch.Tensor, fanout: int, replace: bool, seed: int, hop: int) -> OneHop:
    """Temporal one hop, strategy ``"last"``: each node's ``fanout`` most recent edges not later than its
    seed time.  No random draws (``replace``, ``seed``, ``hop`` and ``gids`` do not matter), so one
    pure-torch implementation serves both the native and the reference configuration."""
    return reference_ext.last_one_hop(topo.indptr, topo.indices, topo.eid, _long(edge_time), _long(local_nodes),
                                      _long(seed_time), int(fanout))


def has_fused_sampler() -> bool:
    """Whether :func:`fused_sample_subgraph` is available (the native library is loaded)."""
    return _NATIVE is not None


def fused_sample_subgraph(topo, node_offset: int, seeds: torch.Tensor, spec: SamplingSpec,
                          seed: int) -> SampledSubgraph:
    """All hops in one native call over one topology holding every reachable node
    (rows = gid - node_offset); ``seeds`` must be distinct global ids.

    Only when :func:`has_fused_sampler`; gives what the multi-hop driver
    (:func:`graphfeed.server.sampling.neighbor.sample_subgraph`) over :func:`one_hop` gives.
    """
    if _NATIVE is None:
        raise RuntimeError("the fused multi-hop sampler needs the native op library, which is not loaded")
    seeds = _long(seeds)
    nodes, row, col, eids, nn, ne = _NATIVE.sample_subgraph(
        topo.indptr, topo.indices, topo.eid, seeds, int(node_offset), list(spec.num_neighbors),
        bool(spec.replace), _seed64(seed), spec.direction == "in")
    return SampledSubgraph(nodes, row, col, eids, seeds.numel(), nn.tolist(), ne.tolist())


def has_fused_typed_sampler(topos: Mapping[EdgeType, Topology] | None = None) -> bool:
    """Whether :func:`fused_sample_typed` can run: the native library is loaded and every topology of
    ``topos`` (when given) is on the CPU.  The typed op has no CUDA kernel; for CUDA topologies the
    typed driver (:func:`graphfeed.server.sampling.neighbor.sample_typed`) runs each hop with
    :func:`one_hop`, which dispatches to the CUDA kernel by the tensors' device."""
    if _NATIVE is None:
        return False
    return topos is None or all(t.indptr.device.type == "cpu" for t in topos.values())


def fused_sample_typed(topos: Mapping[EdgeType, Topology], node_offsets: Mapping[str, int],
                       seeds: Mapping[str, torch.Tensor], fanouts: EdgeFanouts, direction: str, replace: bool,
                       seed: int, input_type: str | None = None,
                       node_bounds: Mapping[str, int] | None = None) -> TypedSubgraph:
    """Every hop of a typed sample in one native call, over one part holding every node of every type.

    ``topos[e]``: edge type ``e``'s CSC (``direction="in"``) or CSR (``"out"``) on the CPU;
    ``node_offsets[t]``: the part's first global id of node type ``t`` (row = gid - offset);
    ``seeds[t]``: distinct global ids of type ``t``.  Gives exactly what
    :func:`graphfeed.server.sampling.neighbor.sample_typed` over :func:`one_hop` gives (same RNG
    keys, relabel order and semantics; see its docstring).  ``node_bounds[t]`` (optional: every
    global id of ``t`` is below it) lets a type that no topology is keyed by use a dense id map.

    Only when :func:`has_fused_typed_sampler`.  ValueError for bad fanouts, direction, seeds, a
    missing topology or node offset; RuntimeError (from the op) for a node outside its topology,
    repeated seeds or a corrupt topology.
    """
    if _NATIVE is None:
        raise RuntimeError("the fused typed sampler needs the native op library, which is not loaded")
    plan = plan_typed(seeds, fanouts, direction, input_type)
    _check_typed_parts(plan, topos, node_offsets)
    into_dst = direction == "in"
    etopos = [topos[e] for e in plan.etypes]
    index = {t: i for i, t in enumerate(plan.node_types)}
    nodes, nn, row, col, eids, ne = _NATIVE.sample_typed_subgraph(
        [t.indptr for t in etopos], [t.indices for t in etopos], [t.eid for t in etopos],
        [index[e[0]] for e in plan.etypes], [index[e[2]] for e in plan.etypes],
        [_long(seeds.get(t, torch.empty(0, dtype=torch.int64))) for t in plan.node_types],
        [int(node_offsets[t]) for t in plan.node_types], _node_bounds(plan, topos, node_offsets, into_dst, node_bounds),
        [int(fanouts[e][h]) for h in range(plan.num_hops) for e in plan.etypes],
        bool(replace), _seed64(seed), into_dst)
    types, etypes = plan.node_types, plan.etypes
    return TypedSubgraph(dict(zip(types, nodes)), dict(zip(etypes, row)), dict(zip(etypes, col)),
                         dict(zip(etypes, eids)), {t: c.tolist() for t, c in zip(types, nn)},
                         {e: c.tolist() for e, c in zip(etypes, ne)}, int(nn[index[plan.input_type]][0]),
                         plan.input_type)


def _check_typed_parts(plan: TypedPlan, topos: Mapping[EdgeType, Topology], node_offsets: Mapping[str, int]) -> None:
    """ValueError naming the first edge type without a topology or node type without an offset."""
    missing = [e for e in plan.etypes if e not in topos]
    if missing:
        raise ValueError(f"no topology for edge type {missing[0]!r}: give one per edge type of the fanouts")
    absent = [t for t in plan.node_types if t not in node_offsets]
    if absent:
        raise ValueError(f"no node offset for node type {absent[0]!r}: give the part's first global id of "
                         f"every node type ({plan.node_types})")


def _node_bounds(plan: TypedPlan, topos: Mapping[EdgeType, Topology], node_offsets: Mapping[str, int],
                 into_dst: bool, given: Mapping[str, int] | None) -> list[int]:
    """Per node type an exclusive bound of its global ids, or -1 when unknown (the op then hashes).

    A type keyed by a topology (its rows) has ``offset + rows``: in a one-part graph every id of
    that type is a row, so a larger neighbor id is an error the op reports."""
    bounds = {t: -1 for t in plan.node_types}
    for etype in plan.etypes:
        center = etype[2] if into_dst else etype[0]
        bounds[center] = max(bounds[center], int(node_offsets[center]) + topos[etype].num_nodes)
    for t, bound in (given or {}).items():
        if t in bounds:
            bounds[t] = int(bound)
    return [bounds[t] for t in plan.node_types]


def gather_rows(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src[index]`` (rows), written into ``out`` when given (e.g. a preallocated pinned buffer)."""
    index = _long(index)
    if _NATIVE is not None:
        if out is None:
            return _NATIVE.gather_rows(src, index)
        _NATIVE.gather_rows_into(src, index, out)
        return out
    if out is None:
        return src.index_select(0, index)  # same rows as src[index], about 2x faster on large gathers
    return torch.index_select(src, 0, index, out=out)


def empty_rows(like: torch.Tensor, rows: int, device: torch.device | None = None) -> torch.Tensor:
    """An uninitialised ``[rows, *like.shape[1:]]`` tensor of ``like``'s dtype on ``device`` (default: ``like``'s),
    for rows about to be written: multi-MB CPU ones on huge pages with the native library (a fresh multi-MB
    tensor costs more in page faults than the copy into it)."""
    device = like.device if device is None else torch.device(device)
    if _NATIVE is not None and device.type == "cpu":
        return _NATIVE.empty_rows(like, int(rows))
    return torch.empty((int(rows),) + tuple(like.shape[1:]), dtype=like.dtype, device=device)


def use_block_pool() -> bool:
    """Serve this process's CPU allocations of 8 MiB and more from the native library's pool of reused
    huge-page blocks (what :func:`empty_rows` draws from), so a batch's large buffers -- its rows, and the
    buffers torch RPC receives a peer's rows into -- do not each cost fresh pages the kernel zeroes.
    For the session workers (a daemon's own processes); True once the pool serves them, False without
    the native library or when another allocator outranks it (then nothing changes)."""
    return _NATIVE is not None and bool(_NATIVE.use_block_pool())


def gather_rows_to(src: torch.Tensor, index: torch.Tensor | None, out: torch.Tensor, out_index: torch.Tensor) -> None:
    """``out[out_index[i]] = src[index[i]]`` (``index`` None: ``src[i]``): rows copied straight into place,
    one copy where ``index_select`` then ``index_copy_`` make two."""
    out_index = _long(out_index)
    if _NATIVE is not None and src.device.type == "cpu" and out.device.type == "cpu":
        _NATIVE.gather_rows_to(src, None if index is None else _long(index), out, out_index)
        return
    rows = src if index is None else src.index_select(0, _long(index).to(src.device))
    out.index_copy_(0, out_index.to(out.device), rows.to(out.device))


def relabel_needs_sorted_known() -> bool:
    """The reference relabel binary-searches the known ids; the native one hashes them."""
    return _NATIVE is None


ID_MAP_EMPTY = -(1 << 31)      # an unseen node in an id map (:func:`new_id_map`)
_ID_MAP_MAX_NODES = 1 << 26    # 256 MiB of map at most; larger node types relabel by hashing


def new_id_map(num_nodes: int, device: torch.device) -> torch.Tensor | None:
    """An empty id map for :func:`relabel_map` over node ids ``0..num_nodes-1`` (int32, every entry
    :data:`ID_MAP_EMPTY`), or None where :func:`relabel` must run instead (no native library, a
    device other than the CPU, or a node type too large for a dense map)."""
    if _NATIVE is None or device.type != "cpu" or not 0 <= num_nodes <= _ID_MAP_MAX_NODES:
        return None
    return torch.full((num_nodes,), ID_MAP_EMPTY, dtype=torch.int32)


class _SpareIdMaps(threading.local):
    """Per thread: num_nodes -> a given-back id map every entry of which is :data:`ID_MAP_EMPTY`."""

    def __init__(self) -> None:
        self.maps: dict[int, torch.Tensor] = {}


_SPARE_ID_MAPS = _SpareIdMaps()


def take_id_map(num_nodes: int, device: torch.device) -> torch.Tensor | None:
    """:func:`new_id_map`, reusing the map this thread gave back (:func:`give_id_map`) for a type of the
    same size: filling a fresh map costs O(num_nodes) per batch (10 MB on ogbn-products), clearing the
    entries one batch used costs O(batch)."""
    if _NATIVE is None or device.type != "cpu":
        return None
    spare = _SPARE_ID_MAPS.maps.pop(num_nodes, None)
    return spare if spare is not None else new_id_map(num_nodes, device)


def give_id_map(id_map: torch.Tensor, node_chunks: list[torch.Tensor]) -> None:
    """Return ``id_map`` (from :func:`take_id_map`) for this thread's next batch; ``node_chunks`` are the
    global ids of every node it holds (they are reset to :data:`ID_MAP_EMPTY`)."""
    for gids in node_chunks:
        if gids.numel():
            id_map.index_fill_(0, gids, ID_MAP_EMPTY)
    _SPARE_ID_MAPS.maps[id_map.numel()] = id_map


def relabel_map(id_map: torch.Tensor, candidates: torch.Tensor, num_known: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`relabel` against the nodes held in ``id_map`` (from :func:`new_id_map`; entry ``g`` is the
    local id of node ``g``), which then holds the new nodes too: one map serves every hop of a batch,
    so no hop re-inserts the nodes seen before it.  Ids outside the map raise (RuntimeError)."""
    assert _NATIVE is not None, "relabel_map needs an id map from new_id_map, which needs the native library"
    return tuple(_NATIVE.relabel_map(id_map, _long(candidates), int(num_known)))


def relabel(known_gids: torch.Tensor, known_local: torch.Tensor, candidates: torch.Tensor,
            num_known: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Local ids for ``candidates``; unseen ones get ``num_known, num_known+1, ...`` in order of
    first appearance.  Returns ``(local ids, new global ids in that order)``.

    ``known_local[i]`` is the local id of ``known_gids[i]``; ``known_gids`` must be sorted
    when :func:`relabel_needs_sorted_known`.
    """
    if _NATIVE is not None:
        return tuple(_NATIVE.relabel(_long(known_gids), _long(known_local), _long(candidates), int(num_known)))
    if candidates.numel() == 0:
        return torch.empty_like(candidates), torch.empty_like(candidates)
    span = int(candidates.max()) + 1
    if known_gids.numel():
        span = max(span, int(known_gids[-1]) + 1)
    # Both paths give the same result; a dense id map is O(1) per lookup but costs O(span)
    # to allocate, so use it when the id span is not much larger than the work.
    if span <= _DENSE_FACTOR * (candidates.numel() + known_gids.numel()):
        return _relabel_dense(known_gids, known_local, candidates, num_known, span)
    return _relabel_sorted(known_gids, known_local, candidates, num_known)


_DENSE_FACTOR = 8


def _relabel_dense(known_gids, known_local, candidates, num_known, span):
    table = torch.full((span,), -1, dtype=torch.int64)
    table.index_copy_(0, known_gids, known_local)
    local = table.index_select(0, candidates)
    unseen = local < 0
    rest = candidates[unseen]
    if rest.numel() == 0:
        return local, rest
    order = torch.arange(rest.numel())
    table.index_fill_(0, rest, rest.numel())
    table.scatter_reduce_(0, rest, order, reduce="amin")        # first position of every unseen id
    new_gids = rest[table.index_select(0, rest) == order]       # in order of first appearance
    table.index_copy_(0, new_gids, torch.arange(num_known, num_known + new_gids.numel()))
    local.masked_scatter_(unseen, table.index_select(0, rest))
    return local, new_gids


def _relabel_sorted(known_gids, known_local, candidates, num_known):
    local = torch.empty_like(candidates)
    if known_gids.numel():
        pos = torch.searchsorted(known_gids, candidates).clamp(max=known_gids.numel() - 1)
        found = known_gids[pos] == candidates
        local[found] = known_local[pos[found]]
    else:
        found = torch.zeros_like(candidates, dtype=torch.bool)
    rest = candidates[~found]
    uniq, inverse = torch.unique(rest, return_inverse=True)
    first = torch.full((uniq.numel(),), rest.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(rest.numel()), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    local[~found] = num_known + rank[inverse]
    return local, uniq[order]
