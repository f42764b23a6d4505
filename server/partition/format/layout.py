"""The on-disk partition format: every path, the META.json schema and its version.

Layout of a partitioned graph folder (``graphfeed partition --output ROOT``)::

    ROOT/META.json                         PartitionMeta (format_version, sizes, ranges, schema)
    ROOT/part_{k}/nodes/{ntype}/x.npy      float features of the nodes part k owns   [n_k, F]
    ROOT/part_{k}/nodes/{ntype}/y.npy      int64 labels                              [n_k]
    ROOT/part_{k}/nodes/{ntype}/orig_id.npy  original id of each owned node          [n_k]
    ROOT/part_{k}/nodes/{ntype}/{split}_idx.npy  global (renumbered) ids of owned split nodes, sorted
    ROOT/part_{k}/edges/{src}__{rel}__{dst}/csc_{indptr,indices,eid}.npy
                                            in-edges of owned dst nodes; indices are global src ids,
                                            eid the edge's position in the input edge_index
    ROOT/part_{k}/edges/.../csr_{indptr,indices,eid}.npy   out-edges (when asked for)
    ROOT/part_{k}/edges/.../{csc,csr}_edge_attr.npy         optional, aligned with indices
    ROOT/part_{k}/edges/.../{csc,csr}_edge_weight.npy       optional float [E_k] sampling weights, aligned
    ROOT/part_{k}/edges/.../link_{split}_{src,dst,eid}.npy  optional (``--link-split``): the seed edges of
                                            link split ``split`` (train/val/test) whose source part k owns,
                                            global src/dst ids and input edge positions, by position
    ROOT/part_{k}/nodes/{ntype}/time.npy   int64 node timestamps (optional; temporal sampling)
    ROOT/part_{k}/nodes/{ntype}/x_q{scale,offset}.npy  float32 [F] per-column int8 quantization of x
                                            (feature_dtype="int8"), the same in every part: computed over the
                                            whole graph's x; partitions written before lack them
    ROOT/part_{k}/edges/.../hard_neg_{src,dst,list}.npy  optional (an input's hard_neg_dst.npy): the input
                                            edges whose source part k owns and their hard-negative destinations,
                                            global src/dst ids sorted by (src, dst), list [M, k] global ids, -1 pad
    ROOT/part_{k}/edges/.../{csc,csr}_edge_time.npy         int64 edge timestamps (optional), aligned with indices
    ROOT/part_{k}/edges/.../{csc,csr}_nbr_time.npy          int64 node timestamp of each neighbor (with time.npy)

Node ids are renumbered per node type so that part k owns the contiguous range
``[node_ranges[ntype][k], node_ranges[ntype][k+1])`` of every node type (see
:class:`RangePartitionBook`), ordered by (part, original id). ``x.npy`` and ``y.npy`` exist
only for types with features / labels; ``{split}_idx.npy`` only for the label type. For an
edge type ``(src, rel, dst)`` the CSC of part k covers its owned ``dst`` nodes with global
``src`` ids, the CSR its owned ``src`` nodes with global ``dst`` ids. A homogeneous graph is
node type ``_N`` with edge type ``("_N", "to", "_N")``.
Within a node's neighbor list, entries are sorted by neighbor global id, then edge id,
so sampling results do not depend on how the list was built.

This module is the only place that knows these names; bump :data:`FORMAT_VERSION`
when any of them changes.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, TypeVar

import numpy as np

T = TypeVar("T")
FORMAT_VERSION = 1
META_FILE = "META.json"
DEFAULT_NODE_TYPE = "_N"
DEFAULT_EDGE_TYPE = ("_N", "to", "_N")
TOPOLOGIES = ("csc", "csr")


LINK_SPLITS = ("train", "val", "test")
# added within version 1 (left out of META.json while they hold these defaults)
_LATER_DEFAULTS = {"label_type": DEFAULT_NODE_TYPE, "num_classes_by_type": {}, "link_splits": {},
                   "edge_weights": [], "method_settings": {}, "access_mass": [], "edge_times": []}


class PartitionFormatError(ValueError):
    """A partition folder is missing, malformed or of another format version."""


def edge_type_dirname(etype: tuple[str, str, str]) -> str:
    return "__".join(etype)


def of_node_type(table: Mapping[str, T], ntype: str) -> T:
    """``table[ntype]`` of a table with an entry per node type of the graph; ValueError naming the types else."""
    entry = table.get(ntype)
    if entry is None:
        raise ValueError(f"unknown node type {ntype!r} is not in the graph; its node types are "
                         f"{', '.join(map(repr, sorted(table)))}: use one of them")
    return entry


@dataclass(frozen=True)
class PartitionMeta:
    """Contents of ``META.json``: everything a reader needs before opening a part.

    ``node_ranges[ntype]`` has ``num_parts + 1`` boundaries in renumbered ids;
    ``features[ntype]`` maps a feature name (``x``, ``y``; absent when the type has none) to
    ``{"shape": [...], "dtype": str}`` (shape excludes the node dimension); ``num_edges`` and
    ``edge_features`` are keyed by :func:`edge_type_dirname`. ``num_classes`` and
    ``split_sizes`` are those of ``label_type``, the one node type with splits;
    ``num_classes_by_type`` covers every type with labels. Keys added after format version 1
    was first written have defaults that describe a homogeneous graph, so older folders read.
    ``link_splits[split]`` (``--link-split``; empty without) is ``{"share": float, "sizes": [per part]}``:
    the share of node pairs asked for and each part's count of that link split's seed edges; the
    val/test edges are not in the stored topology.  On a typed graph each also names the split's
    ``"edge_type"`` ``[src, rel, dst]`` (``--link-edge-type``) and, when its reverse edges were held out
    too, ``"rev_edge_type"``.  ``edge_weights`` lists the edge types (by
    :func:`edge_type_dirname`) stored with sampling weights (an input's ``edge_weight``).
    ``method_settings`` are the assignment's own parameters (``--method hotness``: the pre-sampling's
    ``num_neighbors``, ``batch_size`` and ``epochs``; empty for random and METIS) and ``access_mass``
    each part's sum of pre-sampled access counts (hotness only; empty otherwise).
    """

    num_parts: int
    node_types: list[str]
    edge_types: list[list[str]]
    node_ranges: dict[str, list[int]]
    num_edges: dict[str, int]
    topologies: list[str]
    features: dict[str, dict[str, dict]]
    num_classes: int
    split_sizes: dict[str, int]
    edge_features: dict[str, dict] = field(default_factory=dict)
    label_type: str = DEFAULT_NODE_TYPE    # the node type that holds y and the splits
    num_classes_by_type: dict[str, int] = field(default_factory=dict)
    link_splits: dict[str, dict] = field(default_factory=dict)
    edge_weights: list[str] = field(default_factory=list)
    method_settings: dict = field(default_factory=dict)
    access_mass: list[int] = field(default_factory=list)
    edge_times: list[str] = field(default_factory=list)   # edge types (dirnames) with edge timestamps
    graph_name: str = ""
    method: str = "random"
    edge_cut: int = 0
    source_fingerprint: str = ""
    seed: int = 0
    format_version: int = FORMAT_VERSION

    @property
    def num_nodes(self) -> int:
        return sum(r[-1] for r in self.node_ranges.values())

    @property
    def is_homogeneous(self) -> bool:
        return self.node_types == [DEFAULT_NODE_TYPE] and [tuple(e) for e in self.edge_types] == [DEFAULT_EDGE_TYPE]

    def link_split_sizes(self, part: int | None = None) -> dict[str, int]:
        """Seed edges of every link split (of part ``part``, or of the whole graph); empty without splits."""
        splits = [(name, self.link_splits[name]) for name in LINK_SPLITS if name in self.link_splits]
        return {name: int(sum(s["sizes"]) if part is None else s["sizes"][part]) for name, s in splits}

    def link_edge_type(self) -> tuple[str, str, str] | None:
        """The edge type of the stored link splits on a typed graph (None: homogeneous, or no splits)."""
        named = [s["edge_type"] for s in self.link_splits.values() if s.get("edge_type")]
        return (named[0][0], named[0][1], named[0][2]) if named else None

    def edge_type_tuples(self) -> list[tuple[str, str, str]]:
        return [(e[0], e[1], e[2]) for e in self.edge_types]

    def classes_of(self, ntype: str) -> int:
        """Number of classes of ``ntype``'s labels (0 when it has none)."""
        default = self.num_classes if ntype == self.label_type else 0
        return int(self.num_classes_by_type.get(ntype, default))

    def to_json(self) -> str:
        """Keys added after version 1 are left out while they hold their (homogeneous) defaults, so a
        homogeneous partition's META.json stays readable by graphfeed releases that predate them."""
        data = {k: v for k, v in asdict(self).items() if not (k in _LATER_DEFAULTS and v == _LATER_DEFAULTS[k])}
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "PartitionMeta":
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise PartitionFormatError(
                f"partition format_version {version!r} is not supported by this graphfeed "
                f"(it reads version {FORMAT_VERSION}); re-run `graphfeed partition` with this version")
        try:
            return cls(**d)
        except TypeError as exc:
            raise PartitionFormatError(f"META.json does not match format version {FORMAT_VERSION}: {exc}") from exc


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def part_files_identity(root: str | os.PathLike, part_id: int) -> tuple | None:
    """What shows that two processes read the very same files of part ``part_id``: this host's boot id,
    and the device, inode and modification time of the part's folder and of ``META.json``.  Equal
    identities mean the same host (the same boot) and the same files, which then share one page
    cache.  None when the part's folder or the boot id cannot be read."""
    paths = PartitionPaths(root)
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            boot = f.read().strip()
        folder, meta = os.stat(paths.part(part_id)), os.stat(paths.meta)
    except OSError:
        return None
    return (boot, folder.st_dev, folder.st_ino, folder.st_mtime_ns, meta.st_dev, meta.st_ino, meta.st_mtime_ns)


