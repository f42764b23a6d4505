"""The records of what a loader asks for, passed whole between every layer.

* :class:`SamplingSpec` -- how to sample a batch's neighborhood (fanouts, replacement,
  direction).  Fanouts are one list for every edge type or a dict per edge type, as PyG's
  ``NeighborLoader`` takes them.  Sampling options (weights, time, disjoint) are fields here.
* :class:`NodeInput` -- which seeds an epoch covers (a split, explicit ids, or every node),
  of which node type.
* :class:`LinkInput` -- the other seed kind: seed edges (``edge_label_index``), their labels
  and :class:`NegativeSampling`.  The epoch contract is the same over seed edges.
* :class:`LoaderSpec` -- one loader: the sampling spec and one seed record plus the epoch contract's arguments
  (batch size, shuffle, drop_last, seed, rank, world size, ordered), a metrics label and the
  feature transport dtype (``feature_dtype``: features cast on the server, so fewer bytes move).

Records are frozen and validated on construction, so a spec that exists is a valid one.
They cross the control plane through :mod:`graphfeed.proto.convert` (the one protobuf
conversion) and torch RPC / the worker pipe as themselves: a :class:`SamplingSpec` travels whole
to the peer workers that sample a hop (which check it again).  What crosses the data path stays a
frozen dataclass of ints, floats, bools, strings, tuples, None and tensors (nested records allowed):
no callables, no arbitrary objects, so a plain-record codec can carry it.

The loaders' keywords are declared once here too: the options tables (:class:`SamplingOptions`,
:class:`LoaderOptions`, :class:`LocalLoaderOptions`, :class:`RemoteLoaderOptions`), see the comment
above them for how to add one.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, cast

import torch
from typing_extensions import Unpack

from graphfeed.core.constants import (
    DIRECTIONS,
    MAX_BATCH_SIZE,
    MAX_FANOUT,
    MAX_TYPE_NAME_LENGTH,
    MAX_WORLD_SIZE,
    SPLITS,
)
from graphfeed.core.feature_cache import CachedIds

MAX_KIND_LENGTH = 256
SEED_LIMIT = 1 << 64          # seeds travel as uint64

EdgeType = tuple[str, str, str]
Fanouts = tuple[int, ...]
# the canonical (hashable) form of a per-edge-type fanout dict: pairs sorted by edge type
TypedFanouts = tuple[tuple[EdgeType, Fanouts], ...]


def type_name(name, what: str = "node type") -> str:
    """``name`` if it is a valid node type or relation name (a non-empty string); ValueError otherwise."""
    if not isinstance(name, str) or not name or len(name) > MAX_TYPE_NAME_LENGTH:
        raise ValueError(f"{what} must be a non-empty string of at most {MAX_TYPE_NAME_LENGTH} characters, "
                         f"got {name!r}")
    return name


def edge_type(value) -> EdgeType:
    """``value`` as a ``(src, rel, dst)`` tuple of names; ValueError unless it is such a triple."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or len(value) != 3:
        raise ValueError(f"an edge type is a (src, rel, dst) triple of names, e.g. ('author', 'writes', 'paper'), "
                         f"got {value!r}")
    src, rel, dst = value
    return type_name(src, "an edge type's source"), type_name(rel, "an edge type's relation"), \
        type_name(dst, "an edge type's destination")


def _hop_fanouts(values, what: str, *, allow_zero: bool) -> Fanouts:
    """``values`` as per-hop fanouts: ``-1`` (all neighbors) or ``1..MAX_FANOUT`` (``0..`` with ``allow_zero``)."""
    if isinstance(values, (str, numbers.Number)) or not isinstance(values, Iterable):
        raise ValueError(f"{what} must be a list of per-hop fanouts, e.g. [15, 10], got {values!r}")
    hops = tuple(int(k) for k in values)
    if not hops:
        raise ValueError(f"{what} is empty: give one fanout per hop, e.g. [15, 10, 5]")
    low = 0 if allow_zero else 1
    bad = [k for k in hops if k != -1 and not low <= k <= MAX_FANOUT]
    if bad:
        raise ValueError(f"{what} {list(hops)} has invalid fanout(s) {bad}: each hop's fanout must be "
                         f"-1 (all neighbors) or {low}..{MAX_FANOUT}")
    return hops


def _typed_fanouts(pairs) -> TypedFanouts:
    """``(edge type, fanouts)`` pairs in canonical form; a fanout of 0 means "not sampled at that hop"."""
    out: dict[EdgeType, Fanouts] = {}
    for key, hops in pairs:
        etype = edge_type(key)
        if etype in out:
            raise ValueError(f"num_neighbors names edge type {etype} twice: give each edge type once")
        out[etype] = _hop_fanouts(hops, f"num_neighbors[{etype}]", allow_zero=True)
    if not out:
        raise ValueError("num_neighbors is empty: give one fanout per hop, e.g. [15, 10, 5], "
                         "or a dict {(src, rel, dst): [15, 10]}")
    lengths = {etype: len(hops) for etype, hops in out.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"num_neighbors gives edge types different numbers of hops ({lengths}): give every edge "
                         f"type one fanout per hop, the same number of hops (0 = do not sample it at that hop)")
    return tuple(sorted(out.items()))


def _looks_typed(value) -> bool:
    """True for the canonical typed form (a sequence of ``(edge type, fanouts)`` pairs)."""
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(
        isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], (tuple, list)) for p in value)


