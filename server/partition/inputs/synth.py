"""Deterministic synthetic node-classification graphs: homogeneous ones shaped like ogbn-products,
and typed ones shaped like ogbn-mag (:func:`generate_mag`, presets ``mag-*``).

Same construction and presets as the shared benchmark generator, so ``graphfeed``
can make its demo and benchmark graphs itself: heavy-tailed (Chung-Lu) degrees,
label-following communities (``homophily``), features = noise + ``signal`` x class
centroid, random node ids, 8% / 2% / 90% train/val/test split.
"""
from __future__ import annotations

import numpy as np

from graphfeed.server.partition.inputs.graph import EdgeTypeInput, GraphInput, NodeTypeInput

PRESETS = {  # name: nodes, average undirected degree, feature dim, classes
    "tiny": (10_000, 10, 32, 8),
    "small": (100_000, 20, 64, 16),
    "medium": (600_000, 50, 100, 47),
    "products": (2_449_029, 50, 100, 47),
}


def _edges(rng, y: np.ndarray, classes: int, avg_degree: float, homophily: float) -> np.ndarray:
    n = y.size
    weight = rng.pareto(1.5, size=n) + 1.0
    weight = np.minimum(weight, np.quantile(weight, 0.9999))
    by_class = np.argsort(y, kind="stable")
    cdf = np.cumsum(weight[by_class])
    cdf /= cdf[-1]
    first = np.searchsorted(y[by_class], np.arange(classes), side="left")
    last = np.searchsorted(y[by_class], np.arange(classes), side="right")
    lo = np.concatenate([[0.0], cdf])[first]
    hi = cdf[last - 1]
    m = int(n * avg_degree / 2)
    src = by_class[np.searchsorted(cdf, rng.random(m), side="right").clip(max=n - 1)]
    same_class = rng.random(m) < homophily
    cls = y[src]
    u = rng.random(m)
    pos = np.where(same_class, np.searchsorted(cdf, lo[cls] + u * (hi[cls] - lo[cls]), side="right"),
                   np.searchsorted(cdf, u, side="right")).clip(max=n - 1)
    return np.stack([src, by_class[pos]])


