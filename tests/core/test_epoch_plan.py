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


def _pyg_drop_last_seeds_per_rank(total, bs, w):
    """What PyG keeps per rank: ``DistributedSampler`` (padded to a multiple of ``w``), then the
    DataLoader's ``drop_last`` -- computed with torch's own classes."""
    from torch.utils.data import DataLoader, DistributedSampler

    data = list(range(total))
    kept = []
    for rank in range(w):
        sampler = DistributedSampler(data, num_replicas=w, rank=rank, shuffle=False)
        kept.append(sum(len(b) for b in DataLoader(data, batch_size=bs, sampler=sampler, drop_last=True)))
    assert len(set(kept)) == 1
    return kept[0]


@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_drops_what_pyg_drops_full_batches_equal_counts(shuffle):
    checked = packed = 0
    for counts, bs, w in itertools.product(COUNTS + [[42, 42, 43], [63, 64], [70, 70]], BATCH_SIZES, WORLDS):
        total = sum(counts)
        per_rank = _pyg_drop_last_seeds_per_rank(total, bs, w)
        if per_rank == 0:
            with pytest.raises(ValueError, match="drop_last"):
                _plan(counts, bs, w, shuffle=shuffle, drop_last=True)
            continue
        plan = _plan(counts, bs, w, shuffle=shuffle, drop_last=True)
        assert all(b.size == bs for b in plan), (counts, bs, w)
        assert [len(rank_batches(plan, r, w)) * bs for r in range(w)] == [per_rank] * w, (counts, bs, w)
        assert total - len(plan) * bs <= w * (bs - 1)      # at most batch_size - 1 per rank not seen
        seen = Counter((p, i) for b in plan for p, s, e in b.pieces for i in range(s, e))
        assert all(0 <= s < e <= counts[p] for b in plan for p, s, e in b.pieces)
        if len(plan) * bs <= total:                         # nothing repeated ...
            assert set(seen.values()) == {1}, (counts, bs, w)
        else:                                               # ... but PyG's padding: < w seeds again, all seen
            assert len(plan) * bs - total <= w - 1 and len(seen) == total, (counts, bs, w)
        for b in plan:
            assert bool(b.packed) == (len(b.pieces) > 1)
            if b.packed:   # produced by the part holding most of its seeds
                assert max(e - s for p, s, e in b.pieces if p == b.part) == max(e - s for _, s, e in b.pieces)
        packed += sum(bool(b.packed) for b in plan)
        checked += 1
    assert checked > 100 and packed > 50


def test_drop_last_on_cora_like_splits_keeps_what_pyg_keeps():
    """The issue's case: 140 training seeds over 2 parts, 2 ranks -- today's 64 was 1 batch of 64."""
    for counts in ([70, 70], [75, 65], [90, 50], [139, 1]):
        plan = _plan(counts, 64, 2, drop_last=True)
        assert len(plan) == 2 and sum(b.size for b in plan) == 128 == 2 * _pyg_drop_last_seeds_per_rank(140, 64, 2)
    # every seed a batch: packing never needs to drop a full batch's worth
    plan = _plan([33, 31], 32, 2, shuffle=False, drop_last=True)
    assert [b.pieces for b in plan] == [((0, 0, 32),), ((0, 32, 33), (1, 0, 31))]
    assert [b.part for b in plan] == [0, 1]


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
