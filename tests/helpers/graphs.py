"""Small partitioned synthetic graphs for the tests that start real servers."""
from __future__ import annotations

from pathlib import Path

from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth


def synthetic_parts(out: Path, *, nodes: int, avg_degree: float, features: int, classes: int, parts: int,
                    name: str) -> Path:
    """Generate a synthetic graph and write it, randomly partitioned into ``parts`` (CSC), to ``out``.

    ``name`` becomes both the graph name and its fingerprint in META.json.
    """
    return partition_arrays(synth.generate(nodes, avg_degree, features, classes), out, classes=classes, parts=parts,
                            name=name)


def partition_arrays(arrays, out: Path, *, classes: int, parts: int, name: str, method: str = "random") -> Path:
    """Write ``arrays`` (``(edge_index, x, y, splits)`` as :func:`synth.generate` gives them), partitioned into
    ``parts`` by ``method`` (CSC), to ``out``; ``name`` becomes the graph name and its fingerprint."""
    ei, x, y, splits = arrays
    graph = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, name=name, fingerprint=name,
                               num_classes=classes)
    builder.partition_graph(graph, parts, out, method=method)
    return out


# ---------------------------------------------------------------------------------- typed graphs

def hand_made_typed_arrays(seed: int = 0) -> dict:
    """A small typed graph as plain arrays: ``{"nodes": {ntype: {name: array}}, "edges": {etype: {name: array}}}``.

    ``user`` holds x, y and the splits (train as a mask, val/test as ids); ``item`` has float64
    features and labels but no splits; ``tag`` is featureless (only ``num_nodes``). Edge lists
    hold duplicates and self loops, one is int32, one carries edge features.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    users, items, tags = 40, 30, 7
    train = np.zeros(users, dtype=bool)
    train[rng.choice(users, 12, replace=False)] = True
    rest = np.flatnonzero(~train)
    buys = np.stack([rng.integers(0, users, 90), rng.integers(0, items, 90)])
    buys[:, 1] = buys[:, 0]   # a duplicate edge
    has = np.stack([rng.integers(0, items, 50), rng.integers(0, tags, 50)])
    follows = np.stack([rng.integers(0, users, 70), rng.integers(0, users, 70)]).astype(np.int32)
    follows[:, :3] = [[5, 6, 7], [5, 6, 7]]   # self loops
    nodes = {
        "user": {"x": rng.standard_normal((users, 3)).astype(np.float32), "y": rng.integers(0, 4, users),
                 "train_mask": train, "val_idx": rest[:10], "test_idx": rest[10:]},
        "item": {"x": rng.standard_normal((items, 2)), "y": rng.integers(0, 5, items)},
        "tag": {"num_nodes": np.int64(tags)},
    }
    edges = {
        ("user", "buys", "item"): {"edge_index": buys,
                                   "edge_attr": np.arange(2 * buys.shape[1], dtype=np.float32).reshape(-1, 2)},
        ("item", "bought_by", "user"): {"edge_index": buys[::-1].copy()},
        ("item", "has", "tag"): {"edge_index": has},
        ("user", "follows", "user"): {"edge_index": follows},
    }
    return {"nodes": nodes, "edges": edges}


def save_typed_folder(folder: Path, arrays: dict) -> Path:
    """Write :func:`hand_made_typed_arrays`-style arrays in the typed .npy layout (one folder per type)."""
    import numpy as np

    for ntype, named in arrays["nodes"].items():
        (folder / ntype).mkdir(parents=True, exist_ok=True)
        for name, value in named.items():
            np.save(folder / ntype / f"{name}.npy", value)
    for etype, named in arrays["edges"].items():
        (folder / "__".join(etype)).mkdir(parents=True, exist_ok=True)
        for name, value in named.items():
            np.save(folder / "__".join(etype) / f"{name}.npy", value)
    return folder


def hetero_data(arrays: dict):
    """The same arrays as a PyG ``HeteroData`` (``num_nodes`` as an int attribute)."""
    import torch
    from torch_geometric.data import HeteroData

    data = HeteroData()
    for ntype, named in arrays["nodes"].items():
        for name, value in named.items():
            data[ntype][name] = int(value) if name == "num_nodes" else torch.from_numpy(value)
    for etype, named in arrays["edges"].items():
        for name, value in named.items():
            data[etype][name] = torch.from_numpy(value)
    return data


def mag_tiny_parts(out: Path, *, parts: int = 2, method: str = "metis"):
    """The ``mag-tiny`` preset (papers, authors, fields; 5 edge types) partitioned into ``out`` with CSC and
    CSR topology; returns its :class:`GraphInput` (the original arrays the tests check against)."""
    graph = synth.generate_mag_preset("mag-tiny", seed=0)
    builder.partition_graph(graph, parts, out, method=method, topologies=("csc", "csr"), seed=0)
    return graph


def check_typed_batch(batch, graph, fanouts: dict, *, direction: str = "in", replace: bool = False) -> None:
    """Sampler invariants of one ``HeteroData`` batch against ``graph`` (a typed :class:`GraphInput`).

    Every sampled edge is edge ``e_id`` of its relation in original ids; per edge type and hop,
    every frontier node of the hop's center type got exactly ``min(degree, fanout)`` edges
    (``fanout`` -1: all; with replacement ``fanout`` when it has any edge; 0: none); node ids are
    distinct per type; without replacement no edge repeats; features and labels are the
    original rows of ``n_id``; types without features carry no ``x``.
    """
    import numpy as np
    import torch

    for ntype in batch.node_types:
        n_id = batch[ntype].n_id
        assert n_id.unique().numel() == n_id.numel(), f"{ntype}: repeated nodes"
        node = graph.nodes[ntype]
        for name in ("x", "y"):
            want = getattr(node, name)
            if want is None:
                assert name not in batch[ntype], f"{ntype} has no {name} in the graph but the batch has one"
            else:
                assert torch.equal(batch[ntype][name], torch.from_numpy(np.asarray(want)[n_id.numpy()])), \
                    f"{ntype}.{name} rows differ from the graph's"
    for etype in batch.edge_types:
        _check_edge_type(batch, graph, etype, fanouts[etype], direction, replace)


def _check_edge_type(batch, graph, etype, fanouts, direction: str, replace: bool) -> None:
    import numpy as np
    import torch

    src, _, dst = etype
    ei, e_id = batch[etype].edge_index, batch[etype].e_id
    orig = torch.from_numpy(np.asarray(graph.edges[etype].edge_index, dtype=np.int64))
    assert torch.equal(batch[src].n_id[ei[0]], orig[0, e_id]) and torch.equal(batch[dst].n_id[ei[1]], orig[1, e_id]), \
        f"{etype}: a sampled edge is not edge e_id of the relation"
    if not replace:
        assert e_id.unique().numel() == e_id.numel(), f"{etype}: an edge was sampled twice without replacement"
    center_type, side = (dst, 1) if direction == "in" else (src, 0)
    degree = torch.bincount(orig[side], minlength=graph.nodes[center_type].num_nodes)
    per_hop = batch[etype].num_sampled_edges
    nsn = batch[center_type].num_sampled_nodes
    assert len(per_hop) == len(fanouts) and sum(per_hop) == e_id.numel()
    start = 0
    for hop, (k, count) in enumerate(zip(fanouts, per_hop)):
        centers = ei[side, start:start + count]
        start += count
        lo, hi = sum(nsn[:hop]), sum(nsn[:hop + 1])          # the center type's frontier at this hop
        assert bool(((centers >= lo) & (centers < hi)).all()), f"{etype} hop {hop}: edge of a non-frontier node"
        got = torch.bincount(centers - lo, minlength=hi - lo)
        deg = degree[batch[center_type].n_id[lo:hi]]
        if k == 0:
            want = torch.zeros_like(deg)
        elif k == -1:
            want = deg
        else:
            want = torch.where(deg > 0, torch.full_like(deg, k), deg) if replace else deg.clamp(max=k)
        assert torch.equal(got, want), f"{etype} hop {hop}: per-node edge counts differ from min(degree, {k})"


def assert_same_batch(a, b) -> None:
    """Batches (``Data``, ``HeteroData`` or plain mappings) equal on every key of every store, dtypes included."""
    assert type(a) is type(b), (type(a), type(b))
    if hasattr(a, "node_types"):
        assert a.node_types == b.node_types and a.edge_types == b.edge_types
    stores_a, stores_b = (list(x.stores) if hasattr(x, "stores") else [x] for x in (a, b))
    assert len(stores_a) == len(stores_b)
    for sa, sb in zip(stores_a, stores_b):
        assert set(sa.keys()) == set(sb.keys()), (sa.keys(), sb.keys())
        for key in sb.keys():
            assert same_value(sa[key], sb[key]), key


def same_value(a, b) -> bool:
    """Tensors: same dtype and equal elements; anything else: ``==``."""
    import torch

    return a.dtype == b.dtype and torch.equal(a, b) if torch.is_tensor(b) else a == b


def partition_with_hard_negatives(graph, out, fingerprint: str):
    """``graph`` = ``(edge_index, x, y, splits, hard_neg_dst)`` (3 classes) as 2 METIS parts under ``out``, each
    edge's hard negatives stored with it (the link-option tests' partition, local and remote)."""
    from graphfeed.server.partition.build import builder
    from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE

    ei, x, y, splits, hard = graph
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=3, fingerprint=fingerprint)
    g.edges[DEFAULT_EDGE_TYPE].hard_neg_dst = hard
    builder.partition_graph(g, 2, out, method="metis", topologies=("csc",))
    return out
