"""``graphfeed quantize PARTITION``: store the int8 feature scales (``feature_dtype="int8"``) in a partition.

``graphfeed partition`` stores them; a partition written by an older graphfeed has none, and a loader
asking for int8 features is refused with a line naming this command.  It reads every part's ``x``
(memory-mapped, in chunks), computes each node type's per-column scale and offset over the whole graph
(:mod:`graphfeed.server.partition.format.quantize`) and writes them into every part.  Run it while no server
serves the folder (a server notices changed part files and reports NOT_SERVING).
"""
from __future__ import annotations

from graphfeed.server.partition.format.quantize import add_scales

HELP = "store int8 feature scales in a partition written before they were"


def add_arguments(parser) -> None:
    parser.add_argument("partition", help="partition folder (holds META.json)")


def run(args) -> int:
    done = add_scales(args.partition)
    if not done:
        print(f"{args.partition}: no node type has floating-point features: nothing to quantize")
        return 0
    print(f"{args.partition}: int8 scales stored for " + ", ".join(f"{t} ({f} columns)" for t, f in done.items()))
    return 0
