"""Fixtures of the PyG remote-backend tests: the 3000-node graph of :mod:`helpers.shared` as 2 METIS parts and
2 daemons serving it for this folder's tests (read-only; never stop or reconfigure them in a test)."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.shared import remote_graph, serving, write_remote_parts


@pytest.fixture(scope="session")
def pyg_graph():
    """``(edge_index, x, y, splits)``: 3000 nodes, average degree 8, 16 features, 4 classes."""
    return remote_graph()


@pytest.fixture(scope="session")
def pyg_parts(pyg_graph, tmp_path_factory) -> Path:
    return write_remote_parts(pyg_graph, tmp_path_factory.mktemp("pyg") / "parts")


@pytest.fixture(scope="session")
def pyg_cluster(pyg_parts, tmp_path_factory):
    with serving(pyg_parts, log_dir=tmp_path_factory.mktemp("pyg_logs")) as servers:
        yield servers
