"""DGL side of the sampler comparison (issue 4): DGL's fused NeighborSampler on the same graph.

Runs in a SEPARATE virtual environment (DGL 2.1 needs torch 2.2; graphfeed is not
imported here)::

    python3 -m venv /tmp/dglvenv
    /tmp/dglvenv/bin/pip install dgl==2.1.0 torch==2.2.1 'numpy<2' torchdata==0.7.1 pandas pydantic pyyaml
    OMP_NUM_THREADS=1 /tmp/dglvenv/bin/python bench/dgl_compare.py --graph /tmp/gf_medium --threads 1

``--graph`` is a graph folder from ``shared/bench/synth_graph.py`` (edge_index.npy, x.npy,
y.npy, train_idx.npy).  Workload and figures follow ``graphfeed bench sample``: shuffled
training nodes in batches of ``--batch-size``, in-edges, no replacement, one warm-up
epoch then the median of ``--epochs`` epochs (with min/max); ``sampled_edges_per_s``
counts every block's edges (DGL re-samples each layer's destinations, so it samples
~15% more edges per batch than PyG-style samplers).  With ``--features``, x and y of the
input nodes of every batch are gathered (``prefetch_node_feats``/``prefetch_labels``).
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import numpy as np


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graph", required=True, help="folder with edge_index.npy, x.npy, y.npy, train_idx.npy")
    p.add_argument("--num-neighbors", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--features", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def load_graph(folder: str, features: bool):
    import dgl
    import torch

    edge_index = np.load(os.path.join(folder, "edge_index.npy"), mmap_mode="r")
    x = np.load(os.path.join(folder, "x.npy"), mmap_mode="r")
    g = dgl.graph((torch.from_numpy(np.ascontiguousarray(edge_index[0])),
                   torch.from_numpy(np.ascontiguousarray(edge_index[1]))), num_nodes=x.shape[0])
    if features:
        g.ndata["feat"] = torch.from_numpy(np.ascontiguousarray(x))
        g.ndata["label"] = torch.from_numpy(np.load(os.path.join(folder, "y.npy")))
    g = g.formats(["csc"])
    g.create_formats_()
    train = torch.from_numpy(np.load(os.path.join(folder, "train_idx.npy"))).long()
    return g, train


def run_epoch(g, train, sampler, batch_size: int, seed: int) -> tuple[float, int, int]:
    import dgl
    import torch

    loader = dgl.dataloading.DataLoader(g, train, sampler, batch_size=batch_size, shuffle=True,
                                        drop_last=False, num_workers=0, use_uva=False)
    torch.manual_seed(seed)
    edges = batches = 0
    start = time.perf_counter()
    for _input_nodes, _output_nodes, blocks in loader:
        edges += sum(b.num_edges() for b in blocks)
        batches += 1
    return time.perf_counter() - start, batches, edges


def main() -> None:
    args = parse_args()
    import dgl
    import torch

    torch.set_num_threads(args.threads)
    fanouts = [int(k) for k in args.num_neighbors.split(",")]
    g, train = load_graph(args.graph, args.features)
    kwargs = dict(prefetch_node_feats=["feat"], prefetch_labels=["label"]) if args.features else {}
    # --num-neighbors is PyG's order (the first fanout is the seeds' hop); DGL's NeighborSampler takes one
    # fanout per layer, input layer first, so its LAST fanout is the seeds' hop: reverse.
    sampler = dgl.dataloading.NeighborSampler(fanouts[::-1], replace=False, fused=True, **kwargs)
    run_epoch(g, train, sampler, args.batch_size, args.seed)          # warm-up
    runs = [run_epoch(g, train, sampler, args.batch_size, args.seed + 1 + e) for e in range(args.epochs)]
    rates = {"seeds_per_s": [train.numel() / s for s, _, _ in runs],
             "batches_per_s": [b / s for s, b, _ in runs],
             "sampled_edges_per_s": [e / s for s, _, e in runs]}
    out = {k: round(statistics.median(v), 1) for k, v in rates.items()}
    out["min"] = {k: round(min(v), 1) for k, v in rates.items()}
    out["max"] = {k: round(max(v), 1) for k, v in rates.items()}
    out.update(seeds_per_epoch=int(train.numel()), batches_per_epoch=runs[0][1],
               sampled_edges_per_epoch=runs[0][2],
               peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               implementation=f"dgl-{dgl.__version__}-fused", threads=args.threads, graph=args.graph,
               num_neighbors=fanouts, batch_size=args.batch_size, features=args.features, epochs=args.epochs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
