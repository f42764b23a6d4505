"""Link splits stored at partition time (``graphfeed partition --link-split``): sizes, held-out edges absent
from the stored graph, loaders over ``edge_label_index="train"|"val"|"test"`` (local == remote, every split
edge once per epoch across ranks), errors naming the fix."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.shared import serving

from graphfeed.cli.main import main
from graphfeed.client.errors import InvalidRequest
from graphfeed.core.epoch import plan_epoch
from graphfeed.core.spec import LinkInput, LoaderSpec
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.layout import PartitionPaths, read_meta
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import SERVING, health_status

N = 600
FANOUTS = [4, 3]
SHARES = {"val": 0.05, "test": 0.1}


@pytest.fixture(scope="module")
def edge_index():
    """A symmetric synthetic graph plus 40 one-way edges and 10 repeated edges (directed pairs, multi-edges)."""
    ei, _, _, _ = synth.generate(N, 6, 8, 3, seed=5)
    rng = np.random.default_rng(1)
    one_way = rng.integers(0, N, size=(2, 40))
    return np.concatenate([ei, one_way, ei[:, :10]], axis=1).astype(np.int64)


def _graph(ei):
    _, x, y, splits = synth.generate(N, 6, 8, 3, seed=5)
    return builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=3, fingerprint="link-split")


@pytest.fixture(scope="module")
def parts_dir(edge_index, tmp_path_factory):
    out = tmp_path_factory.mktemp("link_split") / "parts"
    builder.partition_graph(_graph(edge_index), 2, out, method="metis", topologies=("csc", "csr"), seed=3,
                            link_split=SHARES)
    return out


def _split_eids(root, split) -> np.ndarray:
    """Input edge positions of a split, in split position order (part 0's, then part 1's)."""
    return np.concatenate([p.link_split_eids(split).numpy() for p in open_parts(root)[1]])


def _pair(u, v):
    return (min(u, v), max(u, v))


def test_split_sizes_and_pairs_held_out_together(parts_dir, edge_index):
    meta = read_meta(parts_dir)
    sizes = meta.link_split_sizes()
    assert list(sizes) == ["train", "val", "test"] and sum(sizes.values()) == edge_index.shape[1]
    eids = {s: _split_eids(parts_dir, s) for s in sizes}
    assert sorted(np.concatenate(list(eids.values())).tolist()) == list(range(edge_index.shape[1])), "a partition"
    pairs = {s: {_pair(*edge_index[:, e]) for e in ids.tolist()} for s, ids in eids.items()}
    num_pairs = len({_pair(u, v) for u, v in edge_index.T.tolist()})
    for s, share in SHARES.items():
        assert len(pairs[s]) == round(share * num_pairs), f"{s} holds its share of the node pairs"
        assert sizes[s] == sum(int(np.count_nonzero((np.minimum(*edge_index) == a) & (np.maximum(*edge_index) == b)))
                               for a, b in pairs[s]), "every edge of a held-out pair (both directions, repeats)"
    assert not pairs["val"] & pairs["test"] and not (pairs["val"] | pairs["test"]) & pairs["train"]
    assert meta.link_splits["val"]["share"] == 0.05 and len(meta.link_splits["val"]["sizes"]) == 2


def test_held_out_edges_are_absent_from_the_stored_graph(parts_dir, edge_index):
    meta, parts = open_parts(parts_dir)
    train = set(_split_eids(parts_dir, "train").tolist())
    for kind in ("csc", "csr"):
        stored = np.concatenate([p.topology(kind).eid.numpy() for p in parts])
        assert sorted(stored.tolist()) == sorted(train), f"{kind} stores exactly the train edges"
    # sampling every neighbor of every node sees exactly the train edges (as original-id pairs, with ids)
    loader = LocalNeighborLoader(parts_dir, [-1], batch_size=N, input_nodes=None)
    seen = set()
    for b in loader:
        src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
        assert torch.equal(torch.from_numpy(edge_index)[:, b.e_id], torch.stack([src, dst]))
        seen |= set(b.e_id.tolist())
    assert seen == train
    held = {_pair(*edge_index[:, e]) for s in ("val", "test") for e in _split_eids(parts_dir, s).tolist()}
    assert not held & {_pair(*edge_index[:, e]) for e in seen}, "neither direction of a held-out pair is sampled"


def test_split_choice_is_deterministic_per_seed(parts_dir, edge_index, tmp_path):
    again = tmp_path / "again"
    builder.partition_graph(_graph(edge_index), 2, again, method="metis", seed=3, link_split=SHARES)
    other = tmp_path / "other"
    builder.partition_graph(_graph(edge_index), 2, other, method="metis", seed=4, link_split=SHARES)
    assert np.array_equal(_split_eids(again, "val"), _split_eids(parts_dir, "val"))
    assert not np.array_equal(np.sort(_split_eids(other, "val")), np.sort(_split_eids(parts_dir, "val")))


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_epoch_covers_every_split_edge_once_across_ranks(parts_dir, edge_index, split):
    eids = _split_eids(parts_dir, split)
    stored = set(_split_eids(parts_dir, "train").tolist())
    stored_pairs = {tuple(edge_index[:, e]) for e in stored}
    positions, lens = [], set()
    for rank in range(2):
        loader = LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=split, neg_sampling="binary",
                                         batch_size=32, shuffle=True, seed=2, rank=rank, world_size=2)
        batches = list(loader)
        lens.add(len(batches))
        for b in batches:
            k = b.input_id.numel()
            positions += b.input_id.tolist()
            pos = b.n_id[b.edge_label_index[:, :k]]
            assert torch.equal(pos, torch.from_numpy(edge_index[:, eids[b.input_id.numpy()]])), "the split's edges"
            negs = b.n_id[b.edge_label_index[:, k:]].T.tolist()
            assert k and len(negs) == k and not {tuple(p) for p in negs} & stored_pairs, "strict negatives"
            assert set(b.e_id.tolist()) <= stored, "batches sample the stored (train) graph only"
    assert len(lens) == 1 and sorted(positions) == list(range(eids.size))


def test_link_split_errors_name_the_fix(parts_dir, edge_index, tmp_path):
    plain = tmp_path / "plain"
    meta = builder.partition_graph(_graph(edge_index), 1, plain, method="random")
    assert meta.link_splits == {} and "link_splits" not in json.loads((plain / "META.json").read_text())
    with pytest.raises(ValueError, match=r"no link split 'val' \(it has none\); re-partition with `graphfeed "
                                         r"partition --link-split"):
        LocalLinkNeighborLoader(plain, FANOUTS, edge_label_index="val")
    with pytest.raises(ValueError, match="'valid' is not a link split: use one of train, val, test"):
        LinkInput.of("valid")
    with pytest.raises(ValueError, match="edge_label cannot be given with edge_label_index='val'"):
        LinkInput.of("val", edge_label=torch.ones(3))
    with pytest.raises(ValueError, match="--link-split names train"):
        builder.partition_graph(_graph(edge_index), 1, tmp_path / "x", link_split={"train": 0.5})
    with pytest.raises(ValueError, match="sum to less than 1"):
        builder.partition_graph(_graph(edge_index), 1, tmp_path / "x", link_split={"val": 0.6, "test": 0.5})
    typed = synth.generate_mag_preset("mag-tiny", seed=0)
    with pytest.raises(ValueError, match="--link-split on a typed graph needs --link-edge-type SRC,REL,DST"):
        builder.partition_graph(typed, 1, tmp_path / "typed", link_split={"val": 0.1})   # (test_link_split_typed.py)
    assert not (tmp_path / "typed").exists()
    spec = LoaderSpec.of(LinkInput.of("test", neg_sampling="triplet"), FANOUTS, batch_size=4)
    assert loader_spec_from_proto(open_session_request(spec, "g")) == spec and spec.kind == "link:test"


def test_cli_partition_link_split_and_info(tiny_graph_dir, tmp_path, capsys):
    out = tmp_path / "p"
    args = ["partition", str(tiny_graph_dir), "-p", "2", "--method", "random", "--output", str(out), "--quiet",
            "--link-split", "val=0.05,test=0.10", "--seed", "7"]
    assert main(args) == 0
    capsys.readouterr()
    sizes = read_meta(out).link_split_sizes()
    assert main(args) == 0 and "up to date" in capsys.readouterr().out
    assert main(args[:-4] + ["--link-split", "val=0.1", "--seed", "7"]) == 2
    assert "link split" in capsys.readouterr().err, "another split is a different partitioning"
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert f"link splits     train {sizes['train']:,}, val {sizes['val']:,}, test {sizes['test']:,} seed edges" in info
    with pytest.raises(SystemExit):
        main(args[:-4] + ["--link-split", "val:0.1", "--overwrite"])
    assert "--link-split: item 'val:0.1': write SPLIT=SHARE" in capsys.readouterr().err
    assert (PartitionPaths(out).link_split_file(1, "test", "src")).is_file()


# ---- through 2 servers ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def val_only_dir(edge_index, tmp_path_factory):
    """CSC only, a val split only: test is missing (the server's error), strict checks go to peers."""
    out = tmp_path_factory.mktemp("link_val") / "parts"
    builder.partition_graph(_graph(edge_index), 2, out, method="metis", seed=1, link_split={"val": 0.2})
    return out


@pytest.fixture(scope="module")
def cluster(val_only_dir, tmp_path_factory):
    with serving(val_only_dir, log_dir=tmp_path_factory.mktemp("link_split_logs")) as servers:
        yield servers


@pytest.mark.parametrize("split, neg", [("val", {"mode": "binary", "amount": 2}), ("train", "triplet")])
def test_remote_split_batches_equal_local_on_every_key(cluster, val_only_dir, split, neg, connect):
    kw = dict(edge_label_index=split, neg_sampling=neg, batch_size=40, shuffle=True, seed=6)
    local = list(LocalLinkNeighborLoader(val_only_dir, FANOUTS, **kw))
    with connect([s.address for s in cluster], timeout=60) as client:
        got = list(client.link_neighbor_loader(FANOUTS, prefetch=2, **kw))
    assert len(got) == len(local) > 1
    for a, b in zip(got, local, strict=True):
        assert set(a.keys()) == set(b.keys())
        for key in b.keys():
            assert torch.equal(a[key], b[key]) if torch.is_tensor(b[key]) else a[key] == b[key], key
    size = read_meta(val_only_dir).link_split_sizes()[split]
    assert sorted(p for b in got for p in b.input_id.tolist()) == list(range(size))


def test_remote_drop_last_packs_the_parts_split_remainders_as_local(cluster, val_only_dir, connect):
    """A packed batch's seed edges of the other part come from that part's worker (``input_seeds``)."""
    sizes = read_meta(val_only_dir).link_splits["val"]["sizes"]
    kw = dict(edge_label_index="val", neg_sampling="binary", shuffle=True, seed=6, drop_last=True, world_size=2)
    size = next(b for b in (16, 24, 32, 40, 48)
                if any(e.packed for e in plan_epoch(sizes, b, 2, seed=6, epoch=0, shuffle=True, drop_last=True)))
    local = [list(LocalLinkNeighborLoader(val_only_dir, FANOUTS, batch_size=size, rank=r, **kw)) for r in range(2)]
    with connect([s.address for s in cluster], timeout=60) as client:
        got = [list(client.link_neighbor_loader(FANOUTS, batch_size=size, rank=r, **kw)) for r in range(2)]
    assert len(got[0]) == len(got[1]) == len(local[0]) == -(-sum(sizes) // 2) // size   # PyG's count per rank
    for r in range(2):
        for a, b in zip(got[r], local[r], strict=True):
            for key in b.keys():
                assert torch.equal(a[key], b[key]) if torch.is_tensor(b[key]) else a[key] == b[key], key
    positions = [p for rank in got for b in rank for p in b.input_id.tolist()]
    assert len(set(positions)) == len(positions) == 2 * len(got[0]) * size


def test_remote_missing_split_is_invalid_argument_and_server_stays_up(cluster, val_only_dir, connect):
    with connect([s.address for s in cluster], timeout=60) as client:
        with pytest.raises(InvalidRequest, match=r"no link split 'test' \(it has train, val\); re-partition with "
                                                 r"`graphfeed partition --link-split"):
            client.link_neighbor_loader(FANOUTS, edge_label_index="test")
        ok = client.link_neighbor_loader(FANOUTS, edge_label_index="val", batch_size=64)
        assert sum(b.input_id.numel() for b in ok) == read_meta(val_only_dir).link_split_sizes()["val"]
    for s in cluster:
        assert health_status(s.address) == SERVING
        assert s.proc.poll() is None
