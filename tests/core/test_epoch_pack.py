"""``pack_partial`` (graphfeed.core.epoch): an epoch of PyG's ``ceil(T / batch_size)`` batches, every seed once."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from graphfeed.core.epoch import plan_epoch, rank_batches

COUNTS = [[1], [100], [0, 5], [5, 0, 3], [64, 64], [65, 1, 130], [1000, 3, 17, 250], [9, 9, 9, 9, 9], [70, 70]]


def _pyg_per_rank(total: int, batch_size: int, world: int) -> int:
    """Batches a rank gets in PyG's DDP recipe: ``DistributedSampler`` then a ``DataLoader`` (no ``drop_last``)."""
    sampler = DistributedSampler(range(total), num_replicas=world, rank=0, shuffle=False)
    return len(DataLoader(range(total), batch_size=batch_size, sampler=sampler))


@pytest.mark.parametrize("shuffle", [False, True])
def test_packed_plan_has_pyg_s_length_and_every_seed_once(shuffle):
    checked = 0
    for counts, bs, w in itertools.product(COUNTS, [1, 2, 7, 32, 64, 1000], [1, 2, 3, 4]):
        total = sum(counts)
        batches = -(-total // bs)
        if -(-batches // w) * w > total:   # no equal share of non-empty batches per rank: a clear error
            with pytest.raises(ValueError, match="non-empty batches|cannot be spread"):
                plan_epoch(counts, bs, w, seed=3, epoch=1, shuffle=shuffle, drop_last=False, pack_partial=True)
            continue
        plan = plan_epoch(counts, bs, w, seed=3, epoch=1, shuffle=shuffle, drop_last=False, pack_partial=True)
        assert len(plan) % w == 0 and len(plan) // w == _pyg_per_rank(total, bs, w), (counts, bs, w)
        seen = Counter((p, i) for b in plan for p, s, e in b.pieces for i in range(s, e))
        assert set(seen) == {(p, i) for p, n in enumerate(counts) for i in range(n)}, (counts, bs, w)
        assert set(seen.values()) == {1}
        assert all(1 <= b.size <= bs for b in plan)
        assert all(b.part == max(b.pieces, key=lambda c: c[2] - c[1])[0] for b in plan)
        assert [len(rank_batches(plan, r, w)) for r in range(w)] == [len(plan) // w] * w
        if w == 1 and sum(n % bs > 0 for n in counts) > 1:   # packed: the leftover seeds come last
            assert all(b.size == bs for b in plan[:-1]), "only the last batch is partial, as PyG's"
        checked += 1
    assert checked > 150


def test_without_pack_partial_the_plan_is_unchanged_and_packing_spans_parts():
    per_part = plan_epoch([140, 100], 64, 1, seed=0, epoch=0, shuffle=False, drop_last=False)
    assert len(per_part) == 3 + 2 and not any(b.packed for b in per_part)
    packed = plan_epoch([140, 100], 64, 1, seed=0, epoch=0, shuffle=False, drop_last=False, pack_partial=True)
    assert len(packed) == 4 and [b.size for b in packed] == [64, 64, 64, 48]
    assert packed[-1].packed == ((0, 128, 140), (1, 64, 100)) and packed[-1].part == 1   # where most seeds are
    assert plan_epoch([140, 100], 64, 1, seed=0, epoch=0, shuffle=False, drop_last=True) == \
        plan_epoch([140, 100], 64, 1, seed=0, epoch=0, shuffle=False, drop_last=True, pack_partial=True)
