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