class PartitionPaths:
    """Every path inside a partition folder, in one place."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @property
    def meta(self) -> Path:
        return self.root / META_FILE

    def part(self, k: int) -> Path:
        return self.root / f"part_{k}"

    def node_dir(self, k: int, ntype: str = DEFAULT_NODE_TYPE) -> Path:
        return self.part(k) / "nodes" / ntype

    def node_file(self, k: int, name: str, ntype: str = DEFAULT_NODE_TYPE) -> Path:
        return self.node_dir(k, ntype) / f"{name}.npy"

    def split_file(self, k: int, split: str, ntype: str = DEFAULT_NODE_TYPE) -> Path:
        return self.node_file(k, f"{split}_idx", ntype)

    def edge_dir(self, k: int, etype=DEFAULT_EDGE_TYPE) -> Path:
        return self.part(k) / "edges" / edge_type_dirname(tuple(etype))

    def edge_file(self, k: int, topology: str, name: str, etype=DEFAULT_EDGE_TYPE) -> Path:
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
        return self.edge_dir(k, etype) / f"{topology}_{name}.npy"

    def quant_file(self, k: int, name: str, ntype: str = DEFAULT_NODE_TYPE, column: str = "x") -> Path:
        """``name`` (``scale`` or ``offset``) of node type ``ntype``'s int8 quantization of ``column`` (a quantizable
        stored column: ``x``) in part ``k``."""
        if name not in ("scale", "offset"):
            raise ValueError(f"a quantization file is 'scale' or 'offset', got {name!r}")
        return self.node_file(k, f"{column}_q{name}", ntype)

    def hard_neg_file(self, k: int, name: str, etype=DEFAULT_EDGE_TYPE) -> Path:
        """``name`` (``src``, ``dst`` or ``list``) of part ``k``'s stored hard negatives of edge type ``etype``."""
        if name not in ("src", "dst", "list"):
            raise ValueError(f"a hard-negative file is 'src', 'dst' or 'list', got {name!r}")
        return self.edge_dir(k, etype) / f"hard_neg_{name}.npy"

    def link_split_file(self, k: int, split: str, name: str, etype=DEFAULT_EDGE_TYPE) -> Path:
        """``name`` (src, dst or eid) of part ``k``'s seed edges of link split ``split``."""
        if split not in LINK_SPLITS:
            raise ValueError(f"link split must be one of {LINK_SPLITS}, got {split!r}")
        return self.edge_dir(k, etype) / f"link_{split}_{name}.npy"


