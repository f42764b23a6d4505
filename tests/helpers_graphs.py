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
