"""Typed sampling throughput of the three implementations on a one-part typed partition.

    python -m graphfeed.bench.typed_native --graph parts/mag-small [--num-neighbors 15,10]
        [--batch-size 1024] [--threads 2] [--epochs 3] [--direction in] [--replace]

Implementations, all giving the same sample bit for bit (checked on the first batch):

* ``fused``: ``dispatch.fused_sample_typed`` (one native call per batch);
* ``driver-native``: ``neighbor.sample_typed`` over the native ``one_hop`` and relabel;
* ``driver-reference``: ``neighbor.sample_typed`` over the pure-torch ``one_hop`` and relabel.

An epoch is one shuffled pass over the label type's ``train`` nodes in batches of
``batch_size``; ``seeds_per_s`` = seeds of the epoch / wall time, the median over the measured
epochs after one warm-up epoch (as ``graphfeed bench sample`` defines it), and
``cpu_s_per_epoch`` the median CPU time of all threads per epoch (steadier on a shared
machine).  Only the sampling runs (no feature gather).  Needs the native op library and a one-part partition.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from graphfeed.core.spec import NodeInput
from graphfeed.server.partition.format.store import Partition, open_parts
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.neighbor import sample_typed
from graphfeed.server.sampling.types import OneHop, TypedSubgraph

Sampler = Callable[[torch.Tensor, int], TypedSubgraph]    # (label-type seeds, batch seed) -> sample
IMPLEMENTATIONS = ("fused", "driver-native", "driver-reference")


@contextmanager
def _reference_only() -> Iterator[None]:
    """Switches the native library off for the calls inside (the reference path of every op)."""
    saved = dispatch._NATIVE
    dispatch._NATIVE = None
    try:
        yield
    finally:
        dispatch._NATIVE = saved


def samplers(part: Partition, fanouts: dict, direction: str, replace: bool) -> dict[str, Sampler]:
    """The three implementations over ``part`` (which must hold the whole graph)."""
    kind = "csc" if direction == "in" else "csr"
    topos = {e: part.edges(e).topology(kind) for e in fanouts}
    offsets = {t: part.nodes(t).start for t in part.node_types}
    bounds = {t: part.nodes(t).stop for t in part.node_types}
    label = part.label_type

    def fused(seeds: torch.Tensor, seed: int) -> TypedSubgraph:
        return dispatch.fused_sample_typed(topos, offsets, {label: seeds}, fanouts, direction, replace, seed,
                                           node_bounds=bounds)

    def driver(seeds: torch.Tensor, seed: int) -> TypedSubgraph:
        def hop(etype, gids: torch.Tensor, fanout: int, rng_hop: int) -> OneHop:
            center = etype[2] if direction == "in" else etype[0]
            return dispatch.one_hop(topos[etype], gids - offsets[center], gids, fanout, replace, seed, rng_hop)
        return sample_typed({label: seeds}, fanouts, direction, hop)

    def reference(seeds: torch.Tensor, seed: int) -> TypedSubgraph:
        with _reference_only():
            return driver(seeds, seed)

    return {"fused": fused, "driver-native": driver, "driver-reference": reference}


def same(a: TypedSubgraph, b: TypedSubgraph) -> bool:
    """Whether two samples are equal on every tensor and count."""
    tensors = all(getattr(a, f).keys() == getattr(b, f).keys() and
                  all(torch.equal(getattr(a, f)[k], getattr(b, f)[k]) for k in getattr(a, f))
                  for f in ("nodes", "row", "col", "eids"))
    return tensors and a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


def epoch_seconds(sample: Sampler, train: torch.Tensor, batch_size: int, epoch: int) -> tuple[float, float, int]:
    """Wall seconds and CPU seconds (all threads) of one shuffled epoch, and its sampled edges."""
    order = train[torch.randperm(train.numel(), generator=torch.Generator().manual_seed(epoch))]
    edges = 0
    start, cpu = time.perf_counter(), time.process_time()
    for i, b in enumerate(range(0, order.numel(), batch_size)):
        sub = sample(order[b:b + batch_size], epoch * 1_000_003 + i)
        edges += sum(r.numel() for r in sub.row.values())
    return time.perf_counter() - start, time.process_time() - cpu, edges


def run(args: argparse.Namespace) -> list[dict]:
    """One result row per implementation; ValueError for a graph this bench cannot run on."""
    if not dispatch.has_fused_typed_sampler():
        raise ValueError("the native op library is not loaded: build it (`python cuda_ext/build.py`)")
    meta, parts = open_parts(args.graph)
    if len(parts) != 1:
        raise ValueError(f"{args.graph} has {len(parts)} parts; the fused typed sampler needs a one-part partition "
                         f"(re-run `graphfeed partition --num-parts 1`)")
    part = parts[0]
    fanouts = {e: list(args.num_neighbors) for e in part.edge_types}
    train = part.input_nodes(NodeInput(split="train"))
    impls = samplers(part, fanouts, args.direction, args.replace)
    first = train[:args.batch_size]
    outs = {name: fn(first, 1) for name, fn in impls.items()}
    if not all(same(outs["fused"], o) for o in outs.values()):
        raise AssertionError("the implementations disagree on the first batch")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name in args.impl:
        epoch_seconds(impls[name], train, args.batch_size, 0)                      # warm-up
        timed = [epoch_seconds(impls[name], train, args.batch_size, e) for e in range(1, args.epochs + 1)]
        rates = [train.numel() / wall for wall, _, _ in timed]
        rows.append({"impl": name, "threads": torch.get_num_threads(), "seeds": train.numel(),
                     "seeds_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                     "cpu_s_per_epoch": statistics.median(cpu for _, cpu, _ in timed),
                     "sampled_edges_per_epoch": timed[0][2]})
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m graphfeed.bench.typed_native", description=__doc__.split("\n")[0])
    p.add_argument("--graph", required=True, help="a one-part typed partition folder")
    p.add_argument("--num-neighbors", default="15,10", type=lambda s: tuple(int(x) for x in s.split(",")),
                   help="per-hop fanouts, applied to every edge type (default 15,10)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--epochs", type=int, default=3, help="measured epochs after one warm-up (default 3)")
    p.add_argument("--direction", choices=("in", "out"), default="in")
    p.add_argument("--replace", action="store_true")
    p.add_argument("--impl", nargs="+", choices=IMPLEMENTATIONS, default=list(IMPLEMENTATIONS))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rows = run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in rows:
        print(f"{r['impl']:>17}  threads={r['threads']}  seeds/s={r['seeds_per_s']:>10.0f}  "
              f"(min {r['min']:.0f}, max {r['max']:.0f})  cpu_s/epoch={r['cpu_s_per_epoch']:.3f}  "
              f"({r['seeds']} seeds, {r['sampled_edges_per_epoch']} edges/epoch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
