"""Partitions and clusters shared by a whole test session (fixtures in ``tests/client/conftest.py``).

A shared partition is written once and only read afterwards; a shared cluster is started once and
serves every test that asks for it, each test opening its own client and sessions (servers serve
several jobs at once by design).  A test that kills, restarts or reconfigures servers starts its own
(:func:`graphfeed.testing.cluster.running_cluster`).  Consecutive tests on one cluster may share one
connected client too (:class:`SharedClient`, the ``connect`` fixture): each ``connect()`` otherwise
forms a new data-path group and starts a session worker per server.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import graphfeed.client as gf
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster

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


class SharedClient:
    """One open client, reused by consecutive tests that connect to the same servers with the same options.

    ``connect(addresses, **options)`` is a context manager like :func:`graphfeed.client.connect` (each
    test still opens its own loaders, hence its own sessions), but leaving it closes only the loaders the
    test made and keeps the client, with its data-path group, for the next test.  It is closed when a
    test connects elsewhere or with other options, when a test raises inside it, before a test that does
    not ask for it (a process holds one client at a time: ``tests/conftest.py``), and before a shared
    cluster stops.
    """

    def __init__(self):
        self._client = None
        self._key: tuple | None = None

    @contextmanager
    def connect(self, addresses, **options) -> Iterator:
        key = (tuple(addresses), tuple(sorted(options.items())))
        if self._key != key or not self._usable():
            self.close()
        if self._client is None:
            self._client = gf.connect(list(addresses), **options)
            self._key = key
        client = self._client
        try:
            yield client
        except BaseException:
            self.close()
            raise
        for loader in list(client._loaders):
            loader.close()

    def _usable(self) -> bool:
        try:
            if self._client is not None:
                self._client._check_usable()
        except Exception:   # noqa: BLE001 -- closed or broken by the last test: any error means a new client
            return False
        return True

    def close(self) -> None:
        client, self._client, self._key = self._client, None, None
        if client is not None:
            client.close()


SHARED_CLIENT = SharedClient()


@contextmanager
def serving(partition, **options) -> Iterator:
    """:func:`running_cluster`, closing the shared client (it may be connected to these servers) before they stop."""
    with running_cluster(partition, **options) as servers:
        try:
            yield servers
        finally:
            SHARED_CLIENT.close()