def fanouts(num_neighbors) -> Fanouts | TypedFanouts:
    """``num_neighbors`` in the form :class:`SamplingSpec` stores: a tuple of per-hop fanouts (one list
    for every edge type), or for a dict ``{(src, rel, dst): [f0, f1, ...]}`` its canonical sorted
    tuple of ``(edge type, fanouts)`` pairs.  ValueError for a scalar, a string, or an invalid value."""
    if isinstance(num_neighbors, Mapping):
        return _typed_fanouts(num_neighbors.items())
    if _looks_typed(num_neighbors):
        return _typed_fanouts(num_neighbors)
    if isinstance(num_neighbors, (str, numbers.Number)) or not isinstance(num_neighbors, Iterable):
        raise ValueError(f"num_neighbors must be a list of per-hop fanouts, e.g. [15, 10], or a dict "
                         f"{{(src, rel, dst): [15, 10]}}, got {num_neighbors!r}")
    return _hop_fanouts(num_neighbors, "num_neighbors", allow_zero=False)


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample: per-hop fanouts (``-1`` = all neighbors), replacement (for every hop or per hop), direction.

    ``num_neighbors`` is one list for every edge type, stored as a tuple of ints (``len`` is
    the number of hops), or a dict ``{(src, rel, dst): [f0, f1, ...]}``, stored as its canonical
    sorted tuple of ``(edge type, fanouts)`` pairs (:attr:`is_typed`).  In the dict form a fanout
    may be 0 (that edge type is not sampled at that hop) and every edge type has the same
    number of hops.  Use :attr:`num_hops` and :meth:`fanouts_for` rather than reading the field.

    ``direction="in"`` samples in-edges (PyG's default: messages flow from sampled
    neighbors to the seeds); ``"out"`` samples out-edges.

    ``weight_attr`` (PyG's argument) samples neighbors with probability proportional to an edge
    weight: ``"edge_attr"`` (the edge features' only column), ``"edge_attr:K"`` (column ``K``) or
    ``"edge_weight"`` (the input's ``edge_weight.npy`` / ``Data.edge_weight``, stored per part);
    see :func:`weight_column`.  The weights must be finite, >= 0, and not all zero for a node with
    edges (checked when a loader opens).

    ``disjoint`` (PyG's argument): every seed (seed edge, for link loaders) grows its own subgraph;
    batches carry ``batch``, the subgraph of every node, and node ids may repeat across subgraphs.
    ``time_attr`` (PyG's argument, ``"time"``: node times, or ``"edge_time"``) samples temporally:
    only neighbours (``"time"``) or edges (``"edge_time"``) not later than the seed's time, which
    every node of the seed's subgraph inherits (temporal sampling is disjoint, as in PyG);
    ``temporal_strategy`` ``"uniform"`` draws among them uniformly, ``"last"`` takes the most recent; per hop,
    e.g. ``["last", "uniform"]``, a seed's most recent neighbours and then a uniform draw around them.

    ``exclude_seed_edges`` (link loaders; DGL's ``exclude="reverse_id"``, GraphStorm's
    ``exclude_training_targets``): no edge between a batch's positive seed edge's endpoints is sampled --
    on a homogeneous graph in both directions, on a typed graph on the seed edge type and, reversed, on
    its reverse edge type (``reverse_edge_types``, a map ``{edge type: reverse edge type}``, stored as sorted
    pairs; an edge type it leaves out gets PyG's ``ToUndirected`` name ``(dst, "rev_" + rel, src)`` when the
    graph has it, see :func:`reverse_edge_type`).
    """

    # Options that may be given per hop (a list of one value per hop; ``control.proto`` carries them as
    # ``<name>_per_hop``): :meth:`at_hop` resolves them, so a source only ever sees one hop's value.
    PER_HOP: ClassVar[tuple[str, ...]] = ("replace", "temporal_strategy")

    num_neighbors: Fanouts | TypedFanouts
    replace: bool | tuple[bool, ...] = False
    direction: str = "in"
    weight_attr: str | None = None
    time_attr: str | None = None
    temporal_strategy: str | tuple[str, ...] = "uniform"
    disjoint: bool = False
    exclude_seed_edges: bool = False
    reverse_edge_types: tuple[tuple[EdgeType, EdgeType], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "num_neighbors", fanouts(self.num_neighbors))
        for name in self.PER_HOP:
            object.__setattr__(self, name, _per_hop(name, getattr(self, name), self.num_hops))
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'in' or 'out', got {self.direction!r}")
        if self.weight_attr is not None:
            weight_column(self.weight_attr)
        if isinstance(self.temporal_strategy, str) and self.temporal_strategy not in TEMPORAL_STRATEGIES:
            raise ValueError(f"temporal_strategy must be 'uniform' or 'last', got {self.temporal_strategy!r}")
        if self.time_attr is not None:
            if self.time_attr not in TIME_ATTRS:
                raise ValueError(f"time_attr must name a stored time column, 'time' (node times) or 'edge_time' "
                                 f"(edge times), got {self.time_attr!r}")
            if self.weight_attr is not None:
                raise ValueError("give weight_attr or time_attr, not both: weighted temporal sampling is not "
                                 "supported")
        object.__setattr__(self, "disjoint", bool(self.disjoint) or self.time_attr is not None)
        object.__setattr__(self, "exclude_seed_edges", bool(self.exclude_seed_edges))
        object.__setattr__(self, "reverse_edge_types", _reverse_map(self.reverse_edge_types))
        if self.reverse_edge_types and not self.exclude_seed_edges:
            raise ValueError("reverse_edge_types is given but exclude_seed_edges is not: pass exclude_seed_edges=True "
                             "(the map only says which edges that option removes)")

    @property
    def temporal(self) -> bool:
        return self.time_attr is not None

    @property
    def per_hop(self) -> bool:
        """True when an option of :attr:`PER_HOP` was given per hop (a tuple): only the per-hop driver samples it."""
        return any(isinstance(getattr(self, name), tuple) for name in self.PER_HOP)

    def replace_at(self, hop: int) -> bool:
        """Whether hop ``hop`` (0 = the seeds' hop) samples with replacement."""
        return bool(self.at_hop(hop).replace)

    @property
    def hop_replace(self) -> bool:
        """``replace`` of a spec that is one hop's (:meth:`at_hop`), what a source samples with; ValueError for a
        spec with per-hop options (the driver resolves them per hop first)."""
        if self.per_hop:
            raise ValueError("this spec gives options per hop: sample a hop with spec.at_hop(hop)")
        return bool(self.replace)

    def at_hop(self, hop: int) -> SamplingSpec:
        """This spec as hop ``hop`` samples it: each per-hop option that hop's value (itself when none is)."""
        hop_values = {name: getattr(self, name)[hop] for name in self.PER_HOP if isinstance(getattr(self, name), tuple)}
        return dataclasses.replace(self, **hop_values) if hop_values else self

    @property
    def weighted(self) -> bool:
        return self.weight_attr is not None

    @property
    def topology(self) -> str:
        return "csc" if self.direction == "in" else "csr"

    @property
    def is_typed(self) -> bool:
        """True when the fanouts were given per edge type (a dict)."""
        return isinstance(self.num_neighbors[0], tuple)

    @property
    def num_hops(self) -> int:
        if self.is_typed:
            return len(cast(TypedFanouts, self.num_neighbors)[0][1])
        return len(self.num_neighbors)

    def fanouts_for(self, edge_types: Iterable) -> dict[EdgeType, Fanouts]:
        """Per-hop fanouts of each of a graph's ``edge_types`` (``(src, rel, dst)`` triples), in their order.

        One list applies to every edge type.  A dict must name only edge types of the graph
        (ValueError naming the unknown one and listing the graph's); edge types it leaves out
        get fanout 0 at every hop (not sampled), as in PyG.
        """
        known = [edge_type(e) for e in edge_types]
        if not self.is_typed:
            return {etype: cast(Fanouts, self.num_neighbors) for etype in known}
        given = dict(cast(TypedFanouts, self.num_neighbors))
        unknown = [etype for etype in given if etype not in set(known)]
        if unknown:
            raise ValueError(f"num_neighbors names edge type {unknown[0]}, which the graph does not have; its edge "
                             f"types are {', '.join(map(str, known))}: use those as the dict's keys")
        zeros = (0,) * self.num_hops
        return {etype: given.get(etype, zeros) for etype in known}


def _reverse_map(value) -> tuple[tuple[EdgeType, EdgeType], ...]:
    """``reverse_edge_types`` as stored: sorted ``(edge type, reverse edge type)`` pairs; ValueError naming the form."""
    if value is None:
        return ()
    pairs = value.items() if isinstance(value, Mapping) else value
    try:
        out = {edge_type(k): edge_type(v) for k, v in pairs}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reverse_edge_types must map edge types to their reverse edge types, e.g. "
                         f"{{('user', 'rates', 'item'): ('item', 'rev_rates', 'user')}}: {exc}") from None
    for etype, rev in out.items():
        if (etype[0], etype[2]) != (rev[2], rev[0]):
            raise ValueError(f"reverse_edge_types maps {etype} to {rev}: a reverse edge type goes from {etype[2]!r} "
                             f"to {etype[0]!r}")
    return tuple(sorted(out.items()))


def reverse_edge_type(etype: EdgeType, edge_types: Iterable, given: Iterable[tuple[EdgeType, EdgeType]] = ()
                      ) -> EdgeType | None:
    """The reverse edge type of ``etype`` in a graph with ``edge_types``: ``given``'s (a
    :attr:`SamplingSpec.reverse_edge_types`), else PyG's ``ToUndirected`` name ``(dst, "rev_" + rel, src)`` (or,
    for a ``rev_`` relation, the one without the prefix) when the graph has it, else None."""
    mapped = dict(given)
    if etype in mapped:
        return mapped[etype]
    src, rel, dst = etype
    known = {tuple(e) for e in edge_types}
    guess = (dst, rel[len("rev_"):] if rel.startswith("rev_") else "rev_" + rel, src)
    return guess if guess in known else None


TEMPORAL_STRATEGIES = ("uniform", "last")

# per-hop option -> (is one hop's value valid?, what one value is, an example of the per-hop form)
_HOP_VALUE_CHECKS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "replace": (lambda v: isinstance(v, bool), "a bool", "[False, True]"),
    "temporal_strategy": (lambda v: v in TEMPORAL_STRATEGIES, "'uniform' or 'last'", "['last', 'uniform']"),
}


def _per_hop(name: str, value, num_hops: int):
    """A :attr:`SamplingSpec.PER_HOP` option as stored: one value for every hop, or a tuple of one value per hop
    (PyG takes one value; per hop, e.g. ``replace=[False, True]``, hop 1 samples with replacement).  The same
    value for every hop is stored as that one value.  ValueError naming the fix for anything else."""
    if not isinstance(value, (tuple, list)):
        return value     # one value for every hop, stored as given (as before per-hop options existed)
    ok, what, example = _HOP_VALUE_CHECKS[name]
    if not all(ok(v) for v in value):
        raise ValueError(f"{name} must be {what} or a list of one per hop, e.g. {example}, got {value!r}")
    if len(value) != num_hops:
        raise ValueError(f"{name} has {len(value)} entries for {num_hops} hops: give one value per hop "
                         f"(e.g. {example}) or one value for every hop")
    hops = tuple(value)
    return hops[0] if len(set(hops)) == 1 else hops


WEIGHT_SOURCE = "edge_attr"
EDGE_WEIGHT = "edge_weight"     # the weights stored from an input's edge_weight.npy / Data.edge_weight
TIME_ATTRS = ("time", "edge_time")     # node times (Data.time, node_time.npy), edge times (Data.edge_time)


def weight_column(weight_attr) -> int | None:
    """The edge feature column ``weight_attr`` names: None for ``"edge_attr"`` (one column) and for
    ``"edge_weight"`` (the stored edge weights, no column), ``K`` for ``"edge_attr:K"``; ValueError
    naming the accepted forms otherwise."""
    if isinstance(weight_attr, str) and weight_attr in (WEIGHT_SOURCE, EDGE_WEIGHT):
        return None
    if isinstance(weight_attr, str) and weight_attr.startswith(WEIGHT_SOURCE + ":"):
        column = weight_attr[len(WEIGHT_SOURCE) + 1:]
        if column.isdigit():
            return int(column)
    raise ValueError(f"weight_attr must name an edge feature column: 'edge_attr' (a single column), "
                     f"'edge_attr:K' (column K) or 'edge_weight' (edge_weight.npy), got {weight_attr!r}")


# what a user may pass as feature_dtype -> the canonical name LoaderSpec stores (a torch dtype's name)
FEATURE_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                  "half": "float16", "fp32": "float32", "float32": "float32", "float": "float32", "int8": "int8"}
QUANTIZED_DTYPE = "int8"    # quantized with per-column scale and offset stored at partition time


def feature_dtype(value) -> str | None:
    """The canonical name (``"bfloat16"``, ``"float16"``, ``"float32"``, ``"int8"``) of a requested feature
    transport dtype, given as one of :data:`FEATURE_DTYPES`' names or a torch dtype; None for None or ``""``
    (features travel as stored).  ValueError for anything else, listing the accepted values.  ``"int8"`` is
    quantized (per-column scale and offset stored at partition time), not cast."""
    if value is None or value == "":
        return None
    if isinstance(value, torch.dtype):
        value = str(value).removeprefix("torch.")
    name = FEATURE_DTYPES.get(value.lower()) if isinstance(value, str) else None
    if name is None:
        raise ValueError(f"feature_dtype must be one of 'bf16', 'fp16', 'fp32', 'int8' (or torch.bfloat16, "
                         f"torch.float16, torch.float32, torch.int8), or None for the stored dtype; got {value!r}")
    return name


def check_loader_args(batch_size: int, world_size: int, rank: int) -> None:
    """ValueError unless ``batch_size`` and ``(rank, world_size)`` are valid for the epoch contract."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
            or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be an integer in 1..{MAX_BATCH_SIZE}, got {batch_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not valid for world_size {world_size} "
                         f"(need 0 <= rank < world_size <= {MAX_WORLD_SIZE})")


def check_input_ids(input_nodes) -> torch.Tensor:
    """``input_nodes`` given as ids, as a flat int64 tensor; raises ``ValueError`` unless they are
    integer ids without repeats (each input node is a seed once per epoch)."""
    ids = torch.as_tensor(input_nodes).reshape(-1)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        # a bool mask would otherwise be read as the ids 0 and 1
        raise ValueError(f"input_nodes must hold integer node ids, got dtype {ids.dtype}; "
                         f"for a mask pass mask.nonzero().view(-1)")
    ids = ids.to(torch.int64)
    uniq = torch.unique(ids)
    if uniq.numel() != ids.numel():
        raise ValueError(f"input_nodes holds {ids.numel() - uniq.numel()} repeated id(s); "
                         f"pass each node once (e.g. torch.unique(ids))")
    return ids


def check_sample_ids(node_ids, num_nodes: int, what: str = "node") -> torch.Tensor:
    """``node_ids`` of one online sample (``Client.sample``) as a flat int64 tensor.

    ValueError (one line, naming the first bad id and the valid range) unless they are a non-empty
    1-D sequence of distinct integer ids in ``0..num_nodes-1`` (original ids of ``what`` nodes).
    The client checks before sending and the session worker again on receipt (the server's word).
    """
    ids = torch.as_tensor(node_ids)
    if ids.dim() != 1:
        raise ValueError(f"node_ids must be a 1-D tensor of original {what} ids, got shape {list(ids.shape)}; "
                         f"pass ids.view(-1)")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"node_ids must hold integer {what} ids, got dtype {ids.dtype}; for a mask pass "
                         f"mask.nonzero().view(-1)")
    if ids.numel() == 0:
        raise ValueError(f"node_ids is empty: give at least one original {what} id in 0..{num_nodes - 1}")
    ids = ids.to(torch.int64)
    bad = ((ids < 0) | (ids >= num_nodes)).nonzero().view(-1)
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"node_ids[{i}] = {int(ids[i])} is outside the graph: original {what} ids are "
                         f"0..{num_nodes - 1}")
    uniq, counts = torch.unique(ids, return_counts=True)
    if uniq.numel() != ids.numel():
        raise ValueError(f"node_ids repeats id {int(uniq[counts > 1][0])}: pass each node once "
                         f"(torch.unique(ids), then index the result)")
    return ids


@dataclass(frozen=True, eq=False)
class NodeInput:
    """The seed nodes of a loader: ``split`` (a stored split's name), or ``ids`` (original node
    ids, distinct, int64), or neither (every node of the type, in the servers' id order).

    ``node_type`` is the seeds' node type; None means the graph's label type (``"_N"`` for a
    homogeneous graph).  Ids are original ids within that type.  ``time`` (PyG's ``input_time``,
    temporal sampling) is each id's seed time, aligned with ``ids`` (None: the seeds' own node times).
    """

    split: str | None = None
    ids: torch.Tensor | None = None
    node_type: str | None = None
    time: torch.Tensor | None = None

    def __post_init__(self):
        if self.node_type is not None:
            type_name(self.node_type, "the input node type")
        if self.split is not None and self.ids is not None:
            raise ValueError("give input nodes as a split name or as ids, not both")
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}: use one of {', '.join(SPLITS)} or a tensor of ids")
        if self.ids is not None:
            object.__setattr__(self, "ids", check_input_ids(self.ids))
        if self.time is not None:
            if self.ids is None:
                raise ValueError("input_time needs input_nodes given as ids or a mask (one time per seed); with a "
                                 "split or every node the seeds' own node times are used (time_attr='time')")
            object.__setattr__(self, "time", seed_times(self.time, self.ids.numel(), "input_time", "input node"))

    @classmethod
    def of(cls, input_nodes, input_time=None) -> NodeInput:
        """From what a user passes as ``input_nodes`` (as PyG's ``NeighborLoader``): a split name, a
        tensor/list of ids, a boolean mask tensor (its True positions are the ids), None (every node),
        or a tuple ``(node_type, split | ids | mask | None)``."""
        if isinstance(input_nodes, NodeInput):
            return input_nodes
        node_type = None
        if isinstance(input_nodes, tuple) and len(input_nodes) == 2 and isinstance(input_nodes[0], str):
            node_type, input_nodes = input_nodes
        if input_time is not None and (input_nodes is None or isinstance(input_nodes, str)):
            return cls(split=input_nodes, node_type=node_type, time=input_time)   # refused, naming the fix
        if input_nodes is None:
            return cls(node_type=node_type)
        if isinstance(input_nodes, str):
            return cls(split=input_nodes, node_type=node_type)
        if isinstance(input_nodes, torch.Tensor) and input_nodes.dtype == torch.bool:
            if input_nodes.dim() != 1:
                raise ValueError(f"input_nodes as a boolean mask must be 1-D (one entry per node), got shape "
                                 f"{list(input_nodes.shape)}")
            return cls(ids=input_nodes.nonzero().view(-1), node_type=node_type, time=input_time)   # PyG's mask form
        return cls(ids=input_nodes, node_type=node_type, time=input_time)

    def type_or(self, label_type: str) -> str:
        """The seeds' node type in a graph whose label type is ``label_type``."""
        return label_type if self.node_type is None else self.node_type

    @property
    def label(self) -> str:
        """The default metrics label of a loader over these seeds (``"train"``, ``"paper:train"``)."""
        base = self.split or "nodes"
        return base if self.node_type is None else f"{self.node_type}:{base}"

    def describe(self) -> str:
        if self.split is not None:
            text = self.split
        else:
            text = "all nodes" if self.ids is None else f"{self.ids.numel()} node ids"
        return text if self.node_type is None else f"{text} of type {self.node_type!r}"

    def __eq__(self, other) -> bool:
        if not isinstance(other, NodeInput):
            return NotImplemented
        if self.split != other.split or self.node_type != other.node_type or (self.ids is None) != (other.ids is None):
            return False
        if not _same_optional(self.time, other.time):
            return False
        return self.ids is None or other.ids is None or torch.equal(self.ids, other.ids)

    def __hash__(self) -> int:
        return hash((self.split, self.node_type, None if self.ids is None else self.ids.numel()))


def seed_times(value, count: int, name: str, what: str) -> torch.Tensor:
    """``value`` as int64 [count] seed times; ValueError naming ``name`` and the fix otherwise."""
    t = torch.as_tensor(value)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer timestamps, got dtype {t.dtype}")
    t = t.reshape(-1).to(torch.int64).contiguous()
    if t.numel() != count:
        raise ValueError(f"{name} has {t.numel()} entries for {count} {what}s: give one time per {what}")
    return t


def _same_optional(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None) == (b is None) and (a is None or b is None or torch.equal(a, b))


NEG_MODES = ("binary", "triplet")
MAX_NEG_AMOUNT = 1 << 10      # negatives per seed edge


@dataclass(frozen=True)
class NegativeSampling:
    """How a link loader draws negative edges for its seed edges (PyG's ``NegativeSampling``).

    ``"binary"``: ``ceil(amount * batch_size)`` negative pairs per batch, labelled 0 in
    ``edge_label``; negative ``j`` keeps the source of seed edge ``j mod batch_size`` and draws its
    destination.  ``"triplet"``: ``amount`` (an integer) negative destinations per seed edge's
    source (``dst_neg_index``).  Destinations are uniform over all nodes.  ``strict`` (default on):
    a drawn pair that is an edge of the graph is redrawn (see :mod:`graphfeed.server.sampling.link`
    for the bound on redraws and what happens when it is reached).
    """

    mode: str
    amount: float = 1.0
    strict: bool = True
    num_hard: int = 0       # num_hard_negatives: per seed edge, drawn from its stored hard-negative list

    def __post_init__(self):
        mode = getattr(self.mode, "value", self.mode)     # PyG's NegativeSamplingMode enum
        if mode not in NEG_MODES:
            raise ValueError(f"neg_sampling mode {mode!r} does not exist: use 'binary' or 'triplet' "
                             f"(or a dict {{'mode': 'binary', 'amount': 1}})")
        object.__setattr__(self, "mode", mode)
        amount = self.amount
        if isinstance(amount, bool) or not isinstance(amount, numbers.Real) or not 0 < amount <= MAX_NEG_AMOUNT:
            raise ValueError(f"neg_sampling amount must be a number in (0, {MAX_NEG_AMOUNT}], got {amount!r}")
        if mode == "triplet" and float(amount) != int(amount):
            raise ValueError(f"neg_sampling amount must be a whole number in triplet mode (negatives per seed "
                             f"edge), got {amount!r}")
        object.__setattr__(self, "amount", float(amount))
        object.__setattr__(self, "strict", bool(self.strict))
        hard = self.num_hard
        if isinstance(hard, bool) or not isinstance(hard, numbers.Integral) or not 0 <= hard <= MAX_NEG_AMOUNT:
            raise ValueError(f"num_hard_negatives must be an integer in 0..{MAX_NEG_AMOUNT}, got {hard!r}")
        if hard > self.amount:
            raise ValueError(f"num_hard_negatives={hard} is more than neg_sampling's amount {self.amount:g} (negatives "
                             f"per seed edge, hard ones included): raise the amount to at least {hard}")
        object.__setattr__(self, "num_hard", int(hard))

    @classmethod
    def of(cls, neg_sampling=None, neg_sampling_ratio=None, num_hard_negatives=None) -> NegativeSampling | None:
        """From PyG's forms: ``"binary"``/``"triplet"``, a dict with ``mode``/``amount`` (and
        ``strict``), a PyG ``NegativeSampling`` object, or the older ``neg_sampling_ratio`` (binary
        with that amount).  None (or a ratio of 0) means no negatives.  ``num_hard_negatives`` (per seed
        edge, from the partition's stored lists) needs negatives."""
        neg = cls._of(neg_sampling, neg_sampling_ratio)
        if not num_hard_negatives:
            return neg
        if neg is None:
            raise ValueError("num_hard_negatives needs negatives: pass neg_sampling (e.g. dict(mode='binary', "
                             f"amount={num_hard_negatives})); hard negatives are part of its amount")
        return dataclasses.replace(neg, num_hard=num_hard_negatives)

    @classmethod
    def _of(cls, neg_sampling=None, neg_sampling_ratio=None) -> NegativeSampling | None:
        if neg_sampling is not None and neg_sampling_ratio is not None:
            raise ValueError("give neg_sampling or neg_sampling_ratio, not both (neg_sampling_ratio=r is "
                             "neg_sampling=dict(mode='binary', amount=r))")
        if neg_sampling is None:
            if neg_sampling_ratio is None or neg_sampling_ratio == 0:
                return None
            return cls("binary", neg_sampling_ratio)
        if isinstance(neg_sampling, cls):
            return neg_sampling
        if isinstance(neg_sampling, str):
            return cls(neg_sampling)
        if isinstance(neg_sampling, Mapping):
            unknown = sorted(set(neg_sampling) - {"mode", "amount", "strict"})
            if unknown or "mode" not in neg_sampling:
                raise ValueError(f"neg_sampling dict needs 'mode' and may have 'amount' and 'strict', got keys "
                                 f"{sorted(neg_sampling)}")
            return cls(**neg_sampling)
        if hasattr(neg_sampling, "mode") and hasattr(neg_sampling, "amount"):   # PyG's NegativeSampling
            return cls(neg_sampling.mode, neg_sampling.amount)
        raise ValueError(f"neg_sampling must be 'binary', 'triplet' or a dict with 'mode' and 'amount', "
                         f"got {neg_sampling!r}")

    def count(self, batch_size: int) -> int:
        """Negatives drawn for a batch of ``batch_size`` seed edges."""
        if self.mode == "triplet":
            return batch_size * int(self.amount)
        return math.ceil(self.amount * batch_size)


@dataclass(frozen=True, eq=False)
class LinkInput:
    """The seed edges of a link loader: ``index`` ([2, E] original node ids, row 0 = sources;
    PyG's ``edge_label_index``), ``label`` ([E] or None: every seed edge is a positive, label 1.0)
    and ``neg`` (None: no negatives).  Or, instead of ``index``, ``split``: a link split stored at
    partition time (``"train"``, ``"val"``, ``"test"``; ``graphfeed partition --link-split``), whose
    seed edges the servers resolve, the parts' lists one after another (no ``label``; on a typed graph
    with the split's ``edge_type``: ``edge_label_index=((src, rel, dst), "val")``).  Or neither
    ``index`` nor ``split`` but ``edge_type``: every edge of that type (PyG's ``edge_label_index=(src, rel,
    dst)``), as if ``index`` were that type's input ``edge_index`` -- the servers list them (from their out-edges,
    ``graphfeed partition --topology both``, or else from every part's in-edges in their folder), each at its
    input position, so batches equal the explicit form's.

    A seed edge belongs to the part that owns its source node; its position in ``index`` is its
    ``input_id``.  ``edge_type`` (a typed graph's ``(src, rel, dst)``; None = the homogeneous graph's one
    edge type) makes row 0 original ids of node type ``src`` and row 1 of ``dst``; negatives then draw
    their destinations over the ``dst`` nodes, checked against that edge type.  With binary negatives
    and labels whose minimum is 0, the labels are shifted by one so that 0 means "negative" (as PyG
    does).  Labels are stored as float32 when given as floats, otherwise int64.
    """

    index: torch.Tensor | None = None
    label: torch.Tensor | None = None
    neg: NegativeSampling | None = None
    edge_type: EdgeType | None = None
    time: torch.Tensor | None = None      # PyG's edge_label_time: each seed edge's time (temporal sampling)
    split: str | None = None
    _shift_labels: bool = field(default=False, init=False, repr=False)   # set from the fields above

    def __post_init__(self):
        if self.split is not None:
            _check_link_split(self)
        elif self.index is not None or self.edge_type is None:
            object.__setattr__(self, "index", check_edge_label_index(self.index))
        if self.edge_type is not None:
            object.__setattr__(self, "edge_type", edge_type(self.edge_type))
        if self.every_edge and (self.label is not None or self.time is not None):
            raise ValueError(f"edge_label_index={self.edge_type} (every edge of the type) takes no edge_label or "
                             f"edge_label_time: pass ({self.edge_type}, edge_index) with one label/time per edge")
        if self.time is not None:
            object.__setattr__(self, "time", seed_times(self.time, self.num_edges, "edge_label_time", "seed edge"))
        if self.label is not None:
            object.__setattr__(self, "label", _edge_labels(self.label, self.index.size(1)))
        if self.neg is not None and not isinstance(self.neg, NegativeSampling):
            raise ValueError(f"neg must be a NegativeSampling record, got {type(self.neg).__name__}")
        binary = self.neg is not None and self.neg.mode == "binary"
        object.__setattr__(self, "_shift_labels", binary and self.label is not None and bool(self.label.min() == 0))

    @classmethod
    def of(cls, edge_label_index, edge_label=None, neg_sampling=None, neg_sampling_ratio=None,
           edge_label_time=None, edge_types=None, num_hard_negatives=None) -> LinkInput:
        """From PyG ``LinkNeighborLoader``'s arguments; ``edge_label_index`` may be ``((src, rel, dst), index)``
        or ``((src, dst), index)`` (PyG's forms for a typed graph; the 2-tuple needs the graph's
        ``edge_types`` to name exactly one edge type from ``src`` to ``dst``), or PyG's "every edge of the
        type" forms: ``(src, rel, dst)`` (or ``(src, dst)``) alone, ``((src, rel, dst), None)``."""
        etype, edge_label_index = _typed_edge_label_index(edge_label_index, edge_types)
        if edge_label_index is None and etype is None and edge_types is not None:
            etype = _only_edge_type(edge_types)   # PyG's default: every edge of the graph's one edge type
        if edge_label_index is None and etype is not None:   # every edge of the type
            return cls(None, edge_label, NegativeSampling.of(neg_sampling, neg_sampling_ratio), etype, edge_label_time)
        if edge_label_index is None:
            raise ValueError("edge_label_index is required: a [2, E] tensor of original node ids (row 0 = "
                             "sources), e.g. data.edge_index for every edge, or a link split name ('train')")
        neg = NegativeSampling.of(neg_sampling, neg_sampling_ratio, num_hard_negatives)
        if isinstance(edge_label_index, str):
            return cls(None, edge_label, neg, etype, edge_label_time, split=edge_label_index)
        return cls(edge_label_index, edge_label, neg, etype, edge_label_time)

    @property
    def num_edges(self) -> int:
        """Seed edges given as ``index`` (0 for a split or every edge: the servers know their number)."""
        return 0 if self.index is None else int(self.index.size(1))

    @property
    def every_edge(self) -> bool:
        """True for "every edge of ``edge_type``" (no ``index``, no ``split``)."""
        return self.index is None and self.split is None

    def labels(self, positions: torch.Tensor) -> torch.Tensor:
        """The labels of the seed edges at ``positions`` as batches carry them (see the class doc)."""
        if self.label is None:
            return torch.ones(positions.numel(), dtype=torch.float32)
        out = self.label.index_select(0, positions)
        return out + 1 if self._shift_labels else out

    @property
    def node_type(self) -> str | None:
        """The seed edges' source node type (None: the label type of a homogeneous graph)."""
        return None if self.edge_type is None else self.edge_type[0]

    def type_or(self, label_type: str) -> str:
        """The node type of the seed edges' sources (``label_type`` when no edge type is given)."""
        return label_type if self.edge_type is None else self.edge_type[0]

    def end_types(self, label_type: str) -> tuple[str, str]:
        """The node types of the seed edges' sources and destinations."""
        return (label_type, label_type) if self.edge_type is None else (self.edge_type[0], self.edge_type[2])

    @property
    def label_name(self) -> str:
        return "link" if self.split is None else f"link:{self.split}"

    def describe(self) -> str:
        neg = "" if self.neg is None else f", {self.neg.mode} negatives x{self.neg.amount:g}"
        typed = "" if self.edge_type is None else f" of type {self.edge_type}"
        seeds = f"{self.num_edges} seed edges" if self.split is None else f"link split {self.split!r}"
        if self.every_edge:
            seeds = "every edge"
        return f"{seeds}{typed}{neg}"

    def __eq__(self, other) -> bool:
        if not isinstance(other, LinkInput):
            return NotImplemented
        if self.neg != other.neg or self.edge_type != other.edge_type or (self.label is None) != (other.label is None) \
                or self.split != other.split:
            return False
        if not _same_optional(self.time, other.time):
            return False
        if self.index is None or other.index is None:
            return self.index is None and other.index is None
        same_label = self.label is None or other.label is None or (
            self.label.dtype == other.label.dtype and torch.equal(self.label, other.label))
        return torch.equal(self.index, other.index) and same_label

    def __hash__(self) -> int:
        return hash((self.num_edges, self.neg, self.edge_type, self.split))


def _check_link_split(link: LinkInput) -> None:
    """ValueError naming the fix unless ``link.split`` is a split name given alone (no index, no labels)."""
    if link.index is not None:
        raise ValueError("give edge_label_index as a link split name or as a [2, E] tensor, not both")
    if link.split not in SPLITS:
        raise ValueError(f"edge_label_index={link.split!r} is not a link split: use one of {', '.join(SPLITS)} "
                         f"(stored by `graphfeed partition --link-split`) or a [2, E] tensor of node ids")
    if link.time is not None:
        raise ValueError(f"edge_label_index={link.split!r}: stored link splits carry no times; pass "
                         f"edge_label_index as a tensor for temporal seed edges")
    if link.label is not None:
        raise ValueError(f"edge_label cannot be given with edge_label_index={link.split!r} (a stored split's "
                         f"edges are positives); pass edge_label_index as a tensor to label the edges yourself")


def _only_edge_type(edge_types) -> EdgeType:
    """The graph's one edge type (what PyG's ``edge_label_index=None`` takes every edge of); ValueError
    naming the graph's edge types when it has several."""
    types = [tuple(e) for e in edge_types]
    if len(types) != 1:
        raise ValueError(f"edge_label_index=None means every edge of the graph's one edge type (as PyG), but this "
                         f"graph has {len(types)} ({', '.join(map(str, types))}): pass (edge type, None) for every "
                         f"edge of one of them, or ((src, rel, dst), index)")
    return edge_type(types[0])


def _is_type_name(value) -> bool:
    """``(src, rel, dst)`` or PyG's ``(src, dst)`` shorthand: a tuple/list of 2 or 3 strings."""
    return isinstance(value, (tuple, list)) and len(value) in (2, 3) and all(isinstance(n, str) for n in value)


def _typed_edge_label_index(value, edge_types=None) -> tuple[EdgeType | None, object]:
    """``(edge type, index)`` of PyG's typed forms ``((src, rel, dst), index)`` / ``((src, dst), index)``;
    ``(edge type, None)`` for the forms that mean every edge of a type (an edge type alone, or with None);
    ``(None, value)`` otherwise."""
    if _is_type_name(value):   # an edge type alone
        value = (value, None)
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and _is_type_name(value[0])):
        return None, value
    return resolve_edge_type(value[0], edge_types), value[1]


def resolve_edge_type(name, edge_types=None) -> EdgeType:
    """``(src, rel, dst)`` as given, or the one edge type of ``edge_types`` from ``src`` to ``dst`` for PyG's
    ``(src, dst)`` shorthand; ValueError naming the candidates when there is none or more than one."""
    if len(name) == 3:
        return edge_type(name)
    src, dst = name
    if edge_types is None:
        raise ValueError(f"edge type {tuple(name)} is PyG's (src, dst) shorthand; give the full (src, rel, dst) "
                         f"here (no graph schema to resolve it)")
    found = [tuple(e) for e in edge_types if e[0] == src and e[2] == dst]
    if len(found) != 1:
        have = ", ".join(map(str, found or [tuple(e) for e in edge_types]))
        raise ValueError(f"edge type ({src!r}, {dst!r}) names {'no' if not found else len(found)} edge type(s) "
                         f"from {src!r} to {dst!r} ({'the graph has' if not found else 'candidates:'} {have}); "
                         f"give the full (src, rel, dst)")
    return edge_type(found[0])


def check_link_ids(link: LinkInput, num_nodes_of) -> None:
    """ValueError naming the fix when ``link``'s ids are outside the graph: ``num_nodes_of(ntype)`` gives the
    node count of a type (the label type's for a homogeneous graph).  A link split's ids are the
    partition's own: nothing to check."""
    if link.index is None:
        return
    for row, (ntype, what) in enumerate(zip(link.end_types(""), ("source", "destination"))):
        n, hi = int(num_nodes_of(ntype or None)), int(link.index[row].max())
        if hi >= n:
            kind = "node" if link.edge_type is None else f"{ntype!r} node ({what} of {link.edge_type})"
            raise ValueError(f"edge_label_index has node id {hi}, outside the graph: original {kind} ids are "
                             f"0..{n - 1}")


def check_edge_label_index(index) -> torch.Tensor:
    """``index`` as a contiguous int64 [2, E] tensor (E >= 1) of non-negative ids; ValueError naming the fix."""
    index = torch.as_tensor(index)
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise ValueError(f"edge_label_index must hold integer node ids, got dtype {index.dtype}")
    if index.dim() != 2 or index.size(0) != 2 or index.size(1) == 0:
        raise ValueError(f"edge_label_index must have shape [2, E] with E >= 1 (row 0 = sources, row 1 = "
                         f"destinations), got {list(index.shape)}")
    index = index.to(torch.int64).contiguous()
    if int(index.min()) < 0:
        raise ValueError(f"edge_label_index has id {int(index.min())}: node ids are >= 0 (original ids)")
    return index


def _edge_labels(label, num_edges: int) -> torch.Tensor:
    label = torch.as_tensor(label).reshape(-1)
    if label.numel() != num_edges:
        raise ValueError(f"edge_label has {label.numel()} entries, edge_label_index has {num_edges} edges: "
                         f"give one label per seed edge")
    if label.dtype.is_complex:
        raise ValueError(f"edge_label must be real numbers, got dtype {label.dtype}")
    if label.dtype.is_floating_point:
        return label.to(torch.float32).contiguous()
    return label.to(torch.int64).contiguous()


SeedInput = NodeInput | LinkInput


def seed_input(value) -> SeedInput:
    """A :class:`LinkInput` as it is; anything else through :meth:`NodeInput.of`."""
    return value if isinstance(value, LinkInput) else NodeInput.of(value)


@dataclass(frozen=True)
class LoaderSpec:
    """Everything a loader asks for.  The batches of an epoch are a function of this record,
    the epoch number and the partition (see :mod:`graphfeed.core.epoch`)."""

    sampling: SamplingSpec
    input: SeedInput = field(default_factory=NodeInput)
    batch_size: int = 1
    shuffle: bool = False
    drop_last: bool = False
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    kind: str = ""        # metrics label ("train", "val", ...); "" = the input's label
    # floating-point features are cast to this dtype by the server before they are buffered and sent
    # (labels, ids and edge data are untouched); None = as stored.  Canonical name, see feature_dtype().
    feature_dtype: str | None = None
    # seeds in the order of the input: batches are consecutive slices of the whole input, not of one
    # partition's list (see graphfeed.core.epoch); ids or every node (original id order), no shuffle
    ordered: bool = False
    # the parts' partial batches packed into batches across parts (as drop_last packs them), so an epoch has
    # PyG's ceil(T / batch_size) batches; False keeps every batch's seeds on one part (graphfeed.core.epoch).
    # LoaderSpec.of sets it unless ordered=False is given by name; off where it changes nothing (ordered,
    # drop_last) and where a batch reads what only its part holds (hard negatives; seed times without input_time)
    pack_partial: bool = False
    # the trainer's hot-feature cache (graphfeed.core.feature_cache): the servers leave these nodes' x
    # rows out of every batch and the client fills them in; None = no cache.  Batches are the same either way.
    feature_cache: CachedIds | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        check_loader_args(self.batch_size, self.world_size, self.rank)
        object.__setattr__(self, "ordered", bool(self.ordered))
        if self.ordered:
            self._check_ordered()
        object.__setattr__(self, "feature_dtype", feature_dtype(self.feature_dtype))
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) \
                or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be an integer in 0..2**64-1, got {self.seed!r}")
        if len(self.kind) > MAX_KIND_LENGTH:
            raise ValueError(f"kind is longer than {MAX_KIND_LENGTH} characters")
        for name in ("shuffle", "drop_last"):
            object.__setattr__(self, name, bool(getattr(self, name)))
        object.__setattr__(self, "pack_partial", bool(self.pack_partial) and not self.ordered and not self.drop_last
                           and not _reads_own_part(self.input, self.sampling))
        for name in ("batch_size", "seed", "rank", "world_size"):
            object.__setattr__(self, name, int(getattr(self, name)))
        if not self.kind:
            object.__setattr__(self, "kind", self.input.label_name if self.is_link else self.input.label)
        if self.is_link and self.sampling.temporal and getattr(self.input, "time", None) is None:
            raise ValueError("time_attr on a link loader needs edge_label_time: give one time per seed edge "
                             "(the time its neighbourhood is sampled at)")
        if self.sampling.exclude_seed_edges and not self.is_link:
            raise ValueError("exclude_seed_edges removes a link batch's seed edges from its sample: it is an option of "
                             "link loaders (link_neighbor_loader), not node loaders")
        if getattr(self.input, "time", None) is not None and not self.sampling.temporal:
            name = "edge_label_time" if self.is_link else "input_time"
            raise ValueError(f"{name} is given but time_attr is not: pass time_attr='time' (node times) or "
                             f"'edge_time' (edge times) for temporal sampling, or leave {name} out")

    def _check_ordered(self) -> None:
        if self.shuffle:
            raise ValueError("ordered=True delivers the seeds in input order: use it with shuffle=False")
        if self.is_link:
            raise ValueError("ordered=True is for node loaders: a link loader's seed edges keep their partition order")
        if self.input.split is not None:
            raise ValueError(f"ordered=True needs input_nodes as ids (or None: every node in id order), got the "
                             f"split {self.input.split!r}: pass its ids, e.g. data.{self.input.split}_mask"
                             f".nonzero().view(-1)")

    def ordered_input(self, num_nodes: int) -> LoaderSpec:
        """This spec with an ordered loader's "every node" input spelled out as the original ids
        ``0..num_nodes-1`` (its input order); any other spec unchanged.  Both loaders call it, so they
        agree on the input (and its fingerprint)."""
        if not self.ordered or not isinstance(self.input, NodeInput) or self.input.ids is not None:
            return self
        return dataclasses.replace(self, input=NodeInput(ids=torch.arange(num_nodes), node_type=self.input.node_type))

    @property
    def ordered_ids(self) -> torch.Tensor:
        """An ordered loader's input ids, in order (after :meth:`ordered_input`); ValueError otherwise."""
        ids = getattr(self.input, "ids", None) if self.ordered else None
        if ids is None:
            raise ValueError("only an ordered loader's spec with its input as ids has ordered_ids: call "
                             "ordered_input(num_nodes) first")
        return ids

    @property
    def is_link(self) -> bool:
        """True when the seeds are edges (:class:`LinkInput`)."""
        return isinstance(self.input, LinkInput)

    @property
    def feature_torch_dtype(self) -> torch.dtype | None:
        """:attr:`feature_dtype` as a torch dtype (None = features as stored)."""
        return None if self.feature_dtype is None else getattr(torch, self.feature_dtype)

    def check_schema(self, node_types: Iterable[str], edge_types: Iterable) -> None:
        """ValueError unless the types this spec names exist in a graph with these node and edge types:
        the input's node type (when set) and every key of a per-edge-type fanout dict."""
        node_types, edge_types = list(node_types), [tuple(e) for e in edge_types]
        etype = getattr(self.input, "edge_type", None)
        if etype is not None and etype not in edge_types:
            raise ValueError(f"edge_label_index names edge type {etype}, which the graph does not have; its edge "
                             f"types are {', '.join(map(str, edge_types))}")
        if self.input.node_type is not None and self.input.node_type not in node_types:
            raise ValueError(f"input_nodes names node type {self.input.node_type!r}, which the graph does not have; "
                             f"its node types are {', '.join(map(repr, node_types))}")
        self.sampling.fanouts_for(edge_types)
        for pair in self.sampling.reverse_edge_types:
            for etype in pair:
                if etype not in edge_types:
                    raise ValueError(f"reverse_edge_types names edge type {etype}, which the graph does not have; its "
                                     f"edge types are {', '.join(map(str, edge_types))}")

    @classmethod
    def of(cls, input_nodes, num_neighbors, **options: Unpack[LoaderOptions]) -> LoaderSpec:
        """From PyG ``NeighborLoader``-style arguments (``input_nodes`` may be a :class:`LinkInput`:
        a link loader); ``options`` are :class:`LoaderOptions` (TypeError for another keyword): its
        :class:`SamplingOptions` keys become the :class:`SamplingSpec`, the others this record's fields;
        ``rank``/``world_size`` default to ``torch.distributed``'s (:func:`resolve_rank`)."""
        check_options(options, LOADER_OPTIONS, "LoaderSpec.of")
        rest: dict = dict(options)
        rank, world_size = resolve_rank(rest.pop("rank", None), rest.pop("world_size", None))
        input_time = rest.pop("input_time", None)
        sampling = SamplingSpec(fanouts(num_neighbors), **{k: rest.pop(k) for k in SAMPLING_OPTIONS if k in rest})
        if input_time is not None:
            if isinstance(input_nodes, LinkInput):
                raise ValueError("a link loader's seed times are edge_label_time, not input_time")
            input_nodes = NodeInput.of(input_nodes, input_time)
        rest["kind"] = rest.get("kind") or ""
        seeds = seed_input(input_nodes)
        by_name = rest.get("ordered") is not None   # ordered=False by name keeps every batch on one part
        if not by_name:
            rest["ordered"] = default_ordered(seeds, bool(rest.get("shuffle", False)))
        return cls(sampling, seeds, rank=rank, world_size=world_size, pack_partial=not by_name, **rest)


def _reads_own_part(seeds: SeedInput, sampling: SamplingSpec) -> bool:
    """Whether a batch reads what only its seeds' own part holds, so batches stay on one part (no
    ``pack_partial``): a link loader's hard negatives (the producing part's stored lists), a temporal node
    loader's seed times without ``input_time`` (the seeds' stored node times)."""
    neg = getattr(seeds, "neg", None)
    if neg is not None and neg.num_hard > 0:
        return True
    return isinstance(seeds, NodeInput) and sampling.temporal and seeds.time is None


def default_ordered(seeds: SeedInput, shuffle: bool) -> bool:
    """A loader's ``ordered`` when not given: True for a node loader without ``shuffle`` whose input is
    ids or every node of the label type -- so its batches come in input order, as PyG's do (layer-wise
    inference ``torch.cat``s the outputs) -- else False.  A split name (``"train"``) keeps the
    part-by-part order: its ids are the servers' (pass them as a tensor for input order); a link loader's
    seed edges keep their partition order; ``ordered=False`` asks for part-by-part order by name (each
    batch from one server: fewer remote hops)."""
    return (not shuffle and isinstance(seeds, NodeInput) and seeds.split is None and seeds.node_type is None)


# ---- the loader options, declared once ----------------------------------------------------------
#
# Every loader (``Client.neighbor_loader`` / ``link_neighbor_loader``, ``LocalNeighborLoader``,
# ``LocalLinkNeighborLoader``) and ``LoaderSpec.of`` take these keywords as ``**options:
# Unpack[...]``.  Defaults are the record fields' defaults.  To add an option: a sampling option is
# one key in SamplingOptions plus the SamplingSpec field of the same name (and its use where hops are
# sampled); an epoch/batch option one key in LoaderOptions plus the LoaderSpec field; an option the
# loader object keeps for itself (not sent to the servers) one key in RemoteLoaderOptions /
# LocalLoaderOptions, popped by the loader before LoaderSpec.of.  Nothing else spells the keywords out.

class SamplingOptions(TypedDict, total=False):
    """How to sample; each key is the :class:`SamplingSpec` field of that name (see it for the forms).

    * ``replace`` (False): sample with replacement; a list of one bool per hop (e.g. ``[False, True]``) sets it
      per hop.
    * ``direction`` ("in"): ``"in"`` samples in-edges (PyG's default), ``"out"`` out-edges.
    * ``weight_attr`` (None): ``"edge_attr"``, ``"edge_attr:K"`` or ``"edge_weight"``: neighbors drawn with
      probability proportional to that edge weight.
    * ``time_attr`` (None): ``"time"`` (node times) or ``"edge_time"``: temporal sampling (disjoint).
    * ``temporal_strategy`` ("uniform"): ``"uniform"`` or ``"last"`` (the most recent neighbours); a list of one
      per hop (e.g. ``["last", "uniform"]``) sets it per hop.
    * ``disjoint`` (False): every seed grows its own subgraph (``batch.batch``).
    * ``exclude_seed_edges`` (False; link loaders): a batch's positive seed edges, and their reverse edges, are
      never sampled into it (DGL's ``exclude="reverse_id"``, GraphStorm's ``exclude_training_targets``).
    * ``reverse_edge_types`` (None; typed graphs): ``{edge type: its reverse edge type}`` for
      ``exclude_seed_edges``; default PyG's ``ToUndirected`` names (``rev_`` + relation).
    """

    replace: bool | Sequence[bool]
    direction: str
    weight_attr: str | None
    time_attr: str | None
    temporal_strategy: str | Sequence[str]
    disjoint: bool
    exclude_seed_edges: bool
    reverse_edge_types: Mapping | None


class LoaderOptions(SamplingOptions, total=False):
    """A loader's keywords besides its seeds and ``num_neighbors`` (PyG's ``NeighborLoader`` names);
    the sampling ones are :class:`SamplingOptions`, the rest :class:`LoaderSpec` fields.

    * ``batch_size`` (1): seeds (seed edges for a link loader) per batch, 1..MAX_BATCH_SIZE.
    * ``shuffle`` (False), ``drop_last`` (False), ``seed`` (0, 0..2**64-1): the epoch contract
      (:mod:`graphfeed.core.epoch`).
    * ``rank`` / ``world_size`` (None: ``torch.distributed``'s, else 0 / 1): this rank's share of the seeds.
    * ``kind`` (None: the input's label, e.g. the split's name): the metrics label.
    * ``feature_dtype`` (None: as stored): ``"bf16"``, ``"fp16"``, ``"fp32"`` or a torch dtype; the servers
      cast floating-point features to it before sending them (labels and ids untouched).  ``"int8"``: quantized
      with the per-column scale and offset stored at partition time (a quarter of fp32's bytes); the loader
      dequantizes (``dequantize=False`` keeps int8 ``x`` with ``x_scale``/``x_offset``).
    * ``ordered`` (None = :func:`default_ordered`: True for a node loader without ``shuffle`` over ids or every
      node, as PyG orders them; node loaders, with ``shuffle=False`` and ids or None as input): seeds in input
      order; ``False`` asks for part-by-part order (each batch's seeds from one server: fewer remote hops, and
      ``sum over parts of ceil(T_p / batch_size)`` batches an epoch).  Left at None, an epoch has PyG's
      ``ceil(T / batch_size)`` batches either way: the parts' partial batches are packed together
      (``LoaderSpec.pack_partial``, :mod:`graphfeed.core.epoch`).
    * ``input_time`` (None; node loaders): one seed time per input id for temporal sampling (default: the
      seeds' stored node times).  A link loader takes ``edge_label_time`` with its seed edges instead.
    """

    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int
    rank: int | None
    world_size: int | None
    kind: str | None
    feature_dtype: str | torch.dtype | None
    ordered: bool | None
    input_time: object


class LocalLoaderOptions(LoaderOptions, total=False):
    """Every loader's keywords: :class:`LoaderOptions` and how batches are handed over
    (:class:`~graphfeed.core.delivery.Delivery`, kept by the loader object, not sent to the servers).

    * ``pin_memory`` (False): batches in page-locked memory (PyG's argument).
    * ``device`` (None: as produced): batches moved to that device, one batch ahead.
    * ``transform`` / ``transform_sampler_output`` (None): callables applied to each batch on the trainer, as
      PyG's (:class:`~graphfeed.core.compat.BatchTransforms`; pass the dataset's transform, e.g.
      ``NormalizeFeatures()``: the servers serve the partitioned features).
    * ``num_workers``, ``persistent_workers``, ``prefetch_factor`` (PyG's DataLoader options): accepted and
      logged once -- the servers do the DataLoader workers' work.
    * ``dequantize`` (True): with ``feature_dtype="int8"``, batches carry float32 ``x`` (``(q + 128) * x_scale +
      x_offset``); False hands ``x`` over as int8 with its ``x_scale`` and ``x_offset`` ([F] float32).
    * ``embeddings`` (None): learnable tables (``client.embedding(...)``; the local loader's
      ``LocalEmbedding``), at most one per node type; each batch carries their rows of its nodes as a leaf
      tensor that requires grad (:mod:`graphfeed.core.embedding`).  Node loaders.
    """

    pin_memory: bool
    device: str | torch.device | None
    transform: Callable | None
    transform_sampler_output: Callable | None
    num_workers: int | None
    persistent_workers: bool | None
    prefetch_factor: int | None
    dequantize: bool
    embeddings: Sequence[Any] | None


class RemoteLoaderOptions(LocalLoaderOptions, total=False):
    """The remote loaders' keywords: :class:`LocalLoaderOptions` and what only the remote loader keeps.

    * ``prefetch`` (4): pulls in flight per server.
    * ``feature_cache_mb`` (None/0 = off): MiB of the label type's highest in-degree nodes' feature rows
      the loader caches; the servers leave those rows out of its batches (same batches, fewer bytes).
    """

    prefetch: int
    feature_cache_mb: float | None


def option_keys(table) -> frozenset[str]:
    """The keys of an options table (a TypedDict class), inherited ones included."""
    return frozenset(table.__required_keys__) | frozenset(table.__optional_keys__)


SAMPLING_OPTIONS = option_keys(SamplingOptions)
LOADER_OPTIONS = option_keys(LoaderOptions)


def check_options(options: Mapping, allowed: Iterable[str], where: str) -> None:
    """TypeError, as Python words it, for the first keyword of ``options`` not in ``allowed``."""
    unknown = [k for k in options if k not in set(allowed)]
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")


def split_options(options: Mapping, table, where: str) -> tuple[dict, LoaderOptions]:
    """``options`` of a loader whose keywords are ``table`` (an options TypedDict extending
    :class:`LoaderOptions`) as ``(the loader's own keywords, the ones for LoaderSpec.of)``; TypeError
    (as Python words it, naming ``where``) for a keyword not in ``table``."""
    check_options(options, option_keys(table), where)
    own = {k: v for k, v in options.items() if k not in LOADER_OPTIONS}
    return own, cast(LoaderOptions, {k: v for k, v in options.items() if k in LOADER_OPTIONS})


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: explicit values, else ``torch.distributed``'s, else ``(0, 1)``."""
    import torch.distributed as dist

    if (rank is None or world_size is None) and dist.is_available() and dist.is_initialized():
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    return int(0 if rank is None else rank), int(1 if world_size is None else world_size)

