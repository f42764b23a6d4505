"""Typed (heterogeneous) graphs in the partition layer: input, partitioning, store, generator, info.

Round trips are checked in original ids against the input arrays, through the typed reader API
(``part.nodes(ntype)``, ``part.edges(etype)``), for random and METIS assignment and 1/2/3 parts,
on the ``mag-tiny`` preset and on a hand-made graph with a featureless type, float64 features,
labels on a type without splits, duplicate edges, self loops and edge features.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.graphs import hand_made_typed_arrays, hetero_data, save_typed_folder

from graphfeed.cli.generate import write_graph
from graphfeed.cli.main import main
from graphfeed.core.constants import SPLITS
from graphfeed.core.spec import NodeInput
from graphfeed.server.partition.build.builder import assign_parts, graph_edge_cut, partition_graph
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, edge_type_dirname, read_meta
from graphfeed.server.partition.format.store import Partition, open_parts, resolve_original_ids
from graphfeed.server.partition.inputs import synth
from graphfeed.server.partition.inputs.reader import InputError, read_graph

PARTS = (1, 2, 3)
METHODS = ("random", "metis")


# ---------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def mag_tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mag") / "mag-tiny"
    write_graph(out, "mag-tiny", seed=0)
    return out


@pytest.fixture(scope="module")
def mag_tiny(mag_tiny_dir):
    return read_graph(mag_tiny_dir)


@pytest.fixture(scope="module")
def hand_made_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("hetero") / "shop.pt"
    torch.save(hetero_data(hand_made_typed_arrays()), path)
    return path


# ---------------------------------------------------------------------------------- the round-trip check

def _check_node_type(meta, parts, graph, ntype) -> np.ndarray:
    """Every node of ``ntype`` in exactly one part, (part, original id) order, x/y by id; returns orig of gid."""
    t, ranges = graph.nodes[ntype], meta.node_ranges[ntype]
    assert ranges[0] == 0 and ranges[-1] == t.num_nodes and len(ranges) == meta.num_parts + 1
    pieces = []
    for k, part in enumerate(parts):
        store = part.nodes(ntype)
        assert (store.start, store.stop) == (ranges[k], ranges[k + 1]) and store.book.num_parts == meta.num_parts
        ids = store.orig_id.numpy()
        assert ids.size == store.num_nodes and np.all(np.diff(ids) > 0), "owned nodes ordered by original id"
        for name in ("x", "y"):
            stored, given = getattr(store, name), getattr(t, name)
            assert (stored is None) == (given is None), (ntype, name)
            if given is not None:
                assert stored.numpy().dtype == given.dtype
                np.testing.assert_array_equal(stored.numpy(), given[ids])
        pieces.append(ids)
    orig = np.concatenate(pieces)
    np.testing.assert_array_equal(np.sort(orig), np.arange(t.num_nodes))
    return orig


def _check_splits(parts, graph, orig) -> None:
    label = graph.label_type
    for split in SPLITS:
        pieces = []
        for part in parts:
            gids = part.nodes(label).split(split).numpy()
            assert np.all(np.diff(gids) > 0)
            assert gids.size == 0 or (gids.min() >= part.nodes(label).start and gids.max() < part.nodes(label).stop)
            pieces.append(orig[label][gids])
        np.testing.assert_array_equal(np.sort(np.concatenate(pieces)), np.sort(graph.splits[split]))
    for ntype in graph.node_types:
        if ntype != label:
            with pytest.raises(ValueError, match=f"node type {ntype!r} has no splits"):
                parts[0].nodes(ntype).split("train")


def _check_edge_type(parts, graph, orig, etype, kind) -> None:
    src, _, dst = etype
    given = graph.edges[etype]
    key_type, other_type = (dst, src) if kind == "csc" else (src, dst)
    seen_eids, seen_pairs = [], []
    for part in parts:
        edges = part.edges(etype)
        topo, owner_store = edges.topology(kind), part.nodes(key_type)
        indptr, nbr, eid = topo.indptr.numpy(), topo.indices.numpy(), topo.eid.numpy()
        assert indptr.size == owner_store.num_nodes + 1 and indptr[0] == 0 and indptr[-1] == nbr.size == eid.size
        assert nbr.size == 0 or 0 <= nbr.min() <= nbr.max() < graph.nodes[other_type].num_nodes
        owner = owner_store.start + np.repeat(np.arange(owner_store.num_nodes), np.diff(indptr))
        s, d = (orig[src][nbr], orig[dst][owner]) if kind == "csc" else (orig[src][owner], orig[dst][nbr])
        np.testing.assert_array_equal(s, given.edge_index[0, eid])   # the input edge with that id
        np.testing.assert_array_equal(d, given.edge_index[1, eid])
        same = owner[1:] == owner[:-1]
        ordered = (nbr[1:] > nbr[:-1]) | ((nbr[1:] == nbr[:-1]) & (eid[1:] > eid[:-1]))
        assert np.all(ordered[same]), "neighbor lists sorted by (neighbor gid, eid)"
        attr = edges.edge_attr(kind)
        assert (attr is None) == (given.edge_attr is None)
        if attr is not None:
            np.testing.assert_array_equal(attr.numpy(), given.edge_attr[eid])
        seen_eids.append(eid)
        seen_pairs.append(np.stack([s, d]))
    np.testing.assert_array_equal(np.sort(np.concatenate(seen_eids)), np.arange(given.num_edges))
    union = np.concatenate(seen_pairs, axis=1)
    as_multiset = lambda ei: ei[:, np.lexsort((ei[1], ei[0]))]  # noqa: E731 -- a one-line local helper
    np.testing.assert_array_equal(as_multiset(union), as_multiset(np.asarray(given.edge_index)))


def assert_typed_round_trip(root, graph, topologies=("csc", "csr")) -> None:
    meta, parts = open_parts(root)
    assert meta.source_fingerprint == graph.fingerprint
    assert meta.node_types == graph.node_types and meta.edge_type_tuples() == graph.edge_types
    assert meta.label_type == parts[0].label_type == graph.label_type and not meta.is_homogeneous
    assert meta.num_edges == {edge_type_dirname(e): graph.edges[e].num_edges for e in graph.edge_types}
    assert meta.split_sizes == {s: int(v.size) for s, v in graph.splits.items()}
    for ntype, t in graph.nodes.items():
        assert meta.classes_of(ntype) == t.num_classes
    orig = {ntype: _check_node_type(meta, parts, graph, ntype) for ntype in graph.node_types}
    _check_splits(parts, graph, orig)
    for etype in graph.edge_types:
        for kind in topologies:
            _check_edge_type(parts, graph, orig, etype, kind)


# ---------------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("num_parts", PARTS)
@pytest.mark.parametrize("method", METHODS)
def test_round_trip_mag_tiny(mag_tiny, tmp_path, method, num_parts):
    meta = partition_graph(mag_tiny, num_parts, tmp_path / "p", method=method, topologies=("csc", "csr"))
    assert meta.num_parts == num_parts and meta.node_types == ["author", "field", "paper"]
    assert meta.features["author"] == {} and set(meta.features["paper"]) == {"x", "y"}
    assert_typed_round_trip(tmp_path / "p", mag_tiny)


@pytest.mark.parametrize("num_parts", PARTS)
@pytest.mark.parametrize("method", METHODS)
def test_round_trip_hand_made_hetero_data(hand_made_file, tmp_path, method, num_parts):
    graph = read_graph(hand_made_file)
    assert graph.label_type == "user" and graph.nodes["tag"].x is None and graph.nodes["tag"].num_nodes == 7
    assert graph.edges[("user", "follows", "user")].edge_index.dtype == np.int64
    meta = partition_graph(graph, num_parts, tmp_path / "p", method=method, topologies=("csc", "csr"))
    assert meta.edge_features == {"user__buys__item": {"shape": [2], "dtype": "float32"}}
    assert meta.features["item"]["x"] == {"shape": [2], "dtype": "float64"}
    assert meta.num_classes_by_type == {"item": graph.nodes["item"].num_classes, "user": meta.num_classes}
    assert_typed_round_trip(tmp_path / "p", graph)


def test_typed_folder_and_hetero_data_partition_identically(hand_made_file, tmp_path):
    folder = save_typed_folder(tmp_path / "shop", hand_made_typed_arrays())
    from_folder, from_file = read_graph(folder), read_graph(hand_made_file)
    assert from_folder.fingerprint == from_file.fingerprint
    for method, num_parts in (("metis", 2), ("random", 3)):
        a, b = tmp_path / f"a-{method}", tmp_path / f"b-{method}"
        partition_graph(from_folder, num_parts, a, method=method, topologies=("csc", "csr"))
        partition_graph(from_file, num_parts, b, method=method, topologies=("csc", "csr"))
        files = sorted(p.relative_to(a) for p in a.rglob("*.npy"))
        assert files == sorted(p.relative_to(b) for p in b.rglob("*.npy")) and len(files) > 40
        for f in files:
            assert (a / f).read_bytes() == (b / f).read_bytes(), f
        meta_a, meta_b = json.loads((a / "META.json").read_text()), json.loads((b / "META.json").read_text())
        assert meta_a.pop("graph_name") == "shop" and meta_b.pop("graph_name") == "shop"
        assert meta_a == meta_b


def test_generated_folder_reads_back_as_generated(mag_tiny):
    again = synth.generate_mag_preset("mag-tiny", seed=0)
    assert mag_tiny.node_types == again.node_types and mag_tiny.edge_types == again.edge_types
    for ntype in again.node_types:
        for name in ("x", "y"):
            a, b = getattr(mag_tiny.nodes[ntype], name), getattr(again.nodes[ntype], name)
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b))
    for etype in again.edge_types:
        np.testing.assert_array_equal(mag_tiny.edges[etype].edge_index, again.edges[etype].edge_index)


# ---------------------------------------------------------------------------------- homogeneous compatibility

def test_homogeneous_partitions_still_open_and_read_through_the_typed_api(tiny_graph, tmp_path):
    root = tmp_path / "p"
    partition_graph(tiny_graph, 2, root, method="random", topologies=("csc", "csr"))
    meta_json = json.loads((root / "META.json").read_text())
    assert "label_type" not in meta_json and "num_classes_by_type" not in meta_json, "today's META.json keys only"
    meta, parts = open_parts(root)
    assert meta.is_homogeneous and meta.label_type == "_N" and meta.classes_of("_N") == tiny_graph.num_classes
    for part in parts:
        assert part.node_types == ["_N"] and part.edge_types == [DEFAULT_EDGE_TYPE] and part.label_type == "_N"
        node = part.nodes("_N")
        assert (node.start, node.stop) == (part.start, part.stop) and node.book is part.book
        assert torch.equal(node.x, part.x) and torch.equal(node.y, part.y) and torch.equal(node.split("val"),
                                                                                               part.split("val"))
        for kind in ("csc", "csr"):
            assert part.edges(DEFAULT_EDGE_TYPE).topology(kind) is part.topology(kind)
        assert part.edges(DEFAULT_EDGE_TYPE).edge_attr("csc") is None
        assert torch.equal(part.input_nodes(NodeInput(split="train")), part.split("train"))


def test_partition_written_before_typed_keys_still_opens(tiny_parts_dir, tmp_path):
    """A META.json without the keys added for typed graphs (as older releases wrote it) reads as homogeneous."""
    import shutil

    root = tmp_path / "old"
    shutil.copytree(tiny_parts_dir, root)
    meta = json.loads((root / "META.json").read_text())
    for key in ("label_type", "num_classes_by_type"):
        meta.pop(key, None)
    (root / "META.json").write_text(json.dumps(meta))
    old, parts = open_parts(root)
    assert old.label_type == "_N" and old.classes_of("_N") == old.num_classes and old.is_homogeneous
    assert sum(p.nodes("_N").num_nodes for p in parts) == 10_000
    assert sum(int(p.edges(DEFAULT_EDGE_TYPE).topology("csc").indices.numel()) for p in parts) == old.num_edges[
        "_N__to___N"]


# ---------------------------------------------------------------------------------- store API

def test_typed_store_api(mag_tiny, tmp_path):
    partition_graph(mag_tiny, 2, tmp_path / "p", method="metis")
    meta, parts = open_parts(tmp_path / "p")
    part = parts[1]
    assert part.node_types == ["author", "field", "paper"] and part.label_type == "paper"
    assert part.edge_types == sorted(synth.MAG_EDGE_TYPES)
    # shortcuts: the label type and an edge type into it
    assert part.ntype == "paper" and part.etype[2] == "paper" and torch.equal(part.x, part.nodes("paper").x)
    assert part.topology("csc") is part.edges(part.etype).topology("csc")
    assert part.nodes("author").x is None and part.nodes("author").y is None and part.nodes("field").y is None
    assert part.nodes("paper").num_classes == 8 and part.nodes("author").num_classes == 0
    with pytest.raises(ValueError, match="unknown node type 'venue'.*'author', 'field', 'paper'"):
        part.nodes("venue")
    with pytest.raises(ValueError, match=r"unknown edge type \('paper', 'cites', 'author'\)"):
        part.edges(("paper", "cites", "author"))
    with pytest.raises(Exception, match="without CSR topology"):
        part.edges(("author", "writes", "paper")).topology("csr")
    # a per-type Partition view
    authors = Partition(tmp_path / "p", 0, meta, ntype="author")
    assert (authors.start, authors.stop) == tuple(meta.node_ranges["author"][:2]) and authors.x is None


def test_input_nodes_per_node_type(mag_tiny, tmp_path):
    partition_graph(mag_tiny, 3, tmp_path / "p", method="random")
    _, parts = open_parts(tmp_path / "p")
    # no node type (or None): the label type's seeds
    train = [p.input_nodes(NodeInput(split="train")) for p in parts]
    assert sum(t.numel() for t in train) == mag_tiny.splits["train"].size
    typed = lambda ntype, **kw: SimpleNamespace(node_type=ntype, split=kw.get("split"), ids=kw.get("ids"))  # noqa: E731 -- a one-line local helper
    assert all(torch.equal(p.input_nodes(typed(None, split="train")), t) for p, t in zip(parts, train))
    # every author once, by global id; original ids resolved per type
    authors = torch.cat([p.input_nodes(typed("author")) for p in parts])
    assert torch.equal(authors, torch.arange(3500))
    ids = torch.tensor([3499, 0, 17])
    gids = resolve_original_ids(parts, ids, "author")
    orig = torch.cat([p.nodes("author").orig_id for p in parts])
    assert torch.equal(orig[gids], ids)
    assert sum(p.input_nodes(typed("author", ids=ids)).numel() for p in parts) == 3
    with pytest.raises(ValueError, match="original 'field' node ids are 0..499"):
        parts[0].input_nodes(typed("field", ids=torch.tensor([500])))
    with pytest.raises(ValueError, match="node type 'author' has no splits.*'paper'"):
        parts[0].input_nodes(typed("author", split="train"))
    with pytest.raises(ValueError, match="unknown node type 'venue'"):
        parts[0].input_nodes(typed("venue"))
    with pytest.raises(ValueError, match="'author' node id"):
        resolve_original_ids(parts, torch.tensor([3500]), "author")


# ---------------------------------------------------------------------------------- assignment

@pytest.mark.parametrize("num_parts", (2, 3, 4))
def test_metis_balances_every_type_and_the_seeds_and_cuts_fewer_edges(mag_tiny, num_parts):
    metis = assign_parts(mag_tiny, num_parts, "metis", seed=0)
    offsets = mag_tiny.node_offsets()
    train = offsets["paper"] + mag_tiny.splits["train"]
    groups = {ntype: np.arange(offsets[ntype], offsets[ntype] + t.num_nodes) for ntype, t in mag_tiny.nodes.items()}
    for name, members in {**groups, "train": train}.items():
        counts = np.bincount(metis[members], minlength=num_parts)
        share = members.size / num_parts
        assert np.floor(0.95 * share) - 1 <= counts.min() <= counts.max() <= np.ceil(1.05 * share) + 1, (name, counts)
    random = assign_parts(mag_tiny, num_parts, "random", seed=0)
    assert graph_edge_cut(mag_tiny, metis) < 0.75 * graph_edge_cut(mag_tiny, random)
    np.testing.assert_array_equal(metis, assign_parts(mag_tiny, num_parts, "metis", seed=0))


def test_random_assignment_balances_every_type(mag_tiny):
    parts = assign_parts(mag_tiny, 3, "random", seed=4)
    for ntype, start in mag_tiny.node_offsets().items():
        counts = np.bincount(parts[start:start + mag_tiny.nodes[ntype].num_nodes], minlength=3)
        assert counts.max() - counts.min() <= 1, (ntype, counts)


# ---------------------------------------------------------------------------------- fingerprint

def test_typed_fingerprint_covers_every_type(tmp_path):
    arrays = hand_made_typed_arrays()
    base = read_graph(save_typed_folder(tmp_path / "a", arrays)).fingerprint
    assert base == read_graph(save_typed_folder(tmp_path / "a2", arrays)).fingerprint and len(base) == 64
    changed = hand_made_typed_arrays()
    changed["nodes"]["tag"]["num_nodes"] = np.int64(8)          # a featureless type's count
    assert read_graph(save_typed_folder(tmp_path / "b", changed)).fingerprint != base
    changed = hand_made_typed_arrays()
    changed["edges"][("item", "has", "tag")]["edge_index"][1, 0] += 1   # one edge of one type
    changed["edges"][("item", "has", "tag")]["edge_index"][1, 0] %= 7
    assert read_graph(save_typed_folder(tmp_path / "c", changed)).fingerprint != base
    changed = hand_made_typed_arrays()
    changed["edges"][("item", "tagged", "tag")] = changed["edges"].pop(("item", "has", "tag"))  # a relation name
    assert read_graph(save_typed_folder(tmp_path / "d", changed)).fingerprint != base


# ---------------------------------------------------------------------------------- validation

def _typed_error(capsys, tmp_path, arrays, as_file: bool = False) -> str:
    """Partition ``arrays`` (as a typed folder or a HeteroData file) through the CLI; return the one error line."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if as_file:
        source = tmp_path / "g.pt"
        torch.save(hetero_data(arrays), source)
    else:
        source = save_typed_folder(tmp_path / "in", arrays)
    code = main(["partition", str(source), "-p", "2", "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("graphfeed partition: error: ") and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    return err


def _edit(**changes):
    """The hand-made arrays with ``changes``: ``"ntype.name"`` or ``"src__rel__dst.name"`` -> array (None removes)."""
    arrays = hand_made_typed_arrays()
    for key, value in changes.items():
        owner, name = key.rsplit(".", 1)
        table = arrays["edges"][tuple(owner.split("__"))] if "__" in owner else arrays["nodes"].setdefault(owner, {})
        if value is None:
            table.pop(name)
        else:
            table[name] = value
    return arrays


@pytest.mark.parametrize("as_file", [False, True], ids=["npy", "HeteroData"])
def test_edge_type_naming_a_missing_node_type(tmp_path, capsys, as_file):
    arrays = hand_made_typed_arrays()
    arrays["edges"][("user", "likes", "venue")] = {"edge_index": np.zeros((2, 3), dtype=np.int64)}
    err = _typed_error(capsys, tmp_path, arrays, as_file)
    assert "edge type ('user', 'likes', 'venue')" in err and "destination node type 'venue'" in err
    assert "add node type 'venue'" in err


@pytest.mark.parametrize("as_file", [False, True], ids=["npy", "HeteroData"])
def test_x_rows_differ_from_the_node_count(tmp_path, capsys, as_file):
    err = _typed_error(capsys, tmp_path, _edit(**{"item.x": np.zeros((29, 2))}), as_file)
    assert "node type 'item'" in err and "gives 30 nodes" in err and "gives 29" in err and "one row per node" in err


def test_x_rows_differ_from_num_nodes(tmp_path, capsys):
    err = _typed_error(capsys, tmp_path, _edit(**{"tag.x": np.zeros((6, 2), dtype=np.float32)}))
    assert "node type 'tag'" in err and "num_nodes.npy gives 7 nodes" in err and "x.npy gives 6" in err


def test_y_rows_differ_from_the_node_count(tmp_path, capsys):
    err = _typed_error(capsys, tmp_path, _edit(**{"user.y": np.zeros(41, dtype=np.int64)}))
    assert "node type 'user'" in err and "y.npy gives 41 nodes" in err and "x.npy gives 40" in err


@pytest.mark.parametrize("row,role,expected", [(0, "source", "'user' has 40 nodes"),
                                               (1, "destination", "'item' has 30 nodes")])
@pytest.mark.parametrize("as_file", [False, True], ids=["npy", "HeteroData"])
def test_edge_ids_out_of_range_for_their_type(tmp_path, capsys, as_file, row, role, expected):
    arrays = hand_made_typed_arrays()
    edge_index = arrays["edges"][("user", "buys", "item")]["edge_index"]
    edge_index[row, 4] = 40 if row == 0 else 30
    err = _typed_error(capsys, tmp_path, arrays, as_file)
    assert "edge type ('user', 'buys', 'item')" in err and f"{role} ids" in err and expected in err
    assert "fix the edge list" in err


def test_negative_edge_id(tmp_path, capsys):
    arrays = hand_made_typed_arrays()
    arrays["edges"][("item", "has", "tag")]["edge_index"][1, 0] = -1
    err = _typed_error(capsys, tmp_path, arrays)
    assert "edge type ('item', 'has', 'tag')" in err and "destination ids -1.." in err


@pytest.mark.parametrize("as_file", [False, True], ids=["npy", "HeteroData"])
def test_splits_on_more_than_one_type(tmp_path, capsys, as_file):
    err = _typed_error(capsys, tmp_path, _edit(**{"item.train_idx": np.arange(5)}), as_file)
    assert "'item', 'user'" in err and "trains one node type" in err and "remove them from the others" in err


def test_splits_without_labels_make_an_unlabelled_graph(tmp_path):
    folder = save_typed_folder(tmp_path / "in", _edit(**{"user.y": None, "item.y": None}))
    assert main(["partition", str(folder), "--num-parts", "2", "--output", str(tmp_path / "out"), "-q"]) == 0
    meta = read_meta(tmp_path / "out")
    assert meta.label_type == "user" and "y" not in meta.features["user"] and meta.num_classes == 0


def test_no_train_split(tmp_path, capsys):
    err = _typed_error(capsys, tmp_path, _edit(**{"user.train_mask": None}))
    assert "node type 'user'" in err and "train_idx" in err and "at least one training node" in err



@pytest.mark.parametrize("method", METHODS)
def test_link_only_graph_needs_no_node_split(tmp_path, method):
    """No node split anywhere (link prediction): partitions, with the first labelled type as the label type."""
    arrays = _edit(**{"user.train_mask": None, "user.val_idx": None, "user.test_idx": None})
    source = tmp_path / "g.pt"
    torch.save(hetero_data(arrays), source)
    assert main(["partition", str(source), "-p", "2", "--method", method, "-o", str(tmp_path / "out"), "-q"]) == 0
    meta = read_meta(tmp_path / "out")
    assert meta.label_type == "user"
    parts = open_parts(tmp_path / "out")[1]
    assert sum(int(p.split("train").numel()) for p in parts) == 0


def test_featureless_type_without_num_nodes(tmp_path, capsys):
    err = _typed_error(capsys, tmp_path, _edit(**{"tag.num_nodes": None}))
    assert "node type 'tag' has no x, y or num_nodes" in err and "num_nodes.npy" in err
    # in a HeteroData a type with no attributes does not exist: the edge types naming it say so
    err = _typed_error(capsys, tmp_path / "f", _edit(**{"tag.num_nodes": None}), as_file=True)
    assert "node type 'tag', which the graph does not have" in err and "with x or num_nodes" in err


BAD_DTYPES = {
    "x strings": ("user.x", np.array([["a"]] * 40), "node type 'user'", "must be numeric"),
    "y strings": ("item.y", np.array(["a"] * 30), "node type 'item'", "must be numeric"),
    "edge_index float": ("item__has__tag.edge_index", np.zeros((2, 5), dtype=np.float32),
                         "edge type ('item', 'has', 'tag')", "integer node ids"),
    "edge_attr strings": ("user__buys__item.edge_attr", np.array([["a"]] * 90), "edge type ('user', 'buys', 'item')",
                          "must be numeric"),
    "split float": ("user.val_idx", np.zeros(3, dtype=np.float64), "node type 'user'", "integer node ids"),
    "mask not bool": ("user.train_mask", np.ones(40, dtype=np.int64), "node type 'user'", "bool tensor of shape [40]"),
    "num_nodes float": ("tag.num_nodes", np.float64(7.0), "node type 'tag'", "non-negative integer scalar"),
}


@pytest.mark.parametrize("case", sorted(BAD_DTYPES))
def test_bad_dtypes(tmp_path, capsys, case):
    key, value, names, expected = BAD_DTYPES[case]
    err = _typed_error(capsys, tmp_path, _edit(**{key: value}))
    assert names in err and expected in err, err


def test_layout_mistakes_are_named(tmp_path, capsys):
    folder = save_typed_folder(tmp_path / "a", hand_made_typed_arrays())
    np.save(folder / "user" / "feat.npy", np.zeros(3))
    err = _typed_error_of(capsys, folder, tmp_path)
    assert "user/feat.npy is not part of the typed .npy layout" in err and "x.npy" in err
    folder = save_typed_folder(tmp_path / "b", hand_made_typed_arrays())
    (folder / "user__buys").mkdir()
    assert "src__rel__dst" in _typed_error_of(capsys, folder, tmp_path)
    folder = save_typed_folder(tmp_path / "c", hand_made_typed_arrays())
    (folder / "item__has__tag" / "edge_index.npy").unlink()
    assert "edge type ('item', 'has', 'tag')" in _typed_error_of(capsys, folder, tmp_path)
    folder = save_typed_folder(tmp_path / "d", _edit(**{"user.train_idx": np.arange(3)}))
    err = _typed_error_of(capsys, folder, tmp_path)
    assert "node type 'user'" in err and "train_idx.npy and train_mask both give the train split" in err


def _typed_error_of(capsys, source, tmp_path) -> str:
    code = main(["partition", str(source), "-p", "2", "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    return err


def test_empty_hetero_data_is_refused(tmp_path):
    from torch_geometric.data import HeteroData

    torch.save(HeteroData(), tmp_path / "empty.pt")
    with pytest.raises(InputError, match="HeteroData without node types"):
        read_graph(tmp_path / "empty.pt")


# ---------------------------------------------------------------------------------- generator and CLI

def test_mag_labels_need_the_typed_neighbourhood(mag_tiny):
    """Own features alone classify papers weakly; the majority label of the train papers two typed hops away
    (paper <- author <- paper, paper <- field <- paper) classifies them well."""
    paper, y = mag_tiny.nodes["paper"], mag_tiny.nodes["paper"].y
    train, test, classes = mag_tiny.splits["train"], mag_tiny.splits["test"], mag_tiny.num_classes
    centroids = np.stack([paper.x[train][y[train] == c].mean(0) for c in range(classes)])
    nearest = ((paper.x[test, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
    features_only = float((nearest == y[test]).mean())
    onehot = np.zeros((paper.num_nodes, classes))
    onehot[train, y[train]] = 1

    def pull(etype, values, n):   # sum of values over in-neighbours of the edge type
        ei = mag_tiny.edges[etype].edge_index
        out = np.zeros((n, values.shape[1]))
        np.add.at(out, ei[1], values[ei[0]])
        return out

    n = {t: v.num_nodes for t, v in mag_tiny.nodes.items()}
    votes = pull(("author", "writes", "paper"), pull(("paper", "written_by", "author"), onehot, n["author"]),
                 n["paper"]) + pull(("field", "topic_of", "paper"),
                                    pull(("paper", "has_topic", "field"), onehot, n["field"]), n["paper"])
    majority = float((votes[test].argmax(1) == y[test]).mean())
    assert 0.2 < features_only < 0.4, features_only   # 8 classes: chance is 0.125
    assert majority > 0.75, majority


def test_generate_typed_preset_is_deterministic_and_partitions(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["generate", "--preset", "mag-tiny", "--out", str(out), "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert "paper 6,000" in printed and "author 3,500" in printed and "8 classes" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(["author", "field", "paper", "meta.json",
                                                            *(edge_type_dirname(e) for e in synth.MAG_EDGE_TYPES)])
    assert sorted(p.name for p in (out / "author").iterdir()) == ["num_nodes.npy"]
    again = tmp_path / "again"
    write_graph(again, "mag-tiny", seed=1)
    for f in out.rglob("*.npy"):
        assert f.read_bytes() == (again / f.relative_to(out)).read_bytes(), f
    assert main(["generate", "--preset", "mag-tiny", "--out", str(out), "--seed", "1", "--skip-existing"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["generate", "--preset", "mag-tiny", "--out", str(out), "--seed", "2"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["generate", "--preset", "mag-tiny", "--out", str(out), "--seed", "2", "--overwrite"]) == 0
    capsys.readouterr()
    assert read_graph(out).fingerprint != read_graph(again).fingerprint


def test_cli_partition_and_info_show_per_type_counts(mag_tiny_dir, mag_tiny, tmp_path, capsys):
    out = tmp_path / "p"
    args = ["partition", str(mag_tiny_dir), "-p", "2", "--method", "metis", "-o", str(out), "-q"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "paper train" in printed and "written_by" in printed and "edge cut:" in printed
    assert main(args) == 0 and "up to date" in capsys.readouterr().out
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    meta = read_meta(out)
    assert "node type       author: 3,500 nodes; no features" in info
    assert "node type       paper: 6,000 nodes; x float32[32], y int64[], 8 classes (label type" in info
    for etype in mag_tiny.edge_types:
        assert f"({', '.join(etype)}): {mag_tiny.edges[etype].num_edges:,} edges" in info
    lines = info.splitlines()
    node_table = lines[lines.index(next(x for x in lines if x.startswith("part  author"))):]
    assert node_table[0].split() == ["part", "author", "field", "paper", "paper", "train", "paper", "val", "paper",
                                     "test"]
    rows = {line.split()[0]: line.split() for line in node_table[1:4]}
    assert rows["all"][1:5] == ["3,500", "500", "6,000", f"{mag_tiny.splits['train'].size:,}"]
    assert rows["0"][1:4] == [f"{meta.node_ranges[t][1]:,}" for t in ("author", "field", "paper")]


def test_every_dropped_hetero_data_attribute_is_named(tmp_path, capsys):
    """Attributes partitioning does not store (edge time, edge_label, node pos, a global) are each named
    in the one warning line; stored ones are not."""
    data = hetero_data(hand_made_typed_arrays())
    buys = ("user", "buys", "item")
    data[buys].time = torch.arange(data[buys].edge_index.shape[1])
    data[buys].edge_label = torch.ones(data[buys].edge_index.shape[1])
    data["item"].pos = torch.zeros(30, 2)
    data.note = "kept nowhere"
    source = tmp_path / "g.pt"
    torch.save(data, source)
    assert main(["partition", str(source), "-p", "2", "-o", str(tmp_path / "out"), "-q"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning: not stored" in line]
    assert len(warnings) == 1, warnings
    named = warnings[0].split("splits): ", 1)[1]
    assert named == f"data.note, data['item'].pos, data[{buys!r}].edge_label, data[{buys!r}].time", warnings[0]


def test_random_link_split_output_partitions_without_allow_pickle(tmp_path, capsys):
    import torch_geometric.transforms as T

    data = hetero_data(_edit(**{"user.train_mask": None, "user.val_idx": None, "user.test_idx": None}))
    train, _, _ = T.RandomLinkSplit(num_val=0.1, num_test=0.1, edge_types=("user", "buys", "item"),
                                    rev_edge_types=("item", "bought_by", "user"))(data)
    source = tmp_path / "train.pt"
    torch.save(train, source)
    assert main(["partition", str(source), "-p", "2", "-o", str(tmp_path / "out"), "-q"]) == 0
    err = capsys.readouterr().err
    assert "data[('user', 'buys', 'item')].edge_label_index" in err and "allow-pickle" not in err

    class Stranger:   # any other object is still refused, naming it
        def __reduce__(self):
            return (print, ("unpickled",))

    torch.save({"x": Stranger()}, tmp_path / "evil.pt")
    assert main(["partition", str(tmp_path / "evil.pt"), "-p", "2", "-o", str(tmp_path / "out2"), "-q"]) == 2
    assert "print" in capsys.readouterr().err
