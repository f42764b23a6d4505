"""The bounded-memory partitioner (chunked inputs, external bucketing, Fennel, Dask).

Random assignment must give parts byte-identical to the in-memory path's (same seed), from every
chunked layout (``.npy`` chunks, a manifest, Parquet, typed folders) and from a Dask cluster; Fennel
keeps every round-trip invariant; the memory bound holds under an address-space limit; a killed
run resumes; a corrupt chunk is named in one line and nothing half-written looks complete.
"""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from graphfeed.bench.partition_cut import edge_cut
from graphfeed.cli.main import main
from graphfeed.server.partition.build.bounded import partition_chunked
from graphfeed.server.partition.build.builder import partition_graph
from graphfeed.server.partition.build.plan import parse_bytes
from graphfeed.server.partition.build.runner import KILL_AFTER_ENV
from graphfeed.server.partition.format.layout import PartitionPaths, read_meta
from graphfeed.server.partition.inputs.chunked import chunk_files_of, is_chunked_folder, open_chunked
from graphfeed.server.partition.inputs.graph import fingerprint
from graphfeed.server.partition.inputs.reader import read_graph
from graphfeed.server.partition.inputs.synth import generate_chunked, generate_mag_preset
from graphfeed.server.partition.inputs.typed import write_typed_folder

N, E, F = 3_000, 40_000, 8


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """A homogeneous graph with every optional field (edge features, weights, times)."""
    rng = np.random.default_rng(seed)
    return {"edge_index": rng.integers(0, N, (2, E)).astype(np.int64),
            "x": rng.standard_normal((N, F)).astype(np.float32),
            "y": rng.integers(0, 5, N).astype(np.int64),
            "node_time": rng.integers(0, 1000, N).astype(np.int64),
            "edge_attr": rng.standard_normal((E, 3)).astype(np.float32),
            "edge_weight": rng.random(E).astype(np.float32),
            "edge_time": rng.integers(0, 1000, E).astype(np.int64),
            "train_idx": np.arange(0, 300, dtype=np.int64), "val_idx": np.arange(300, 400, dtype=np.int64),
            "test_idx": np.arange(400, 1000, dtype=np.int64)}


CUTS = {"edge": [0, 7_001, 19_000, 33_333, E], "node": [0, 1_000, 1_777, N]}   # uneven chunk boundaries


def _write_npy_chunks(folder: Path, arrays: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True)
    for name, value in arrays.items():
        if name.endswith("_idx"):
            np.save(folder / f"{name}.npy", value)
            continue
        edge = name.startswith("edge")
        cuts = CUTS["edge" if edge else "node"]
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            np.save(folder / f"{name}_{i:05d}.npy", value[:, a:b] if name == "edge_index" else value[a:b])
    return folder


