"""``graphfeed bench sample``: sampling throughput of the in-process sampler, one JSON line.

The measurement and the meaning of every field live in :mod:`graphfeed.server.bench`.
"""
from __future__ import annotations

import json

from graphfeed.cli.main import UsageError

HELP = "benchmarks: `bench sample` (in-process sampler)"


def _fanouts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--num-neighbors {text!r} is not a comma-separated list of integers, e.g. 15,10,5") from None


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    p = sub.add_parser("sample", help="in-process sampler throughput over the training nodes",
                       description="One warm-up epoch, then the median (and min/max) over --epochs shuffled "
                                   "epochs of the input nodes; prints one JSON line.")
    p.add_argument("--graph", required=True, help="partition folder (from `graphfeed partition`)")
    p.add_argument("--num-neighbors", default="15,10,5", help="per-hop fanouts, -1 = all (default 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    p.add_argument("--features", action="store_true",
                   help="also gather x/y of every sampled node and encode the batch (full produce_batch path)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--epochs", type=int, default=3, help="measured epochs after one warm-up (default 3)")
    p.add_argument("--input", default="train", help="input nodes: train, val, test or all (default train)")
    p.add_argument("--seed", type=int, default=0, help="shuffling and sampling seed (default 0)")
    p.add_argument("--replace", action="store_true", help="sample with replacement")
    p.add_argument("--direction", default="in", choices=("in", "out"), help="in-edges (default) or out-edges")


def run(args) -> int:
    if getattr(args, "bench_command", None) != "sample":
        raise UsageError("choose a benchmark: `graphfeed bench sample --graph DIR ...`")
    from graphfeed.server.bench import SampleBenchConfig, bench_sample

    cfg = SampleBenchConfig(graph=args.graph, num_neighbors=_fanouts(args.num_neighbors),
                            batch_size=args.batch_size, features=args.features, threads=args.threads,
                            epochs=args.epochs, input=args.input, seed=args.seed, replace=args.replace,
                            direction=args.direction)
    print(json.dumps(bench_sample(cfg)), flush=True)
    return 0
