"""Partition round trips: every node, edge (with its id), feature, label and split survives, by id.

Checks are made in original ids against the input arrays, through the reader API
(:func:`open_parts`), for random and METIS assignment, 1/2/4 parts, CSC and CSR.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from graphfeed.cli.main import main
from graphfeed.core.constants import SPLITS
from graphfeed.server.partition.build.builder import assign_parts, edge_cut, partition_graph
from graphfeed.server.partition.format.layout import read_meta
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs.reader import read_graph

PARTS = (1, 2, 4)
METHODS = ("random", "metis")


# ---------------------------------------------------------------------------------- the check

def _orig_of_gid(parts) -> np.ndarray:
    return np.concatenate([p.orig_id.numpy() for p in parts])


def _check_nodes(meta, parts, graph) -> np.ndarray:
    n = graph.num_nodes
    ranges = meta.node_ranges["_N"]
    assert ranges[0] == 0 and ranges[-1] == n and len(ranges) == meta.num_parts + 1
    assert all(a <= b for a, b in zip(ranges, ranges[1:]))
    for k, part in enumerate(parts):
        assert (part.start, part.stop) == (ranges[k], ranges[k + 1])
        assert part.orig_id.numel() == part.x.shape[0] == part.y.numel() == part.num_nodes
    orig = _orig_of_gid(parts)
    # every node in exactly one part
    np.testing.assert_array_equal(np.sort(orig), np.arange(n))
    for part in parts:
        ids = part.orig_id.numpy()
        np.testing.assert_array_equal(part.x.numpy(), graph.x[ids])
        np.testing.assert_array_equal(part.y.numpy(), graph.y[ids])
    return orig


def _check_splits(parts, graph, orig) -> None:
    for split in SPLITS:
        pieces = []
        for part in parts:
            gids = part.split(split).numpy()
            assert np.all(np.diff(gids) > 0), "split ids must be sorted and unique"
            assert gids.size == 0 or (gids.min() >= part.start and gids.max() < part.stop)
            pieces.append(orig[gids])
        np.testing.assert_array_equal(np.sort(np.concatenate(pieces)), np.sort(graph.splits[split]))


def _check_topology(parts, graph, orig, kind: str) -> None:
    seen_eids = []
    for part in parts:
        topo = part.topology(kind)
        indptr, nbr, eid = topo.indptr.numpy(), topo.indices.numpy(), topo.eid.numpy()
        assert indptr[0] == 0 and indptr[-1] == nbr.size == eid.size
        owner = part.start + np.repeat(np.arange(part.num_nodes), np.diff(indptr))
        src, dst = (nbr, owner) if kind == "csc" else (owner, nbr)
        # every stored edge is the input edge with that id, in original ids
        np.testing.assert_array_equal(orig[src], graph.edge_index[0, eid])
        np.testing.assert_array_equal(orig[dst], graph.edge_index[1, eid])
        # neighbor lists sorted by (neighbor gid, eid)
        same = owner[1:] == owner[:-1]
        ordered = (nbr[1:] > nbr[:-1]) | ((nbr[1:] == nbr[:-1]) & (eid[1:] > eid[:-1]))
        assert np.all(ordered[same])
        seen_eids.append(eid)
    # union over parts = the input edge set: every edge id exactly once
    np.testing.assert_array_equal(np.sort(np.concatenate(seen_eids)), np.arange(graph.edge_index.shape[1]))


def assert_round_trip(root, graph, topologies=("csc", "csr")) -> None:
    meta, parts = open_parts(root)
    assert meta.source_fingerprint == graph.fingerprint
    assert meta.num_edges == {"_N__to___N": graph.edge_index.shape[1]}
    orig = _check_nodes(meta, parts, graph)
    _check_splits(parts, graph, orig)
    for kind in topologies:
        _check_topology(parts, graph, orig, kind)
    if graph.edge_attr is not None:
        for part in parts:
            for kind in topologies:
                stored = np.load(part.paths.edge_file(part.part_id, kind, "edge_attr"))
                np.testing.assert_array_equal(stored, graph.edge_attr[part.topology(kind).eid.numpy()])


# ---------------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("num_parts", PARTS)
@pytest.mark.parametrize("method", METHODS)
def test_round_trip_tiny(tiny_graph, tmp_path, method, num_parts):
    meta = partition_graph(tiny_graph, num_parts, tmp_path / "p", method=method, topologies=("csc", "csr"))
    assert meta.num_parts == num_parts and meta.method == method
    assert_round_trip(tmp_path / "p", tiny_graph)


@pytest.mark.parametrize("num_parts", PARTS)
@pytest.mark.parametrize("method", METHODS)
def test_round_trip_cora(cora_dir, tmp_path, method, num_parts):
    graph = read_graph(cora_dir)
    assert (graph.num_nodes, graph.edge_index.shape[1]) == (2708, 10556)
    assert {k: v.size for k, v in graph.splits.items()} == {"train": 140, "val": 500, "test": 1000}
    partition_graph(graph, num_parts, tmp_path / "p", method=method, topologies=("csc", "csr"))
    assert_round_trip(tmp_path / "p", graph)


def test_round_trip_pyg_data_with_edge_features(tmp_path):
    """A PyG Data saved with torch.save, masks instead of id lists, edge_attr carried by edge id."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    n, e = 300, 2000
    edge_index = torch.randint(0, n, (2, e), generator=g)
    train = torch.zeros(n, dtype=torch.bool)
    train[:60] = True
    data = Data(x=torch.randn(n, 5, generator=g), y=torch.randint(0, 4, (n,), generator=g), edge_index=edge_index,
                edge_attr=torch.arange(e * 2, dtype=torch.float32).reshape(e, 2), train_mask=train,
                val_mask=torch.arange(n) % 10 == 7, test_mask=torch.arange(n) >= 200)
    torch.save(data, tmp_path / "g.pt")
    graph = read_graph(tmp_path / "g.pt")
    np.testing.assert_array_equal(graph.splits["train"], np.arange(60))
    assert graph.splits["val"].size == 30 and graph.splits["test"].size == 100
    meta = partition_graph(graph, 3, tmp_path / "p", method="metis", topologies=("csc", "csr"))
    assert meta.edge_features == {"_N__to___N": {"shape": [2], "dtype": "float32"}}
    assert_round_trip(tmp_path / "p", graph)


