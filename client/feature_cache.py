"""Filling a loader's hot-feature cache from the servers (:mod:`graphfeed.core.feature_cache`).

``feature_cache_mb`` is the budget of one loader: ``K = budget // row bytes`` rows (in the loader's
feature dtype), split evenly over the parts (a part with fewer nodes gives what it has).  Each part's
worker sends its highest in-degree nodes of the label type (``rpc_api.hot_rows``, through the group's
:class:`~graphfeed.transport.channel.BatchChannel`) in chunks of at most
:data:`CHUNK_BYTES`.  When the cache cannot be had -- the budget holds no row, the rows cannot be
allocated, a server cannot serve them -- the loader runs without it after one warning; it never fails.
"""
from __future__ import annotations

import logging
import numbers
from typing import TYPE_CHECKING

import torch

from graphfeed.core.feature_cache import MB, FeatureCache
from graphfeed.core.spec import QUANTIZED_DTYPE

if TYPE_CHECKING:
    from graphfeed.client.view import ClientView

CHUNK_BYTES = 4 * MB   # rows per hot_rows call: bounded in bytes, so one answer never grows with the budget
WAIT_SLACK = 30.0      # seconds beyond rpc_timeout one call may take (the channel bounds it by rpc_timeout)
log = logging.getLogger("graphfeed.client")


class CacheUnavailable(Exception):
    """Why a loader runs without its feature cache (logged once, never raised to the trainer)."""


def check_budget(feature_cache_mb) -> float:
    """``feature_cache_mb`` as a float >= 0 (None = 0 = off); ValueError naming the argument otherwise."""
    if feature_cache_mb is None:
        return 0.0
    budget = float(feature_cache_mb) if isinstance(feature_cache_mb, numbers.Real) \
        and not isinstance(feature_cache_mb, bool) else -1.0
    if not 0 <= budget < float("inf"):   # NaN fails too
        raise ValueError(f"feature_cache_mb must be a number of megabytes >= 0 (0 or None = no cache), "
                         f"got {feature_cache_mb!r}")
    return budget


def load_feature_cache(client: ClientView, budget_mb: float, dtype: str | None) -> FeatureCache | None:
    """The label type's hot rows within ``budget_mb`` MiB, cast to ``dtype`` (a canonical feature dtype
    name; None = as stored); None (after one warning) when they cannot be had."""
    if budget_mb <= 0:
        return None
    if dtype == QUANTIZED_DTYPE:   # cached rows would need the batch's int8 scales: not combined (yet)
        log.warning("graphfeed: feature cache of %g MB off: feature_dtype='int8' batches are already a quarter of "
                    "fp32's bytes, and the cache keeps float rows only", budget_mb)
        return None
    try:
        return _load(client, client.label_type, int(budget_mb * MB), dtype)
    except CacheUnavailable as exc:
        log.warning("graphfeed: feature cache of %g MB off, the loader runs without it: %s", budget_mb, exc)
        return None


def _load(client: ClientView, ntype: str, budget: int, dtype: str | None) -> FeatureCache:
    _, probe = _call(client, 0, ntype, 0, 0, dtype)   # no rows: the row width and dtype
    row_bytes = int(probe.size(1)) * probe.element_size()
    total = min(budget // max(row_bytes, 1), client.num_nodes_of(ntype))
    if total <= 0:
        raise CacheUnavailable(f"the budget of {budget} bytes holds no row of {row_bytes} bytes")
    shares = _shares(total, _part_sizes(client, ntype))
    try:
        rows = _allocate(sum(shares), probe)
    except RuntimeError as exc:   # out of memory
        raise CacheUnavailable(f"cannot allocate {sum(shares)} rows of {row_bytes} bytes: {exc}") from None
    ids = torch.empty(sum(shares), dtype=torch.int64)
    at = 0
    for part, share in enumerate(shares):
        at = _fill_part(client, part, ntype, share, dtype, rows, ids, at, max(1, CHUNK_BYTES // max(row_bytes, 1)))
    return FeatureCache.of(ntype, ids[:at], rows[:at])


def _allocate(num_rows: int, like: torch.Tensor) -> torch.Tensor:
    """The cache's one ``[num_rows, F]`` tensor, of ``like``'s width and dtype (RuntimeError when out of memory)."""
    return torch.empty((num_rows, like.size(1)), dtype=like.dtype)


def _part_sizes(client: ClientView, ntype: str) -> list[int]:
    """Nodes of ``ntype`` each part holds: the label type's node ranges, else an even split (a bound the
    workers' short answers correct)."""
    ranges = list(client.servers[0].cluster_info.node_ranges)
    if ntype == client.label_type and len(ranges) == client.num_parts + 1:
        return [ranges[p + 1] - ranges[p] for p in range(client.num_parts)]
    n = client.num_nodes_of(ntype)
    return [n // client.num_parts + (p < n % client.num_parts) for p in range(client.num_parts)]


def _shares(total: int, sizes: list[int]) -> list[int]:
    """``total`` rows split evenly over the parts, none above a part's size; what a small part cannot
    take goes to the others."""
    shares = [0] * len(sizes)
    left = total
    while left > 0:
        open_parts = [p for p, n in enumerate(sizes) if shares[p] < n]
        if not open_parts:
            break
        each = max(1, left // len(open_parts))
        for p in open_parts:
            take = min(each, sizes[p] - shares[p], left)
            shares[p] += take
            left -= take
    return shares


def _fill_part(client: ClientView, part: int, ntype: str, share: int, dtype: str | None, rows: torch.Tensor,
               ids: torch.Tensor, at: int, chunk: int) -> int:
    """Copy part ``part``'s ``share`` hottest rows into ``rows[at:]`` (their ids into ``ids``); the new end."""
    start = 0
    while start < share:
        got_ids, got_rows = _call(client, part, ntype, start, min(chunk, share - start), dtype)
        n = int(got_ids.numel())
        if n == 0:
            break
        rows[at:at + n] = got_rows
        ids[at:at + n] = got_ids
        at, start = at + n, start + n
    return at


def _call(client: ClientView, part: int, ntype: str, start: int, count: int,
          dtype: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``hot_rows`` call to part ``part``'s worker; CacheUnavailable naming the server when it fails."""
    server = client.servers[part].name
    try:
        value = client.group.channel.hot_rows(part, ntype, start, count, dtype).result(
            timeout=client.rpc_timeout + WAIT_SLACK)
    except Exception as exc:  # noqa: BLE001 -- an older server, a featureless type, a lost peer: all mean "no cache"
        text = str(exc).strip().splitlines()
        raise CacheUnavailable(f"{server} cannot serve feature rows: {text[0] if text else type(exc).__name__}") \
            from None
    got_ids, got_rows = value
    if got_rows.dim() != 2 or got_ids.numel() != got_rows.size(0):
        raise CacheUnavailable(f"{server} sent {got_ids.numel()} ids with rows of shape {list(got_rows.shape)}")
    return got_ids, got_rows
