"""Partitions and clusters shared by a whole test session (fixtures in ``tests/client/conftest.py``).

A shared partition is written once and only read afterwards; a shared cluster is started once and
serves every test that asks for it, each test opening its own client and sessions (servers serve
several jobs at once by design).  A test that kills, restarts or reconfigures servers starts its own
(:func:`graphfeed.testing.cluster.running_cluster`).
"""
from __future__ import annotations

from pathlib import Path

from graphfeed.server.partition import builder, synth

REMOTE_NODES = 3000
REMOTE_CLASSES = 4


def remote_graph():
    """``(edge_index, x, y, splits)``: 3000 nodes, average degree 8, 16 features, 4 classes."""
    return synth.generate(REMOTE_NODES, 8, 16, REMOTE_CLASSES)


def write_remote_parts(graph, out: Path) -> Path:
    """``graph`` as 2 METIS parts (seed 0) with CSC and CSR topology (``direction="out"`` works) to ``out``."""
    ei, x, y, splits = graph
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=REMOTE_CLASSES, name="remote-3000",
                           fingerprint="remote-3000")
    builder.partition_graph(g, 2, out, method="metis", topologies=("csc", "csr"), seed=0)
    return out
