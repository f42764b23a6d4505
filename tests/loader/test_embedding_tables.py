"""Learnable embedding tables without servers: the sparse rules against torch.optim, checkpoints, the budget,
the records' checks, and the local loader's batches with rows (graphfeed.core.embedding,
graphfeed.server.embedding)."""
from __future__ import annotations

import pytest
import torch

from graphfeed.core.embedding import (
    EmbeddingSpec,
    SparseAdagrad,
    SparseAdam,
    SparseSGD,
    SparseUpdate,
    coalesce,
    rows_dtype,
)
from graphfeed.server.embedding import EmbeddingStore, LocalEmbedding, PartTable
from graphfeed.server.partition.format.book import RangePartitionBook

BOOK = RangePartitionBook([0, 7, 12])   # two parts: ids 0..6 and 7..11
DIM = 4


class FakeTable:
    """A LocalEmbedding whose gradients the test sets (what a loader's hand-out would collect)."""

    def __init__(self, table: LocalEmbedding):
        self.table, self.spec, self.next = table, table.spec, None

    def take_grads(self):
        out, self.next = self.next, None
        return out

    def push(self, gids, grads, update):
        self.table.push(gids, grads, update)


def _steps(seed: int = 0, n: int = 6):
    """``n`` steps of (ids with duplicates, on both parts; gradient rows)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 12, (9,), generator=gen)
        ids[:2] = torch.tensor([3, 3])   # a duplicate in every batch
        ids[2] = 10                      # and a row of the second part
        out.append((ids, torch.randn(9, DIM, generator=gen)))
    return out


@pytest.mark.parametrize("sparse, dense_optim", [(SparseSGD, torch.optim.SGD), (SparseAdagrad, torch.optim.Adagrad)],
                         ids=["sgd", "adagrad"])
def test_sgd_and_adagrad_equal_dense_torch_optim_on_the_whole_table(sparse, dense_optim):
    spec = EmbeddingSpec("t", "n", DIM, seed=3)
    table = FakeTable(LocalEmbedding(spec, BOOK))
    dense = torch.nn.Parameter(table.table.rows(torch.arange(12)).clone())
    ref = dense_optim([dense], lr=0.1)
    opt = sparse([table], lr=0.1)
    for ids, grads in _steps():
        table.next = (ids, grads)
        opt.step()
        g = torch.zeros(12, DIM)
        g.index_add_(0, ids, grads)   # a sparse gradient coalesced: duplicates summed
        dense.grad = g
        ref.step()
        torch.testing.assert_close(table.table.rows(torch.arange(12)), dense.detach(), rtol=1e-6, atol=1e-6)


def test_adam_equals_torch_adam_per_row_stepped_when_the_row_has_a_gradient():
    spec = EmbeddingSpec("t", "n", DIM, seed=4)
    table = FakeTable(LocalEmbedding(spec, BOOK))
    start = table.table.rows(torch.arange(12))
    rows = [torch.nn.Parameter(start[i].clone()) for i in range(12)]
    refs = [torch.optim.Adam([r], lr=0.05) for r in rows]
    opt = SparseAdam([table], lr=0.05)
    for ids, grads in _steps(seed=1, n=8):
        table.next = (ids, grads)
        opt.step()
        summed = torch.zeros(12, DIM).index_add_(0, ids, grads)
        for i in ids.unique().tolist():
            rows[i].grad = summed[i].clone()
            refs[i].step()
        torch.testing.assert_close(table.table.rows(torch.arange(12)), torch.stack([r.detach() for r in rows]),
                                   rtol=1e-5, atol=1e-6)


def test_adam_touching_every_row_equals_dense_adam():
    spec = EmbeddingSpec("t", "n", DIM, init="uniform", seed=5)
    table = FakeTable(LocalEmbedding(spec, BOOK))
    dense = torch.nn.Parameter(table.table.rows(torch.arange(12)).clone())
    ref = torch.optim.Adam([dense], lr=0.01, betas=(0.8, 0.99))
    opt = SparseAdam([table], lr=0.01, betas=(0.8, 0.99))
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        ids = torch.cat([torch.randperm(12, generator=gen), torch.tensor([0, 11])])
        grads = torch.randn(ids.numel(), DIM, generator=gen)
        table.next = (ids, grads)
        opt.step()
        dense.grad = torch.zeros(12, DIM).index_add_(0, ids, grads)
        ref.step()
    torch.testing.assert_close(table.table.rows(torch.arange(12)), dense.detach(), rtol=1e-5, atol=1e-6)


def test_coalesce_sums_duplicates_in_id_order():
    ids, rows = coalesce(torch.tensor([5, 2, 5]), torch.tensor([[1.0], [2.0], [3.0]]))
    assert ids.tolist() == [2, 5] and rows.view(-1).tolist() == [2.0, 4.0]


def test_coalesce_takes_ascending_ids_as_they_are_and_only_orders_distinct_ones():
    grads = torch.arange(8.0).view(4, 2)
    ids, rows = coalesce(torch.tensor([1, 4, 6, 9]), grads)   # a trainer's already ordered push
    assert ids.tolist() == [1, 4, 6, 9] and torch.equal(rows, grads)
    ids, rows = coalesce(torch.tensor([9, 1, 6, 4]), grads)   # distinct, unordered: put in order, nothing summed
    assert ids.tolist() == [1, 4, 6, 9] and torch.equal(rows, grads[[1, 3, 2, 0]])
    ids, rows = coalesce(torch.tensor([9, 1, 9, 1, 3]), torch.arange(10.0).view(5, 2))
    assert ids.tolist() == [1, 3, 9] and rows.tolist() == [[8.0, 10.0], [8.0, 9.0], [4.0, 6.0]]
    ids, rows = coalesce(torch.tensor([4, 4]), torch.ones(2, 3, dtype=torch.bfloat16))   # ascending, not strict
    assert ids.tolist() == [4] and rows.dtype == torch.float32 and rows.tolist() == [[2.0, 2.0, 2.0]]


def test_rows_travel_in_a_narrow_feature_dtype_only():
    wide, half = EmbeddingSpec("t", "n", DIM), EmbeddingSpec("h", "n", DIM, dtype="bfloat16")
    assert rows_dtype(wide, torch.bfloat16) == "bfloat16" and rows_dtype(wide, torch.float16) == "float16"
    assert rows_dtype(wide, None) is None and rows_dtype(wide, torch.float32) is None
    assert rows_dtype(wide, torch.int8) is None   # int8 features quantize x, never the rows
    assert rows_dtype(half, torch.bfloat16) is None and rows_dtype(half, torch.float16) is None
    table = LocalEmbedding(wide, BOOK)
    ids = torch.tensor([11, 0, 7])
    narrow = table.rows(ids, "bfloat16")
    assert narrow.dtype == torch.bfloat16 and torch.equal(narrow, table.rows(ids).to(torch.bfloat16))
    with pytest.raises(ValueError, match="'int8' is not a table dtype"):
        table.rows(ids, "int8")


def test_initial_rows_depend_on_the_spec_and_the_ids_only():
    spec = EmbeddingSpec("t", "n", DIM, seed=1)
    a, b = LocalEmbedding(spec, BOOK), LocalEmbedding(spec, BOOK)
    assert torch.equal(a.rows(torch.arange(12)), b.rows(torch.arange(12)))
    other = LocalEmbedding(EmbeddingSpec("t", "n", DIM, seed=2), BOOK)
    assert not torch.equal(a.rows(torch.arange(12)), other.rows(torch.arange(12)))
    assert LocalEmbedding(EmbeddingSpec("z", "n", DIM, init="zeros"), BOOK).rows(torch.arange(12)).abs().sum() == 0
    half = LocalEmbedding(EmbeddingSpec("h", "n", DIM, dtype="bfloat16"), BOOK).rows(torch.tensor([1]))
    assert half.dtype == torch.bfloat16 and half.shape == (1, DIM)


def test_checkpoint_round_trip_keeps_rows_and_optimizer_state(tmp_path):
    spec = EmbeddingSpec("t", "n", DIM, seed=6)
    live = FakeTable(LocalEmbedding(spec, BOOK))
    opt = SparseAdam([live], lr=0.05)
    steps = _steps(seed=3, n=6)
    for ids, grads in steps[:3]:
        live.next = (ids, grads)
        opt.step()
    live.table.save(tmp_path, "ckpt")
    assert sorted(p.name for p in (tmp_path / "t" / "ckpt").iterdir()) == ["part_0.pt", "part_1.pt"]
    for ids, grads in steps[3:]:
        live.next = (ids, grads)
        opt.step()
    after = live.table.rows(torch.arange(12))
    restored = FakeTable(LocalEmbedding(spec, BOOK))
    restored.table.load(tmp_path, "ckpt")
    opt2 = SparseAdam([restored], lr=0.05)
    for ids, grads in steps[3:]:   # the same steps from the checkpoint: Adam's moments and counts came back too
        restored.next = (ids, grads)
        opt2.step()
    assert torch.equal(restored.table.rows(torch.arange(12)), after)


def test_checkpoint_errors_name_the_file_and_the_mismatch(tmp_path):
    spec = EmbeddingSpec("t", "n", DIM)
    with pytest.raises(FileNotFoundError, match="has no checkpoint 'nope' for part 0"):
        PartTable.load(tmp_path, "t", "nope", 0)
    LocalEmbedding(spec, BOOK).save(tmp_path, "a")
    with pytest.raises(ValueError, match="dim 8"):
        PartTable.load(tmp_path, "t", "a", 0, EmbeddingSpec("t", "n", 8), 0, 7)
    with pytest.raises(ValueError, match="saved from another partitioning"):
        PartTable.load(tmp_path, "t", "a", 0, spec, 0, 6)
    with pytest.raises(ValueError, match="checkpoint tag '../x'"):
        LocalEmbedding(spec, BOOK).save(tmp_path, "../x")


def test_store_refuses_a_table_over_the_budget_in_one_line():
    store = EmbeddingStore(0, {"n": RangePartitionBook([0, 1000, 2000])}, budget_bytes=100_000)
    store.create(EmbeddingSpec("small", "n", 4))
    with pytest.raises(ValueError) as err:
        store.create(EmbeddingSpec("big", "n", 128))
    text = str(err.value)
    assert "\n" not in text and "embedding_bytes" in text and "needs 1.5 MiB on part 0" in text
    assert list(store.tables) == ["small"]
    with pytest.raises(ValueError, match="already exists in this job with another spec"):
        store.create(EmbeddingSpec("small", "n", 8))
    assert store.create(EmbeddingSpec("small", "n", 4)) == (0, 1000, False, 0)   # the same table again: nothing new
    with pytest.raises(LookupError, match="no embedding table 'big'"):
        store.rows("big", torch.tensor([1]))
    with pytest.raises(ValueError, match="node type 'm' is not in the graph"):
        store.create(EmbeddingSpec("m", "m", 4))
    with pytest.raises(ValueError, match="set embedding_dir"):
        store.save("small", "x")


def test_store_rows_of_its_own_part_and_refused_ids():
    store = EmbeddingStore(1, {"n": BOOK})
    assert store.create(EmbeddingSpec("t", "n", DIM)) == (7, 12, True, 0)
    local = LocalEmbedding(EmbeddingSpec("t", "n", DIM), BOOK)
    assert torch.equal(store.rows("t", torch.tensor([11, 7])), local.rows(torch.tensor([11, 7])))
    with pytest.raises(ValueError, match="id 12 is outside"):
        store.rows("t", torch.tensor([12]))
    with pytest.raises(ValueError, match="not owned by part 1"):
        store.push("t", torch.tensor([3]), torch.zeros(1, DIM), SparseUpdate("sgd", 0.1))
    with pytest.raises(ValueError, match=r"expected \[1, 4\]"):
        store.push("t", torch.tensor([8]), torch.zeros(1, 3), SparseUpdate("sgd", 0.1))


@pytest.mark.parametrize("kwargs, problem", [
    ({"dim": 0}, "dim must be"), ({"dtype": "int8"}, "not a table dtype"), ({"init": "xavier"}, "init 'xavier'"),
    ({"name": "a/b"}, "table name 'a/b'"), ({"scale": -1.0}, "scale must be")])
def test_spec_refuses_bad_values(kwargs, problem):
    args = {"name": "t", "ntype": "n", "dim": 4, **kwargs}
    with pytest.raises(ValueError, match=problem):
        EmbeddingSpec(**args)


def test_update_and_optimizer_refuse_bad_values():
    with pytest.raises(ValueError, match="optimizer rule 'rmsprop'"):
        SparseUpdate("rmsprop", 0.1)
    with pytest.raises(ValueError, match="betas must be"):
        SparseUpdate("adam", 0.1, betas=(0.9, 1.5))
    with pytest.raises(TypeError, match="not an embedding table"):
        SparseAdam([torch.nn.Parameter(torch.zeros(2))])


def test_local_loader_hands_out_rows_that_train(tiny_parts_dir):
    from graphfeed.server.loader.local import LocalNeighborLoader
    from graphfeed.server.partition.format.store import open_parts
    from graphfeed.server.sampling.graph import PartitionedGraph

    graph = PartitionedGraph.in_process(open_parts(tiny_parts_dir)[1])
    table = LocalEmbedding(EmbeddingSpec("nodes", graph.label_type, 8, seed=1), graph.books[graph.label_type])
    loader = LocalNeighborLoader(graph, [3, 2], input_nodes="train", batch_size=16, shuffle=True,
                                 embeddings=[table])
    opt = SparseSGD([table], lr=1.0)
    batch = next(iter(loader))
    assert batch.emb.requires_grad and batch.emb.is_leaf and batch.emb.shape == (batch.n_id.numel(), 8)
    assert torch.equal(batch.emb.detach(), table.rows(batch.emb_gid))
    before = table.rows(batch.emb_gid)
    batch.emb.sum().backward()
    opt.step()
    assert batch.emb_gid.unique().numel() == batch.emb_gid.numel()
    torch.testing.assert_close(table.rows(batch.emb_gid), before - 1.0)   # d(sum)/d(row) = 1, lr 1
    assert table.take_grads() is None   # the step took them