def _same_files(a: Path, b: Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    differ = [str(p) for p in files_a if p.name != "META.json" and not filecmp.cmp(a / p, b / p, shallow=False)]
    assert not differ, f"files differ: {differ}"
    meta_a, meta_b = (json.loads((root / "META.json").read_text()) for root in (a, b))
    assert {**meta_a, "graph_name": ""} == {**meta_b, "graph_name": ""}   # named after the input folder


def _in_memory(folder: Path, out: Path, parts: int, seed: int, topologies=("csc", "csr")) -> Path:
    graph = open_chunked(folder)
    partition_graph(graph.to_graph_input(), parts, out, method="random", topologies=topologies, seed=seed)
    return out


@pytest.fixture(scope="module")
def npy_chunks(tmp_path_factory) -> Path:
    return _write_npy_chunks(tmp_path_factory.mktemp("g") / "chunks", _arrays())


@pytest.fixture(scope="module")
def reference(npy_chunks, tmp_path_factory) -> Path:
    return _in_memory(npy_chunks, tmp_path_factory.mktemp("ref") / "parts", 3, seed=7)


# ----------------------------------------------------------------------------- identical to the in-memory path

def test_npy_chunks_read_as_the_whole_arrays(npy_chunks):
    graph = open_chunked(npy_chunks)
    arrays = _arrays()
    assert is_chunked_folder(npy_chunks)
    assert (graph.num_nodes, graph.num_edges) == (N, E)
    whole = graph.to_graph_input()
    np.testing.assert_array_equal(whole.edge_index, arrays["edge_index"])
    np.testing.assert_array_equal(whole.x, arrays["x"])
    np.testing.assert_array_equal(graph.read_edges(("_N", "to", "_N"), 6_000, 8_000),
                                  arrays["edge_index"][:, 6_000:8_000])   # across a chunk boundary
    assert graph.fingerprint == fingerprint(whole)


def test_bounded_parts_identical_to_in_memory(npy_chunks, reference, tmp_path):
    """A small memory limit: many edge tasks and sort buckets, byte-identical files (META.json too)."""
    graph = open_chunked(npy_chunks)
    out = tmp_path / "parts"
    limit = parse_bytes("128MB") + 1_500_000          # leaves ~1.4 MB of work: ~8,000 edges per task
    partition_chunked(graph, 3, out, method="random", topologies=("csc", "csr"), seed=7, memory_limit=limit)
    _same_files(reference, out)
    assert not (tmp_path / ".parts.work").exists()   # the scratch folder is removed after success


def test_featureless_chunked_graph_identical_to_the_one_file_layout(tmp_path):
    """No x chunks (labels give the node count; or num_nodes.npy): the bounded path stores no x, byte-identical
    to the in-memory path reading the same graph as one-file .npy arrays (and as a torch Data without x)."""
    arrays = {k: v for k, v in _arrays().items() if k in ("edge_index", "y", "train_idx", "val_idx", "test_idx")}
    chunks = _write_npy_chunks(tmp_path / "chunks", arrays)
    graph = open_chunked(chunks)
    assert graph.num_nodes == N and "x" not in graph.nodes["_N"].fields
    partition_chunked(graph, 3, tmp_path / "bounded", method="random", seed=7, memory_limit=parse_bytes("200MB"))
    assert "x" not in read_meta(tmp_path / "bounded").features["_N"]
    one_file = tmp_path / "one-file"
    one_file.mkdir()
    for name, value in arrays.items():
        np.save(one_file / f"{name}.npy", value)
    whole = read_graph(one_file)
    assert whole.x is None and whole.fingerprint == graph.fingerprint
    partition_graph(whole, 3, tmp_path / "in-memory", method="random", seed=7)
    _same_files(tmp_path / "in-memory", tmp_path / "bounded")
    # the count from num_nodes.npy alone (unlabelled), and from a torch Data's num_nodes
    (one_file / "y.npy").unlink()
    np.save(one_file / "num_nodes.npy", np.int64(N))
    assert read_graph(one_file).num_nodes == N and read_graph(one_file).y is None
    data = {"edge_index": torch.from_numpy(arrays["edge_index"]), "num_nodes": N,
            "train_idx": torch.from_numpy(arrays["train_idx"])}
    torch.save(data, tmp_path / "data.pt")
    assert read_graph(tmp_path / "data.pt").num_nodes == N


def test_manifest_and_parquet_layouts_give_the_same_parts(npy_chunks, reference, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    arrays = _arrays()
    # a manifest naming files in other folders and names
    man = tmp_path / "manifest"
    (man / "e").mkdir(parents=True)
    (man / "n").mkdir()
    spec: dict = {}
    for name, value in arrays.items():
        if name.endswith("_idx"):
            np.save(man / f"{name}.npy", value)
            continue
        halves = np.array_split(value, 2, axis=1 if name == "edge_index" else 0)
        where = "e" if name.startswith("edge") else "n"
        spec[name] = [f"{where}/{name}-{i}.npy" for i in range(2)]
        for i, half in enumerate(halves):
            np.save(man / spec[name][i], half)
    (man / "chunks.json").write_text(json.dumps(spec))
    out = tmp_path / "from-manifest"
    partition_chunked(open_chunked(man), 3, out, method="random", topologies=("csc", "csr"), seed=7,
                      memory_limit=parse_bytes("256MB"))
    _same_files(reference, out)
    # Parquet: edges*.parquet (src, dst, edge_weight, edge_time) and nodes*.parquet (x0..x7, y, node_time);
    # Parquet has no edge_attr here, so compare with an in-memory run without it.
    par = tmp_path / "parquet"
    par.mkdir()
    for i, (a, b) in enumerate(zip(CUTS["edge"][:-1], CUTS["edge"][1:])):
        pq.write_table(pa.table({"src": arrays["edge_index"][0, a:b], "dst": arrays["edge_index"][1, a:b],
                                 "edge_weight": arrays["edge_weight"][a:b], "edge_time": arrays["edge_time"][a:b]}),
                       par / f"edges-{i}.parquet", row_group_size=1_500)   # slices span row groups
    for i, (a, b) in enumerate(zip(CUTS["node"][:-1], CUTS["node"][1:])):
        cols = {f"x{j}": arrays["x"][a:b, j] for j in range(F)}
        pq.write_table(pa.table({**cols, "y": arrays["y"][a:b], "node_time": arrays["node_time"][a:b]}),
                       par / f"nodes-{i}.parquet")
    for split in ("train", "val", "test"):
        np.save(par / f"{split}_idx.npy", arrays[f"{split}_idx"])
    no_attr = _write_npy_chunks(tmp_path / "no-attr", {k: v for k, v in arrays.items() if k != "edge_attr"})
    parquet_graph = open_chunked(par)
    assert parquet_graph.fingerprint == open_chunked(no_attr).fingerprint
    partition_chunked(parquet_graph, 3, tmp_path / "from-parquet", method="random", seed=7,
                      topologies=("csc", "csr"), memory_limit=parse_bytes("128MB") + 1_500_000)
    _same_files(_in_memory(no_attr, tmp_path / "no-attr-ref", 3, seed=7), tmp_path / "from-parquet")


def test_typed_chunked_graph_identical_to_in_memory(tmp_path):
    graph = generate_mag_preset("mag-tiny", seed=3)
    whole = tmp_path / "whole"
    whole.mkdir()
    write_typed_folder(whole, graph)
    chunked = tmp_path / "chunked"
    for sub in sorted(p for p in whole.iterdir() if p.is_dir()):
        (chunked / sub.name).mkdir(parents=True)
        for f in sub.glob("*.npy"):
            a = np.load(f)
            if f.stem in ("edge_index", "x") and a.shape[-1 if f.stem == "edge_index" else 0] > 10:
                for i, part in enumerate(np.array_split(a, 3, axis=1 if f.stem == "edge_index" else 0)):
                    np.save(chunked / sub.name / f"{f.stem}_{i:05d}.npy", part)
            else:
                np.save(chunked / sub.name / f.name, a)
    opened = open_chunked(chunked)
    assert not opened.is_homogeneous and opened.label_type == "paper"
    graph.fingerprint = fingerprint(graph)
    assert opened.fingerprint == graph.fingerprint
    partition_graph(graph, 2, tmp_path / "ref", method="random", topologies=("csc", "csr"), seed=1)
    partition_chunked(opened, 2, tmp_path / "out", method="random", topologies=("csc", "csr"), seed=1,
                      memory_limit=parse_bytes("130MB"))
    _same_files(tmp_path / "ref", tmp_path / "out")
    # the same chunks named by a typed manifest (paths relative to it)
    spec: dict = {"nodes": {}, "edges": {}}
    for sub in sorted(p for p in chunked.iterdir() if p.is_dir()):
        entry: dict = {}
        for f in sorted(sub.glob("*.npy")):
            field = f.stem.rsplit("_", 1)[0] if f.stem.rsplit("_", 1)[-1].isdigit() else f.stem
            if field == "num_nodes":
                entry["num_nodes"] = int(np.load(f))
            elif field.endswith("_idx"):
                entry[field] = f"{sub.name}/{f.name}"
            else:
                entry.setdefault(field, []).append(f"{sub.name}/{f.name}")
        spec["edges" if "__" in sub.name else "nodes"][sub.name] = entry
    (chunked / "chunks.json").write_text(json.dumps(spec))
    from_manifest = open_chunked(chunked)
    assert from_manifest.fingerprint == graph.fingerprint
    partition_chunked(from_manifest, 2, tmp_path / "out-manifest", method="random", seed=1,
                      topologies=("csc", "csr"), memory_limit=parse_bytes("130MB"))
    _same_files(tmp_path / "ref", tmp_path / "out-manifest")


@pytest.mark.slow
def test_dask_local_cluster_parts_identical(npy_chunks, reference, tmp_path):
    pytest.importorskip("dask.distributed")
    from graphfeed.server.partition.build.runner import DaskRunner

    runner = DaskRunner(None, workers=2)
    try:
        assert len(runner.client.scheduler_info()["workers"]) == 2
        partition_chunked(open_chunked(npy_chunks), 3, tmp_path / "parts", method="random", seed=7,
                          topologies=("csc", "csr"), memory_limit=parse_bytes("128MB") + 1_500_000, runner=runner)
    finally:
        runner.close()
    _same_files(reference, tmp_path / "parts")


# ----------------------------------------------------------------------------- Fennel

def test_fennel_keeps_every_round_trip_invariant(npy_chunks, tmp_path):
    arrays = _arrays()
    graph = open_chunked(npy_chunks)
    out = tmp_path / "parts"
    meta = partition_chunked(graph, 4, out, method="fennel", topologies=("csc", "csr"), seed=0,
                             memory_limit=parse_bytes("128MB") + 1_500_000)
    orig = np.concatenate([np.load(out / f"part_{k}/nodes/_N/orig_id.npy") for k in range(4)])
    np.testing.assert_array_equal(np.sort(orig), np.arange(N))                 # every node in one part
    new_of_orig = np.empty(N, dtype=np.int64)
    new_of_orig[orig] = np.arange(N)
    ranges = meta.node_ranges["_N"]
    _assert_within_caps(out, meta, arrays["train_idx"])                       # balanced
    x = np.concatenate([np.load(out / f"part_{k}/nodes/_N/x.npy") for k in range(4)])
    np.testing.assert_array_equal(x, arrays["x"][orig])                        # features follow their node
    y = np.concatenate([np.load(out / f"part_{k}/nodes/_N/y.npy") for k in range(4)])
    np.testing.assert_array_equal(y, arrays["y"][orig])
    for split in ("train", "val", "test"):
        got = np.concatenate([np.load(out / f"part_{k}/nodes/_N/{split}_idx.npy") for k in range(4)])
        np.testing.assert_array_equal(np.sort(orig[got]), arrays[f"{split}_idx"])
    for topo, key_row in (("csc", 1), ("csr", 0)):
        edges = []
        for k in range(4):
            d = PartitionPaths(out).edge_dir(k)
            indptr, indices, eid = (np.load(d / f"{topo}_{n}.npy") for n in ("indptr", "indices", "eid"))
            key = np.repeat(np.arange(ranges[k], ranges[k + 1]), np.diff(indptr))
            ends = [orig[key], orig[indices]] if key_row == 0 else [orig[indices], orig[key]]
            np.testing.assert_array_equal(np.stack(ends), arrays["edge_index"][:, eid])   # each edge as input
            np.testing.assert_array_equal(np.load(d / f"{topo}_edge_attr.npy"), arrays["edge_attr"][eid])
            edges.append(eid)
        np.testing.assert_array_equal(np.sort(np.concatenate(edges)), np.arange(E))   # union = input edges
    src_part = np.searchsorted(ranges, new_of_orig[arrays["edge_index"][0]], side="right")
    dst_part = np.searchsorted(ranges, new_of_orig[arrays["edge_index"][1]], side="right")
    assert meta.edge_cut == int(np.count_nonzero(src_part != dst_part))


def test_fennel_cuts_fewer_edges_than_random_on_a_community_graph(tmp_path):
    """The generator's graph follows its classes: Fennel finds far fewer cut edges than random."""
    folder = tmp_path / "g"
    folder.mkdir()
    generate_chunked(folder, "tiny", seed=0, chunk_edges=30_000)
    graph = open_chunked(folder)
    fennel = partition_chunked(graph, 2, tmp_path / "f", method="fennel", memory_limit=parse_bytes("256MB"))
    rand = partition_chunked(graph, 2, tmp_path / "r", method="random", memory_limit=parse_bytes("256MB"))
    assert fennel.edge_cut < 0.8 * rand.edge_cut


def _assert_within_caps(out: Path, meta, train: np.ndarray) -> None:
    """Every part holds at most ``ceil(share * 1.05) + 1`` of the training nodes and of the other nodes."""
    k = meta.num_parts
    ranges = meta.node_ranges["_N"]
    orig = np.concatenate([np.load(out / f"part_{p}/nodes/_N/orig_id.npy") for p in range(k)])
    part_of = np.repeat(np.arange(k), np.diff(ranges))[np.argsort(orig)]
    is_train = np.zeros(orig.size, dtype=bool)
    is_train[train] = True
    for members in (is_train, ~is_train):
        counts = np.bincount(part_of[members], minlength=k)
        assert counts.max() <= np.ceil(members.sum() / k * 1.05) + 1, counts


@pytest.mark.parametrize("num_parts", [2, 4])
def test_fennel_cuts_cora_within_one_and_a_half_times_metis(cora_dir, tmp_path, num_parts):
    """The issue's target on a real graph: plain streaming Fennel cut 3.2x (2 parts) and 3.0x (4 parts) METIS's
    edges on Cora; the multilevel streaming partitioner stays within 1.5x, in balance, under a small limit."""
    pytest.importorskip("pymetis")
    from graphfeed.server.partition.build.bounded import metis_parts_bounded

    graph = open_chunked(cora_dir)
    out = tmp_path / "parts"
    meta = partition_chunked(graph, num_parts, out, method="fennel", seed=0, memory_limit=parse_bytes("160MB"))
    metis = edge_cut(graph, metis_parts_bounded(graph, num_parts, 0, parse_bytes("1GB")))
    assert meta.edge_cut <= 1.5 * metis, (meta.edge_cut, metis)
    _assert_within_caps(out, meta, np.load(cora_dir / "train_idx.npy"))


def test_partition_cut_bench_prints_both_cuts(cora_dir, capsys):
    pytest.importorskip("pymetis")
    from graphfeed.bench.partition_cut import main as cut_main

    assert cut_main([str(cora_dir), "-p", "2", "--memory-limit", "160MB"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["parts"] == 2 and row["edges"] == 10_556 and row["metis_cut"] > 0
    assert row["ratio"] == pytest.approx(row["fennel_cut"] / row["metis_cut"], abs=1e-3) and row["ratio"] <= 1.5


def test_fennel_places_isolated_nodes_and_components_in_balance(tmp_path):
    """Half the nodes without an edge and the rest in small separate communities: isolated nodes are packed into
    clusters, every community stays whole (no edge cut) and every part keeps its share of each group."""
    rng = np.random.default_rng(1)
    n, size = 4_000, 50
    community = np.arange(n // 2) // size
    src = rng.integers(0, n // 2, 20_000)
    dst = community[src] * size + rng.integers(0, size, src.size)
    folder = tmp_path / "g"
    folder.mkdir()
    np.save(folder / "edge_index_00000.npy", np.stack([src, dst]).astype(np.int64))
    np.save(folder / "x_00000.npy", rng.standard_normal((n, 2)).astype(np.float32))
    train = rng.choice(n, 400, replace=False)
    np.save(folder / "train_idx.npy", np.sort(train))
    for num_parts in (2, 4):
        out = tmp_path / f"p{num_parts}"
        meta = partition_chunked(open_chunked(folder), num_parts, out, method="fennel", seed=0,
                                 memory_limit=parse_bytes("160MB"))
        _assert_within_caps(out, meta, train)
        assert meta.edge_cut <= 0.02 * src.size, meta.edge_cut      # communities stay (almost all) whole


def test_fennel_places_clusters_by_size_when_their_graph_never_fits(tmp_path, monkeypatch):
    """If the clusters' graph stays above its memory budget even for clusters of a part's size, the clusters are
    placed by size alone and the refinement over the streamed lists finds the cut: still balanced, still better
    than random."""
    from graphfeed.server.partition.build import fennel

    tries = []
    monkeypatch.setattr(fennel, "_contract_streamed", lambda *args: tries.append(args[-1]))   # always "too big"
    folder = tmp_path / "g"
    folder.mkdir()
    generate_chunked(folder, "tiny", seed=0, chunk_edges=30_000)
    graph, logs = open_chunked(folder), []
    meta = partition_chunked(graph, 2, tmp_path / "f", method="fennel", memory_limit=parse_bytes("256MB"),
                             log=logs.append)
    assert len(tries) >= 2 and any("placed by size" in line for line in logs), logs
    _assert_within_caps(tmp_path / "f", meta, np.load(folder / "train_idx.npy"))
    rand = partition_chunked(graph, 2, tmp_path / "r", method="random", memory_limit=parse_bytes("256MB"))
    assert meta.edge_cut < 0.9 * rand.edge_cut


def test_fine_rebalance_moves_the_nodes_that_lose_least_into_parts_with_room():
    """Two 10-node cliques, all 20 nodes in part 0 (cap 11 per part): rebalancing moves 9 nodes out, all from one
    clique (equal losses: in id order)."""
    from graphfeed.server.partition.build.fennel import _Fine

    ends = [(a + i, a + j) for a in (0, 10) for i in range(10) for j in range(10) if i != j]
    src, dst = np.array(ends).T
    indptr = np.zeros(21, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=20), out=indptr[1:])
    lists = [(0, 20, indptr, dst[np.argsort(src, kind="stable")].astype(np.int32))]
    state = _Fine(np.zeros(20, dtype=np.int16), np.zeros(20, dtype=np.int8), np.array([11]), 2,
                  np.random.default_rng(0))
    assert state.overfull()
    moved = 0
    while state.overfull():
        moved += state.rebalance(lists)
    assert moved == 9 and not state.overfull() and state.group_sizes.tolist() == [[11, 9]]
    out = np.flatnonzero(state.parts == 1)
    assert (out < 10).all() or (out >= 10).all(), out


# ----------------------------------------------------------------------------- the memory bound

_BOUND_SCRIPT = textwrap.dedent("""
    import resource, sys
    from graphfeed.server.partition.build import bounded, builder, fennel, plan, runner  # imports first
    from graphfeed.server.partition.inputs import chunked
    def vm():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
    path, out, path_kind, work, slack = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    graph = chunked.open_chunked(path)
    per_node = {"fennel": plan.FENNEL_NODE_BYTES}.get(path_kind, 8)   # the assignment's own tables
    limit = plan.BASELINE_BYTES + plan.fixed_bytes(graph, 2) + per_node * graph.num_nodes + work
    resource.setrlimit(resource.RLIMIT_AS, (vm() + work + per_node * graph.num_nodes + slack,) * 2)
    try:
        if path_kind in ("bounded", "fennel"):
            method = "random" if path_kind == "bounded" else "fennel"
            bounded.partition_chunked(graph, 2, out, method=method, memory_limit=limit)
        else:
            builder.partition_graph(graph.to_graph_input(), 2, out, method="random")
    except MemoryError:
        print("MemoryError"); sys.exit(3)
    print("ok")
""")


def test_memory_bound_holds_under_an_address_space_limit(tmp_path):
    """~85 MB of graph (48 MB of edges, 41 MB of features), ~19 MB of address space beyond the interpreter's
    (8 MB of chunk work, the permutation and 10 MB of slack for Python's own allocations): the bounded path
    finishes, the in-memory path runs out.  Small in absolute terms so it takes ~20 s on two loaded cores;
    the products run in docs/how-to/partition.md is the same bound at scale (2 GB for a 2.8 GB graph)."""
    rng = np.random.default_rng(0)
    n, e, work, slack = 80_000, 3_000_000, 8 << 20, 10 << 20
    folder = tmp_path / "g"
    folder.mkdir()
    for i, part in enumerate(np.array_split(rng.integers(0, n, (2, e)).astype(np.int64), 6, axis=1)):
        np.save(folder / f"edge_index_{i:05d}.npy", part)
    for i, part in enumerate(np.array_split(rng.standard_normal((n, 128)).astype(np.float32), 6)):
        np.save(folder / f"x_{i:05d}.npy", part)
    np.save(folder / "y.npy", rng.integers(0, 4, n))
    np.save(folder / "train_idx.npy", np.arange(100))
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size > 4 * (work + 8 * n + slack)                        # several times the allowance
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
    for kind, code in (("in-memory", 3), ("bounded", 0)):
        proc = subprocess.run([sys.executable, "-c", _BOUND_SCRIPT, str(folder), str(tmp_path / kind), kind,
                               str(work), str(slack)], capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == code, (kind, proc.stdout, proc.stderr[-2000:])
    meta = read_meta(tmp_path / "bounded")
    assert meta.num_edges["_N__to___N"] == e and meta.node_ranges["_N"][-1] == n


def test_fennel_memory_bound_holds_under_an_address_space_limit(tmp_path):
    """The streaming partitioner under the same kind of limit: 24 MB of edges (12 MB of neighbour lists both
    ways, int32) against 6 MB of chunk work, its per-node tables and 10 MB of slack; communities of 400 nodes,
    so the clusters' graph fits in memory and the cut follows them."""
    rng = np.random.default_rng(0)
    n, e, work, slack = 60_000, 1_500_000, 6 << 20, 10 << 20
    src = rng.integers(0, n, e)
    inside = rng.random(e) < 0.9
    dst = np.where(inside, src // 400 * 400 + rng.integers(0, 400, e), rng.integers(0, n, e))
    folder = tmp_path / "g"
    folder.mkdir()
    for i, part in enumerate(np.array_split(np.stack([src, dst]).astype(np.int64), 6, axis=1)):
        np.save(folder / f"edge_index_{i:05d}.npy", part)
    np.save(folder / "x_00000.npy", rng.standard_normal((n, 4)).astype(np.float32))
    np.save(folder / "train_idx.npy", np.arange(0, n, 40))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
    proc = subprocess.run([sys.executable, "-c", _BOUND_SCRIPT, str(folder), str(tmp_path / "p"), "fennel",
                           str(work), str(slack)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-2000:])
    meta = read_meta(tmp_path / "p")
    assert meta.method == "fennel" and meta.num_edges["_N__to___N"] == e
    assert meta.edge_cut < 0.2 * e                                  # random parts would cut half


# ----------------------------------------------------------------------------- resume, corruption

def _cli(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphfeed.cli.main", "partition", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_killed_run_resumes_from_finished_chunks(npy_chunks, reference, tmp_path):
    out = tmp_path / "parts"
    args = [npy_chunks, "-p", "3", "-o", out, "--method", "random", "--seed", "7", "--topology", "both",
            "--memory-limit", str(parse_bytes("128MB") + 1_500_000)]
    killed = _cli(*args, env={KILL_AFTER_ENV: "12"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not out.exists()                                          # nothing looks complete
    scratch = tmp_path / ".parts.work"
    assert (scratch / "plan.json").is_file() and not (scratch / "out" / "META.json").exists()
    done = sum(1 for p in (scratch / "done").rglob("*") if p.is_file())
    assert done >= 3
    resumed = _cli(*args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming the run in {scratch}: {done} finished task(s) kept" in resumed.stderr
    _same_files(reference, out)
    assert not scratch.exists()


def test_changed_parameters_start_over_and_say_why(npy_chunks, tmp_path):
    out = tmp_path / "parts"
    base = [npy_chunks, "-p", "2", "-o", out, "--method", "random", "--memory-limit", "200MB"]
    assert _cli(*base, "--seed", "1", env={KILL_AFTER_ENV: "3"}).returncode == -9
    again = _cli(*base, "--seed", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "cannot resume the run in" in again.stderr and "seed 1 -> 2" in again.stderr
    assert read_meta(out).seed == 2


def test_corrupt_chunk_is_named_in_one_line(npy_chunks, tmp_path, capsys):
    folder = tmp_path / "g"
    folder.mkdir()
    for p in npy_chunks.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    bad = folder / "edge_index_00002.npy"
    bad.write_bytes(bad.read_bytes()[:1000])                        # truncated
    out = tmp_path / "parts"
    code = main(["partition", str(folder), "-p", "2", "-o", str(out), "--method", "random", "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and str(bad) in err and "edge_index" in err, err
    assert not out.exists()


def test_out_of_range_id_names_its_chunk(tmp_path, capsys):
    arrays = _arrays()
    arrays["edge_index"] = arrays["edge_index"].copy()
    arrays["edge_index"][1, 20_000] = N + 5                        # in chunk 2 (edges 19,000..33,332)
    folder = _write_npy_chunks(tmp_path / "g", arrays)
    code = main(["partition", str(folder), "-p", "2", "-o", str(tmp_path / "parts"), "--method", "random", "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "edge_index_00002.npy" in err and str(N + 5) in err, err
    assert not (tmp_path / "parts" / "META.json").exists()


def test_chunked_generate_and_cli_partition(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["generate", "--preset", "tiny", "--chunk-edges", "40000", "--out", str(out)]) == 0
    edge_chunks = chunk_files_of(out, "edge_index")
    assert len(edge_chunks) >= 3
    meta = json.loads((out / "meta.json").read_text())
    assert sum(np.load(p, mmap_mode="r").shape[1] for p in edge_chunks) == meta["directed_edges"]
    assert main(["partition", str(out), "-p", "2", "-o", str(tmp_path / "parts"), "--memory-limit", "200MB",
                 "-q"]) == 0
    printed = capsys.readouterr().out
    assert "method fennel" in printed and read_meta(tmp_path / "parts").method == "fennel"
    # the same command again: up to date
    assert main(["partition", str(out), "-p", "2", "-o", str(tmp_path / "parts"), "--memory-limit", "200MB",
                 "-q"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_memory_limit_parsing_and_too_small_limit(npy_chunks, tmp_path, capsys):
    assert parse_bytes("2GB") == 2 << 30 and parse_bytes("512MiB") == 512 << 20 and parse_bytes("1000") == 1000
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("two gigs")
    code = main(["partition", str(npy_chunks), "-p", "2", "-o", str(tmp_path / "p"), "--memory-limit", "1MB", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "--memory-limit 1.0 MB is too small" in err and "raise --memory-limit" in err