# ---------------------------------------------------------------------------------- assignment

def test_metis_balances_nodes_and_training_nodes_and_cuts_fewer_edges(tiny_graph):
    n, train = tiny_graph.num_nodes, tiny_graph.splits["train"]
    metis = assign_parts(tiny_graph, 4, "metis", seed=0)
    random = assign_parts(tiny_graph, 4, "random", seed=0)
    nodes = np.bincount(metis, minlength=4)
    trains = np.bincount(metis[train], minlength=4)
    assert nodes.max() <= 1.05 * n / 4 and nodes.min() >= 0.95 * n / 4, nodes
    assert trains.max() <= 1.10 * train.size / 4 and trains.min() >= 0.90 * train.size / 4, trains
    assert edge_cut(tiny_graph.edge_index, metis) < 0.6 * edge_cut(tiny_graph.edge_index, random)


def test_assignment_is_deterministic_per_seed(tiny_graph):
    for method in METHODS:
        np.testing.assert_array_equal(assign_parts(tiny_graph, 3, method, seed=5),
                                      assign_parts(tiny_graph, 3, method, seed=5))
    assert not np.array_equal(assign_parts(tiny_graph, 3, "random", seed=5),
                              assign_parts(tiny_graph, 3, "random", seed=6))


def test_fingerprint_tracks_content(tiny_graph_dir, tmp_path):
    a, b = read_graph(tiny_graph_dir), read_graph(tiny_graph_dir)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    for f in ("edge_index", "x", "y", "train_idx", "val_idx", "test_idx"):
        os.symlink(tiny_graph_dir / f"{f}.npy", tmp_path / f"{f}.npy")
    x = np.array(np.load(tiny_graph_dir / "x.npy"))
    x[123, 4] += 1.0
    os.unlink(tmp_path / "x.npy")
    np.save(tmp_path / "x.npy", x)
    assert read_graph(tmp_path).fingerprint != a.fingerprint


# ---------------------------------------------------------------------------------- CLI

