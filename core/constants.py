"""Limits and names that the client and the servers must agree on (defined once, here)."""
from __future__ import annotations

MAX_BATCH_SIZE = 1 << 22     # seeds per batch
MAX_WORLD_SIZE = 1 << 16     # DDP ranks of one loader
MAX_FANOUT = 1 << 20         # neighbors per node per hop (-1 = all)
SPLITS = ("train", "val", "test")   # named input sets stored with a partition
DIRECTIONS = ("in", "out")   # sample in-edges (PyG's default) or out-edges

# A homogeneous graph is the one-type case of a typed graph: one node type and one edge type
# (the partition format's type folders and the batch keys use these names).
DEFAULT_NODE_TYPE = "_N"
DEFAULT_EDGE_TYPE = ("_N", "to", "_N")
MAX_TYPE_NAME_LENGTH = 256   # characters of a node type or relation name

# The data-path group: the trainer is rank 0, part K's session worker rank 1 + K.
TRAINER = "trainer"


def worker_name(part: int) -> str:
    """torch RPC name of part ``part``'s session worker in a trainer's group."""
    return f"part{part}"


# A Drain call's reason (``graphfeed drain --reason``): the daemon logs it, on one line.
MAX_DRAIN_REASON = 200       # characters


def check_drain_reason(reason: str) -> str:
    """``reason`` when it is a Drain's reason the daemon logs: at most MAX_DRAIN_REASON printable characters;
    ValueError naming what is wrong otherwise."""
    if len(reason) > MAX_DRAIN_REASON:
        raise ValueError(f"the drain reason has {len(reason)} characters: give at most {MAX_DRAIN_REASON} "
                         f"(it is logged)")
    if not reason.isprintable():
        raise ValueError("the drain reason holds control characters (a line break, a tab, ...): give one line of "
                         "printable text (it is logged)")
    return reason
