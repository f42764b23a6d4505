"""The epoch contract (graphfeed.core.epoch): coverage, balance, determinism, errors."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from graphfeed.core.constants import MAX_BATCH_SIZE
from graphfeed.core.epoch import partition_order, plan_epoch, rank_batches

COUNTS = [[1], [7], [100], [0, 5], [5, 0, 3], [64, 64], [65, 1, 130], [1000, 3, 17, 250], [9, 9, 9, 9, 9]]
BATCH_SIZES = [1, 2, 7, 32, 64, 1000]
WORLDS = [1, 2, 3, 4, 8]


def _feasible(counts, batch_size, world):
    chunks = sum(-(-n // batch_size) for n in counts)
    return -(-chunks // world) * world <= sum(counts)


def _combos():
    for counts, bs, w in itertools.product(COUNTS, BATCH_SIZES, WORLDS):
        if _feasible(counts, bs, w):
            yield counts, bs, w


def _plan(counts, bs, w, *, seed=0, epoch=0, shuffle=True, drop_last=False):
    return plan_epoch(counts, bs, w, seed=seed, epoch=epoch, shuffle=shuffle, drop_last=drop_last)


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_input_node_exactly_once_and_ranks_balanced(shuffle):
    checked = 0
    for counts, bs, w in _combos():
        plan = _plan(counts, bs, w, shuffle=shuffle, seed=3, epoch=2)
        assert len(plan) % w == 0
        assert [b.index for b in plan] == list(range(len(plan)))
        seen = Counter((b.part, i) for b in plan for i in range(b.start, b.stop))
        want = {(p, i) for p, n in enumerate(counts) for i in range(n)}
        assert set(seen) == want and set(seen.values()) == {1}, (counts, bs, w)
        assert all(1 <= b.size <= bs for b in plan), (counts, bs, w)
        assert all(0 <= b.start < b.stop <= counts[b.part] for b in plan)
        per_rank = [rank_batches(plan, r, w) for r in range(w)]
        assert len({len(r) for r in per_rank}) == 1
        assert sorted(b.index for r in per_rank for b in r) == list(range(len(plan)))
        assert all(b.index % w == r for r, batches in enumerate(per_rank) for b in batches)
        checked += 1
    assert checked > 200


def test_no_split_needed_keeps_full_batches():
    plan = _plan([100], 10, 5, shuffle=False)
    assert [b.size for b in plan] == [10] * 10
    assert [(b.start, b.stop) for b in plan] == [(i, i + 10) for i in range(0, 100, 10)]
    # 11 chunks for 2 ranks: the largest chunk is split once, nothing else changes.
    plan = _plan([105], 10, 2, shuffle=False)
    assert len(plan) == 12 and sorted(b.size for b in plan) == [5] * 3 + [10] * 9


@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_only_full_batches_equal_counts(shuffle):
    checked = 0
    for counts, bs, w in itertools.product(COUNTS, BATCH_SIZES, WORLDS):
        full = sum(n // bs for n in counts)
        if full < w:
            with pytest.raises(ValueError, match="drop_last"):
                _plan(counts, bs, w, shuffle=shuffle, drop_last=True)
            continue
        plan = _plan(counts, bs, w, shuffle=shuffle, drop_last=True)
        assert len(plan) == full - full % w
        assert all(b.size == bs for b in plan)
        seen = Counter((b.part, i) for b in plan for i in range(b.start, b.stop))
        assert set(seen.values()) == {1}
        assert len({len(rank_batches(plan, r, w)) for r in range(w)}) == 1
        checked += 1
    assert checked > 100


def test_deterministic_in_seed_epoch_rank_world():
    counts, bs = [300, 41, 7], 16
    for w in (1, 2, 3):
        a = _plan(counts, bs, w, seed=5, epoch=1)
        assert a == _plan(counts, bs, w, seed=5, epoch=1)
        for r in range(w):
            assert rank_batches(a, r, w) == rank_batches(_plan(counts, bs, w, seed=5, epoch=1), r, w)
    base = _plan(counts, bs, 2, seed=5, epoch=1)
    assert base != _plan(counts, bs, 2, seed=6, epoch=1)
    assert base != _plan(counts, bs, 2, seed=5, epoch=2)
    assert [b.seed for b in base] != [b.seed for b in _plan(counts, bs, 2, seed=5, epoch=2)]
    assert len({b.seed for b in base}) == len(base), "batch sampling seeds must differ within an epoch"
    assert all(0 <= b.seed < 1 << 63 for b in base)


def test_shuffle_changes_order_across_epochs_not_without_shuffle():
    counts, bs = [500, 200], 10
    orders = [[(b.part, b.start) for b in _plan(counts, bs, 1, seed=0, epoch=e)] for e in range(4)]
    assert len({tuple(o) for o in orders}) == 4
    fixed = [[(b.part, b.start, b.stop) for b in _plan(counts, bs, 1, epoch=e, shuffle=False)] for e in range(3)]
    assert fixed[0] == fixed[1] == fixed[2]
    assert fixed[0] == [(0, s, s + 10) for s in range(0, 500, 10)] + [(1, s, s + 10) for s in range(0, 200, 10)]


def test_partition_order_is_a_seeded_permutation():
    gids = torch.arange(1000, 1100)
    a = partition_order(gids, seed=1, epoch=0, part=0, shuffle=True)
    assert sorted(a.tolist()) == gids.tolist() and not torch.equal(a, gids)
    assert torch.equal(a, partition_order(gids, seed=1, epoch=0, part=0, shuffle=True))
    assert not torch.equal(a, partition_order(gids, seed=1, epoch=1, part=0, shuffle=True))
    assert not torch.equal(a, partition_order(gids, seed=1, epoch=0, part=1, shuffle=True))
    assert torch.equal(partition_order(gids, seed=1, epoch=0, part=0, shuffle=False), gids)


@pytest.mark.parametrize("bs", [0, -1, MAX_BATCH_SIZE + 1, 2.5, "64", None, True])
def test_bad_batch_size_is_a_clear_error(bs):
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        _plan([100], bs, 1)


def test_numpy_integer_batch_size_is_accepted():
    assert len(_plan([100], np.int64(10), 1)) == 10


def test_fewer_nodes_than_ranks_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot be spread over 4 ranks"):
        _plan([2, 1], 8, 4)
    with pytest.raises(ValueError, match="cannot be spread over 1 ranks"):
        _plan([0, 0], 8, 1)


def test_unsplittable_plan_is_an_error_not_an_empty_batch():
    # 5 single-node batches cannot become 6 non-empty ones; 3 parts of 1 node cannot become 4.
    with pytest.raises(ValueError, match="non-empty batches"):
        _plan([5], 1, 2)
    with pytest.raises(ValueError, match="non-empty batches"):
        _plan([1, 1, 1], 5, 2)
    assert sorted(b.size for b in _plan([5], 2, 2, shuffle=False)) == [1, 1, 1, 2]


@pytest.mark.parametrize("w, r", [(0, 0), (2, 2), (2, -1)])
def test_bad_rank_or_world_is_a_clear_error(w, r):
    from graphfeed.core.spec import check_loader_args

    with pytest.raises(ValueError, match="not valid for world_size"):
        check_loader_args(8, w, r)
