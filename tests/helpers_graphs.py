"""Small partitioned synthetic graphs for the tests that start real servers."""
from __future__ import annotations

from pathlib import Path

from graphfeed.server.partition import builder, synth


def synthetic_parts(out: Path, *, nodes: int, avg_degree: float, features: int, classes: int, parts: int,
                    name: str) -> Path:
    """Generate a synthetic graph and write it, randomly partitioned into ``parts`` (CSC), to ``out``.

    ``name`` becomes both the graph name and its fingerprint in META.json.
    """
    ei, x, y, splits = synth.generate(nodes, avg_degree, features, classes)
    graph = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, name=name, fingerprint=name,
                               num_classes=classes)
    builder.partition_graph(graph, parts, out)
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
