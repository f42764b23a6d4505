"""Deterministic synthetic node-classification graphs shaped like ogbn-products.

Same construction and presets as the shared benchmark generator, so ``graphfeed``
can make its demo and benchmark graphs itself: heavy-tailed (Chung-Lu) degrees,
label-following communities (``homophily``), features = noise + ``signal`` x class
centroid, random node ids, 8% / 2% / 90% train/val/test split.
"""
from __future__ import annotations

import numpy as np

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


def generate_preset(preset: str, seed: int = 0):
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use one of {', '.join(PRESETS)}")
    n, d, f, c = PRESETS[preset]
    return generate(n, d, f, c, seed=seed)