def test_cli_partition_up_to_date_and_info(tiny_graph_dir, tmp_path, capsys):
    out = tmp_path / "p"
    args = ["partition", str(tiny_graph_dir), "--num-parts", "2", "--method", "random", "--output", str(out),
            "--topology", "both", "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    meta = read_meta(out)
    assert meta.topologies == ["csc", "csr"] and meta.seed == 0
    assert f"edge cut: {meta.edge_cut:,} of {sum(meta.num_edges.values()):,}" in printed
    assert "train" in printed and "10,000" in printed
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert main(args) == 0
    assert "up to date" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "format version  1" in info and "random (seed 0), 2 part(s)" in info
    assert f"{meta.node_ranges['_N'][1]:,}" in info


def test_cli_partition_overwrite_replaces(tiny_graph_dir, tmp_path, capsys):
    out = tmp_path / "p"
    base = ["partition", str(tiny_graph_dir), "--output", str(out), "--quiet", "--method", "random"]
    assert main(base + ["--num-parts", "2"]) == 0
    assert main(base + ["--num-parts", "3", "--overwrite"]) == 0
    assert read_meta(out).num_parts == 3
    assert sorted(p.name for p in out.iterdir()) == ["META.json", "part_0", "part_1", "part_2"]
    assert [p.name for p in tmp_path.iterdir()] == ["p"], "no temporary or old folders left behind"


def test_generate_cli_writes_npy_layout(tmp_path, capsys):
    assert main(["generate", "--preset", "tiny", "--out", str(tmp_path / "g"), "--seed", "3"]) == 0
    assert "10,000 nodes" in capsys.readouterr().out
    graph = read_graph(tmp_path / "g")
    assert graph.num_nodes == 10_000 and graph.x.shape[1] == 32 and graph.name == "synth-tiny"
    assert main(["generate", "--preset", "tiny", "--out", str(tmp_path / "g")]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_generate_skip_existing_skips_what_exists_and_makes_only_what_is_missing(tmp_path, capsys):
    """``graphfeed demo`` twice in one clone: its ``generate --skip-existing`` must skip the graph it made."""
    out = tmp_path / "g"
    args = ["generate", "--preset", "tiny", "--out", str(out), "--skip-existing"]
    assert main(args) == 0 and "wrote" in capsys.readouterr().out
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(args) == 0 and "up to date" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps, "nothing rewritten"
    # only the hard negatives are missing: they are added, as generate --hard-negatives writes them
    assert main([*args, "--hard-negatives", "3"]) == 0 and "added hard_neg_dst.npy" in capsys.readouterr().out
    assert main(["generate", "--preset", "tiny", "--out", str(tmp_path / "h"), "--hard-negatives", "3"]) == 0
    assert (out / "hard_neg_dst.npy").read_bytes() == (tmp_path / "h" / "hard_neg_dst.npy").read_bytes()
    assert main([*args, "--hard-negatives", "3"]) == 0 and "up to date" in capsys.readouterr().out
    # a file of the graph is gone: the graph is made again (the same bytes: generation is deterministic)
    before = (out / "x.npy").read_bytes()
    (out / "val_idx.npy").unlink()
    assert main(args) == 0
    assert "without val_idx.npy: making it again" in capsys.readouterr().err
    assert (out / "val_idx.npy").is_file() and (out / "x.npy").read_bytes() == before
    # another preset or seed is not skipped, and not replaced without --overwrite
    assert main([*args[:-1], "--seed", "1", "--skip-existing"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_cli_end_to_end_subprocess(tiny_graph_dir, tmp_path):
    exe = Path(sys.executable).with_name("graphfeed")
    out = tmp_path / "parts"
    proc = subprocess.run([str(exe), "partition", str(tiny_graph_dir), "--num-parts", "2", "--method", "metis",
                           "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    meta = read_meta(out)
    assert meta.num_parts == 2 and meta.method == "metis"
    assert "edge cut:" in proc.stdout and "in-edges" in proc.stdout and "train" in proc.stdout
    assert "reading" in proc.stderr  # progress goes to stderr, the summary to stdout


@pytest.mark.parametrize("pack_bits", [63, 24, 19, 8])
def test_edge_order_matches_lexsort_in_every_packing_mode(monkeypatch, pack_bits):
    """One packed block, several blocks, and the argsort fallback all give (key, other, eid) order."""
    from graphfeed.server.partition.build import builder

    monkeypatch.setattr(builder, "_PACK_BITS", pack_bits)
    rng = np.random.default_rng(pack_bits)
    for n, e in [(40, 2000), (300, 5000), (1, 7), (6, 1)]:
        key = rng.integers(0, n, e).astype(np.int32)
        other = rng.integers(0, n, e).astype(np.int32)
        indptr, indices, eid = builder._compressed(key, other, n)
        np.testing.assert_array_equal(eid, np.lexsort((np.arange(e), other, key)))
        np.testing.assert_array_equal(indices, other[eid])
        np.testing.assert_array_equal(np.diff(indptr), np.bincount(key, minlength=n))