def read_meta(root: str | os.PathLike) -> PartitionMeta:
    """Read and validate ``ROOT/META.json``; raises :class:`PartitionFormatError`."""
    path = PartitionPaths(root).meta
    if not path.is_file():
        raise PartitionFormatError(
            f"{path} not found: {root} is not a graphfeed partition folder "
            f"(create one with `graphfeed partition --output {root} ...`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PartitionFormatError(f"{path} is not valid JSON ({exc}); re-run `graphfeed partition`") from exc
    return PartitionMeta.from_dict(data)


def write_meta(root: str | os.PathLike, meta: PartitionMeta) -> None:
    """Write META.json (fsynced); the builder writes it last."""
    path = PartitionPaths(root).meta
    with open(path, "w") as fh:
        fh.write(meta.to_json())
        fh.flush()
        os.fsync(fh.fileno())


def save_array(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.ascontiguousarray(array))


def load_array(path: Path) -> np.ndarray:
    """Memory-map an array copy-on-write: pages are read on demand, never written back."""
    if not path.is_file():
        raise PartitionFormatError(f"{path} is missing: the partition folder is incomplete; "
                                   f"re-run `graphfeed partition`")
    try:
        return np.load(path, mmap_mode="c")
    except (ValueError, OSError) as exc:
        raise PartitionFormatError(f"{path} is not a readable .npy file ({exc}); re-run `graphfeed partition`") from exc
