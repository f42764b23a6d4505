"""The checked shape of one typed sampling call, shared by the driver and the fused native op.

:func:`plan_typed` validates ``(seeds, fanouts, direction, input_type)`` once and fixes what
both implementations must agree on: the edge types in sorted order (edge type ``k`` at hop
``h`` draws with RNG hop ``h * len(etypes) + k``), the number of hops, the node types (every
type an edge type names, sorted) and the input type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from graphfeed.core.constants import DIRECTIONS, MAX_FANOUT
from graphfeed.core.spec import EdgeType

EdgeFanouts = Mapping[EdgeType, Sequence[int]]                        # per edge type, one fanout per hop


@dataclass(frozen=True)
class TypedPlan:
    """What a typed sample iterates over (see :func:`plan_typed`)."""

    etypes: list[EdgeType]   # sorted; position k gives rng_hop = hop * len(etypes) + k
    num_hops: int
    node_types: list[str]    # every node type the edge types name, sorted
    input_type: str          # the type whose seed count is the batch size


def plan_typed(seeds: Mapping[str, torch.Tensor], fanouts: EdgeFanouts, direction: str,
               input_type: str | None = None) -> TypedPlan:
    """Check a typed sampling call; ValueError naming the bad fanout, direction, seed type or input type."""
    etypes, num_hops = check_fanouts(fanouts)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")
    named = node_types(etypes)
    return TypedPlan(etypes, num_hops, named, _input_type(seeds, named, input_type))


def check_fanouts(fanouts: EdgeFanouts) -> tuple[list[EdgeType], int]:
    """The edge types in sorted order and the number of hops; ValueError naming the bad entry."""
    if not fanouts:
        raise ValueError("fanouts is empty: give per-hop fanouts for at least one edge type")
    for etype, hops in fanouts.items():
        if not (isinstance(etype, tuple) and len(etype) == 3 and all(isinstance(s, str) for s in etype)):
            raise ValueError(f"edge type {etype!r} is not a (src, rel, dst) tuple of node/relation names")
        bad = [k for k in hops if not -1 <= int(k) <= MAX_FANOUT]
        if bad:
            raise ValueError(f"fanouts of edge type {etype!r} has invalid fanout(s) {bad}: each must be -1 "
                             f"(all neighbors), 0 (skip this edge type at that hop) or 1..{MAX_FANOUT}")
    lengths = {len(hops) for hops in fanouts.values()}
    if len(lengths) != 1 or 0 in lengths:
        per_type = {e: len(hops) for e, hops in fanouts.items()}
        raise ValueError(f"fanouts must give every edge type the same number (>= 1) of hops, got {per_type}")
    return sorted(fanouts), lengths.pop()


def node_types(etypes: Sequence[EdgeType]) -> list[str]:
    """Every node type the edge types name, sorted."""
    return sorted({t for src, _, dst in etypes for t in (src, dst)})


def _input_type(seeds: Mapping[str, torch.Tensor], named: list[str], input_type: str | None) -> str:
    """The type whose seed count is the batch size; ValueError for seeds of a type no edge type names."""
    if not seeds:
        raise ValueError("seeds is empty: give the seed ids of at least one node type")
    unknown = [t for t in seeds if t not in named]
    if unknown:
        raise ValueError(f"seeds of node type {unknown[0]!r}, which no edge type in the fanouts names "
                         f"(node types: {named}); seed one of those types")
    if input_type is None:
        if len(seeds) != 1:
            raise ValueError(f"seeds of several node types {sorted(seeds)}: name the input_type")
        (input_type,) = seeds
    if input_type not in seeds:
        raise ValueError(f"input_type {input_type!r} has no seeds (seeded types: {sorted(seeds)})")
    return input_type