def generate(nodes: int, avg_degree: float, features: int, classes: int, *, seed: int = 0,
             homophily: float = 0.7, signal: float = 0.15):
    """``(edge_index [2,E] int64 symmetric sorted, x float32 [N,F], y int64 [N], splits)``."""
    rng = np.random.default_rng(seed)
    n = nodes
    y = rng.integers(0, classes, size=n, dtype=np.int64)
    src, dst = _edges(rng, y, classes, avg_degree, homophily)
    perm = rng.permutation(n)  # random ids: id order carries no locality
    src, dst = perm[src], perm[dst]
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n)
    y = y[inverse]
    keep = src != dst
    key = np.unique(np.concatenate([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]))
    edge_index = np.stack([key // n, key % n])
    centroids = rng.standard_normal((classes, features)).astype(np.float32)
    x = rng.standard_normal((n, features), dtype=np.float32)
    x += signal * centroids[y]
    ids = rng.permutation(n)
    n_train, n_val = int(0.08 * n), int(0.02 * n)
    splits = {"train": np.sort(ids[:n_train]), "val": np.sort(ids[n_train:n_train + n_val]),
              "test": np.sort(ids[n_train + n_val:])}
    return edge_index, x, y, splits


def hard_negatives(edge_index: np.ndarray, y: np.ndarray, k: int, *, seed: int = 0) -> np.ndarray:
    """int64 [E, k] hard-negative destinations of every edge (the ``hard_neg_dst.npy`` input): nodes of the
    destination's class -- plausible, since edges mostly join a class -- that are not linked to the source nor
    the source itself; ``-1`` where a draw hit one of those (so rows have up to ``k``)."""
    rng = np.random.default_rng(seed)
    n = y.shape[0]
    by_class = np.argsort(y, kind="stable")
    starts = np.searchsorted(y[by_class], np.arange(int(y.max()) + 2))
    cls = y[edge_index[1]]
    size = starts[cls + 1] - starts[cls]
    picks = by_class[starts[cls][:, None] + (rng.random((cls.size, k)) * size[:, None]).astype(np.int64)]
    linked = np.sort(edge_index[0].astype(np.int64) * n + edge_index[1])
    keys = edge_index[0][:, None].astype(np.int64) * n + picks
    pos = np.minimum(np.searchsorted(linked, keys), linked.size - 1)
    bad = (linked[pos] == keys) | (picks == edge_index[0][:, None])
    return np.where(bad, -1, picks).astype(np.int64)


def generate_preset(preset: str, seed: int = 0):
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use one of {', '.join(PRESETS)}")
    n, d, f, c = PRESETS[preset]
    return generate(n, d, f, c, seed=seed)


# ----------------------------------------------------------------------------- typed (MAG-like) graphs

MAG_PRESETS = {
    # name: papers, authors, fields, cites / paper, authors / paper, fields / paper, paper features, classes
    "mag-tiny": (6_000, 3_500, 500, 8, 4, 3, 32, 8),
    "mag-small": (60_000, 35_000, 5_000, 15, 4, 3, 64, 16),
    "mag-medium": (360_000, 200_000, 40_000, 50, 8, 8, 100, 32),
}
MAG_NODE_TYPES = ("paper", "author", "field")
MAG_EDGE_TYPES = (("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "has_topic", "field"),
                  ("paper", "written_by", "author"), ("field", "topic_of", "paper"))
_MAG_HOMOPHILY = {"cites": 0.15, "writes": 0.85, "has_topic": 0.8}   # share of links inside the paper's class
_MAG_SPLIT = (0.10, 0.05)                                         # train, val shares of the papers; test: rest


class _CommunityChooser:
    """Draws nodes with heavy-tailed popularity, either from a given community or from all of them."""

    def __init__(self, rng, community: np.ndarray, classes: int):
        n = community.size
        weight = rng.pareto(1.5, size=n) + 1.0
        weight = np.minimum(weight, np.quantile(weight, 0.9999))
        self.by_community = np.argsort(community, kind="stable")
        self.cdf = np.cumsum(weight[self.by_community])
        self.cdf /= self.cdf[-1]
        first = np.searchsorted(community[self.by_community], np.arange(classes), side="left")
        last = np.searchsorted(community[self.by_community], np.arange(classes), side="right")
        self.lo = np.concatenate([[0.0], self.cdf])[first]
        self.hi = self.cdf[np.maximum(last - 1, 0)]

    def draw(self, rng, wanted: np.ndarray, homophily: float) -> np.ndarray:
        """One node per entry of ``wanted``: of community ``wanted[i]`` with probability ``homophily``."""
        same = rng.random(wanted.size) < homophily
        u = rng.random(wanted.size)
        within = self.lo[wanted] + u * (self.hi[wanted] - self.lo[wanted])
        pos = np.searchsorted(self.cdf, np.where(same, within, u), side="right")
        return self.by_community[pos.clip(max=self.cdf.size - 1)]


def _links(rng, paper_class: np.ndarray, chooser: _CommunityChooser, per_paper: float, homophily: float,
           num_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """``(papers, targets)``: each paper links to ~``per_paper`` distinct targets (at least one)."""
    count = 1 + rng.poisson(max(per_paper - 1.0, 0.0), size=paper_class.size)
    papers = np.repeat(np.arange(paper_class.size, dtype=np.int64), count)
    targets = chooser.draw(rng, paper_class[papers], homophily)
    key = np.unique(papers * num_targets + targets)
    return key // num_targets, key % num_targets


def _relabel(edges: tuple[np.ndarray, np.ndarray], src_perm: np.ndarray, dst_perm: np.ndarray,
             num_dst: int) -> np.ndarray:
    """``[2, E]`` in the random ids, sorted by (source, destination)."""
    key = np.sort(src_perm[edges[0]] * num_dst + dst_perm[edges[1]])
    return np.stack([key // num_dst, key % num_dst])


def generate_mag(papers: int, authors: int, fields: int, cites: float, authors_per_paper: float,
                 fields_per_paper: float, features: int, classes: int, *, seed: int = 0,
                 paper_signal: float = 0.16, field_signal: float = 1.0) -> GraphInput:
    """A deterministic MAG-like typed graph (see :data:`MAG_EDGE_TYPES`).

    Every paper has a class; authors and fields have a community (a class). A paper's authors
    and fields come mostly from its class's community (``_MAG_HOMOPHILY``), its citations only
    somewhat. Paper features are noise plus ``paper_signal`` x its class centroid (a weak
    signal); fields carry a stronger centroid of their community; authors have no features.
    So a paper's label is predictable from its typed 2-hop neighbourhood (paper <- author <-
    paper, paper <- field), much less from its own features. Papers hold y and the splits;
    ids of every type are random (id order carries no locality).
    """
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=papers, dtype=np.int64)
    author_community = rng.integers(0, classes, size=authors, dtype=np.int64)
    field_community = rng.integers(0, classes, size=fields, dtype=np.int64)
    cite = _links(rng, y, _CommunityChooser(rng, y, classes), cites, _MAG_HOMOPHILY["cites"], papers)
    keep = cite[0] != cite[1]
    cite = (cite[0][keep], cite[1][keep])
    write = _links(rng, y, _CommunityChooser(rng, author_community, classes), authors_per_paper,
                   _MAG_HOMOPHILY["writes"], authors)
    topic = _links(rng, y, _CommunityChooser(rng, field_community, classes), fields_per_paper,
                   _MAG_HOMOPHILY["has_topic"], fields)
    perm = {t: rng.permutation(n) for t, n in (("paper", papers), ("author", authors), ("field", fields))}
    centroids = rng.standard_normal((classes, features)).astype(np.float32)
    x_paper = rng.standard_normal((papers, features), dtype=np.float32)
    x_paper += paper_signal * centroids[y]
    x_field = rng.standard_normal((fields, features), dtype=np.float32)
    x_field += field_signal * centroids[field_community]
    writes = _relabel((write[1], write[0]), perm["author"], perm["paper"], papers)
    has_topic = _relabel(topic, perm["paper"], perm["field"], fields)
    edges = {MAG_EDGE_TYPES[0]: _relabel(cite, perm["paper"], perm["paper"], papers),
             MAG_EDGE_TYPES[1]: writes, MAG_EDGE_TYPES[2]: has_topic,
             MAG_EDGE_TYPES[3]: _relabel((write[0], write[1]), perm["paper"], perm["author"], authors),
             MAG_EDGE_TYPES[4]: _relabel((topic[1], topic[0]), perm["field"], perm["paper"], papers)}
    nodes = {"paper": NodeTypeInput(papers, _permuted(x_paper, perm["paper"]), _permuted(y, perm["paper"])),
             "author": NodeTypeInput(authors),
             "field": NodeTypeInput(fields, _permuted(x_field, perm["field"]))}
    return GraphInput.typed(nodes, {e: EdgeTypeInput(ei) for e, ei in edges.items()},
                            _paper_splits(rng, papers), "paper", num_classes=classes)


def _permuted(rows: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Rows moved to their new ids: ``out[perm[i]] = rows[i]``."""
    out = np.empty_like(rows)
    out[perm] = rows
    return out


def _paper_splits(rng, papers: int) -> dict[str, np.ndarray]:
    ids = rng.permutation(papers)
    n_train, n_val = int(_MAG_SPLIT[0] * papers), int(_MAG_SPLIT[1] * papers)
    return {"train": np.sort(ids[:n_train]), "val": np.sort(ids[n_train:n_train + n_val]),
            "test": np.sort(ids[n_train + n_val:])}


def generate_mag_preset(preset: str, seed: int = 0) -> GraphInput:
    if preset not in MAG_PRESETS:
        raise ValueError(f"unknown typed preset {preset!r}: use one of {', '.join(MAG_PRESETS)}")
    graph = generate_mag(*MAG_PRESETS[preset], seed=seed)
    graph.name = f"synth-{preset}"
    return graph


# ----------------------------------------------------------------------------- chunked (bounded-memory) generation

def chunk_name(field: str, index: int) -> str:
    """File name of chunk ``index`` of ``field`` in the chunked ``.npy`` layout (``edge_index_00003.npy``)."""
    return f"{field}_{index:05d}.npy"


def generate_chunked(out, preset: str, *, seed: int = 0, chunk_edges: int = 10_000_000, progress=None,
                     homophily: float = 0.7, signal: float = 0.15) -> dict:
    """Write ``preset`` into the folder ``out`` in the chunked ``.npy`` layout, never holding the edges or
    features whole: ``edge_index_NNNNN.npy`` ([2, <= chunk_edges] int64 each) and ``x_NNNNN.npy`` (row
    chunks of about the same bytes), with ``y.npy`` and the splits whole (O(N)).

    Same model as :func:`generate` (heavy-tailed degrees, label-following communities, random ids, both
    directions of every edge, no self loops) but drawn chunk by chunk, so the graph differs from the
    in-memory preset of the same seed and repeated pairs are not removed (a few per million edges).
    Memory: O(N) for the degree model plus one chunk.  Returns the counts for ``meta.json``.
    """
    from pathlib import Path

    progress = progress or (lambda iterable, desc: iterable)
    out = Path(out)
    n, avg_degree, features, classes = PRESETS[preset]
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n, dtype=np.int64)
    chooser = _CommunityChooser(rng, y, classes)
    perm = rng.permutation(n)
    pairs, per_chunk = int(n * avg_degree / 2), max(1, chunk_edges // 2)
    num_edges, num_chunks = 0, -(-pairs // per_chunk)
    for c in progress(range(num_chunks), "generating edge chunks"):
        crng = np.random.default_rng([seed, 1, c])
        m = min(per_chunk, pairs - c * per_chunk)
        src = chooser.by_community[np.searchsorted(chooser.cdf, crng.random(m), side="right").clip(max=n - 1)]
        dst = chooser.draw(crng, y[src], homophily)
        src, dst = perm[src], perm[dst]
        keep = src != dst
        src, dst = src[keep], dst[keep]
        np.save(out / chunk_name("edge_index", c), np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])]))
        num_edges += 2 * int(src.size)
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n)
    y = y[inverse]
    centroids = rng.standard_normal((classes, features)).astype(np.float32)
    rows = max(1, chunk_edges * 16 // (4 * features))
    for c, start in enumerate(progress(range(0, n, rows), "generating feature chunks")):
        stop = min(start + rows, n)
        x = np.random.default_rng([seed, 2, c]).standard_normal((stop - start, features), dtype=np.float32)
        x += signal * centroids[y[start:stop]]
        np.save(out / chunk_name("x", c), x)
    np.save(out / "y.npy", y)
    ids = rng.permutation(n)
    n_train, n_val = int(0.08 * n), int(0.02 * n)
    for name, idx in (("train", ids[:n_train]), ("val", ids[n_train:n_train + n_val]), ("test", ids[n_train + n_val:])):
        np.save(out / f"{name}_idx.npy", np.sort(idx))
    return dict(nodes=n, directed_edges=num_edges, features=features, classes=classes, edge_chunks=num_chunks)
