"""Session-wide fixtures of the client tests: one 3000-node graph, its 2 METIS parts, and one cluster
of 2 daemons serving them (:mod:`helpers.shared`), used read-only by every module that does not kill or
reconfigure servers (test_client_remote, test_feature_cache, test_feature_dtype, test_online,
test_shm_channel)."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.shared import remote_graph, serving, write_remote_parts


@pytest.fixture(scope="session")
def shared_graph():
    """``(edge_index, x, y, splits)``: 3000 nodes, average degree 8, 16 features, 4 classes."""
    return remote_graph()


@pytest.fixture(scope="session")
def shared_parts(shared_graph, tmp_path_factory) -> Path:
    """``shared_graph`` as 2 METIS parts, CSC and CSR. Read-only."""
    return write_remote_parts(shared_graph, tmp_path_factory.mktemp("shared") / "parts")


@pytest.fixture(scope="session")
def shared_cluster(shared_parts, tmp_path_factory):
    """2 daemons serving ``shared_parts`` for the whole session (the ``ServerProcess`` list). Never stop,
    kill or reconfigure them in a test: start a cluster of your own for that."""
    with serving(shared_parts, log_dir=tmp_path_factory.mktemp("shared_logs")) as servers:
        yield servers
