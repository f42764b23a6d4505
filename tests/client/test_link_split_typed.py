"""Typed ``graphfeed partition --link-split`` (``--link-edge-type``, ``--link-rev-edge-type``) on ``mag-tiny``.

The split's val/test edges of the chosen edge type, and their reverses in the reverse edge type, are left
out of the stored graph (PyG's ``RandomLinkSplit(edge_types=..., rev_edge_types=...)``); loaders read a
split as ``edge_label_index=((src, rel, dst), "val")``, locally and through 2 servers alike.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch
from helpers.shared import serving
from test_link_typed import _check_typed_link_epoch

from graphfeed.cli.main import main
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.layout import read_meta
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth

WRITES = ("author", "writes", "paper")
WRITTEN_BY = ("paper", "written_by", "author")
FANOUTS = [3, 2]
SHARES = {"val": 0.1, "test": 0.1}


@pytest.fixture(scope="module")
def mag():
    return synth.generate_mag_preset("mag-tiny", seed=0)


@pytest.fixture(scope="module")
def parts_dir(mag, tmp_path_factory):
    out = tmp_path_factory.mktemp("mag_link_split") / "parts"
    builder.partition_graph(mag, 2, out, method="metis", link_split=SHARES, link_edge_type=WRITES,
                            link_rev_edge_type=WRITTEN_BY)
    return out


def _split_eids(root, split) -> np.ndarray:
    return np.concatenate([p.link_split_eids(split).numpy() for p in open_parts(root)[1]])


def _stored_eids(root, etype) -> set[int]:
    return set(np.concatenate([p.edges(etype).topology("csc").eid.numpy() for p in open_parts(root)[1]]).tolist())


def test_held_out_edges_and_their_reverses_are_not_stored(mag, parts_dir):
    meta = read_meta(parts_dir)
    assert meta.link_edge_type() == WRITES and meta.link_splits["val"]["rev_edge_type"] == list(WRITTEN_BY)
    writes = mag.edges[WRITES].edge_index
    held = np.concatenate([_split_eids(parts_dir, "val"), _split_eids(parts_dir, "test")])
    train = _split_eids(parts_dir, "train")
    assert sorted(held.tolist() + train.tolist()) == list(range(writes.shape[1]))
    assert _stored_eids(parts_dir, WRITES) == set(train.tolist())
    held_pairs = set(zip(writes[0, held].tolist(), writes[1, held].tolist()))
    rev = mag.edges[WRITTEN_BY].edge_index
    stored_rev = _stored_eids(parts_dir, WRITTEN_BY)
    assert stored_rev and all(((int(rev[1, e]), int(rev[0, e])) in held_pairs) != (e in stored_rev)
                              for e in range(rev.shape[1]))
    assert _stored_eids(parts_dir, ("paper", "cites", "paper")) == set(range(mag.edges[("paper", "cites",
                                                                                        "paper")].num_edges))


@pytest.mark.parametrize("split", ["val", "train"])
def test_local_split_epoch_covers_the_split_once_with_strict_negatives_of_the_stored_graph(mag, parts_dir, split):
    writes = torch.as_tensor(mag.edges[WRITES].edge_index)
    seeds = writes[:, torch.from_numpy(_split_eids(parts_dir, split))]
    train = writes[:, torch.from_numpy(_split_eids(parts_dir, "train"))]
    loader = LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=(WRITES, split), neg_sampling="binary",
                                     batch_size=256, shuffle=True, seed=1)
    _check_typed_link_epoch(list(loader), seeds, set(zip(*train.tolist())), mag.nodes["paper"].num_nodes)


def test_split_errors_name_the_edge_type(parts_dir, tmp_path, mag):
    with pytest.raises(ValueError, match=r"link splits are of edge type \('author', 'writes', 'paper'\): pass "
                                         r"edge_label_index=\(\('author', 'writes', 'paper'\), 'val'\)"):
        LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index="val")
    with pytest.raises(ValueError, match="needs --link-edge-type SRC,REL,DST"):
        builder.partition_graph(mag, 2, tmp_path / "p", link_split=SHARES)
    with pytest.raises(ValueError, match=r"--link-rev-edge-type paper,cites,paper must go from 'paper' to 'author'"):
        builder.partition_graph(mag, 2, tmp_path / "p", link_split=SHARES, link_edge_type=WRITES,
                                link_rev_edge_type=("paper", "cites", "paper"))


def test_cli_typed_link_split(tmp_path, capsys):
    graph = tmp_path / "mag"
    assert main(["generate", "--preset", "mag-tiny", "--out", str(graph)]) == 0
    out = tmp_path / "parts"
    args = ["partition", str(graph), "--num-parts", "2", "--output", str(out), "--link-split", "val=0.1", "-q"]
    assert main(args) == 2
    assert "--link-edge-type SRC,REL,DST" in capsys.readouterr().err
    assert main(args + ["--link-edge-type", "author,writes,paper", "--link-rev-edge-type",
                        "paper,written_by,author"]) == 0
    meta = read_meta(out)
    assert meta.link_edge_type() == WRITES and set(meta.link_split_sizes()) == {"train", "val"}


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with serving(parts_dir, log_dir=tmp_path_factory.mktemp("mag_link_split_logs")) as servers:
        yield servers


def test_remote_typed_split_batches_equal_local_with_drop_last_on_two_ranks(cluster, parts_dir, connect):
    kw = dict(edge_label_index=(WRITES, "val"), neg_sampling="binary", batch_size=64, shuffle=True, seed=2,
              drop_last=True, world_size=2)
    local = [list(LocalLinkNeighborLoader(parts_dir, FANOUTS, rank=r, **kw)) for r in range(2)]
    with connect([s.address for s in cluster], timeout=60) as client:
        got = [list(client.link_neighbor_loader(FANOUTS, rank=r, **kw)) for r in range(2)]
    size = read_meta(parts_dir).link_split_sizes()["val"]
    assert len(got[0]) == len(got[1]) == len(local[0]) == -(-size // 2) // 64 > 0
    for r in range(2):
        for a, b in zip(got[r], local[r], strict=True):
            assert_same_batch(a, b)
