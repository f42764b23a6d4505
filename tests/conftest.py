"""Shared fixtures (the tiny synthetic graph generated once per session, Cora, a partitioned tiny graph)
and the tiers: every test that starts a real process is marked ``slow`` here (see :mod:`helpers.tiers`),
so ``python -m pytest -m "not slow"`` is the fast tier and a plain ``python -m pytest`` runs everything."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers.cluster import daemon_setting_names
from helpers.graphs import mag_tiny_parts
from helpers.shared import SHARED_CLIENT, serving
from helpers.tiers import starts_processes

from graphfeed.cli.generate import write_graph
from graphfeed.server.partition.build.builder import partition_graph
from graphfeed.server.partition.inputs.reader import read_graph

# GRAPHFEED_CORA_DIR: another copy (a git worktree's ../shared is not the main checkout's)
CORA_DIR = Path(os.environ.get("GRAPHFEED_CORA_DIR")
                or Path(__file__).resolve().parents[2] / "shared" / "data" / "cora")


def pytest_collection_modifyitems(items):
    for item in items:
        if starts_processes(item):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def connect():
    """``connect(addresses, **options)``: :meth:`helpers.shared.SharedClient.connect`, a client kept open for
    the next test that connects the same way (use it as ``with connect(addresses, timeout=60) as client:``)."""
    return SHARED_CLIENT.connect


@pytest.fixture(scope="module", autouse=True)
def no_shared_client_across_modules():
    """Each module starts with no shared client open: its module fixtures may connect themselves."""
    SHARED_CLIENT.close()


@pytest.fixture(autouse=True)
def one_client_at_a_time(request):
    """A test that does not ask for ``connect`` starts with no shared client open (it may connect itself)."""
    if "connect" not in request.fixturenames:
        SHARED_CLIENT.close()
    yield


@pytest.fixture(scope="session", autouse=True)
def hermetic_daemon_settings():
    """No ``GRAPHFEED_<KEY>`` daemon setting of the caller's environment reaches the daemons tests start.

    One setting is set instead: ``colocated_reads: false``.  Every server of a test shares this host, so
    by default their workers would read each other's parts from the shared files; the tests run the
    path servers on different hosts take (peer workers over torch RPC), and ``test_colocated.py`` runs
    the same-host one (``env={"GRAPHFEED_COLOCATED_READS": "true"}``).  ``GRAPHFEED_TEST_COLOCATED=1`` runs
    every test's servers with the same-host path instead.  The servers serve the secure data path (the
    default); ``GRAPHFEED_TEST_DATA_PATH=torch-rpc`` runs every test's servers with torch RPC
    (``data_path: torch-rpc``) and has every trainer ask for it by name (``GRAPHFEED_TRANSPORT``)."""
    colocated = os.environ.get("GRAPHFEED_TEST_COLOCATED") == "1"
    data_path = os.environ.get("GRAPHFEED_TEST_DATA_PATH")
    with pytest.MonkeyPatch.context() as patch:
        for name in daemon_setting_names():
            patch.delenv(name, raising=False)
        patch.delenv("GRAPHFEED_TRANSPORT", raising=False)   # the trainers' transport: the default, or below
        patch.setenv("GRAPHFEED_COLOCATED_READS", "true" if colocated else "false")
        if data_path:
            patch.setenv("GRAPHFEED_DATA_PATH", data_path)
            patch.setenv("GRAPHFEED_TRANSPORT", data_path)
        yield


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread():
    """Every process of the session samples with one intra-op thread: this one (``torch.set_num_threads``)
    and the daemons, workers and trainers it starts (``OMP_NUM_THREADS=1``, inherited).  The batches do not
    depend on the thread count (kernels write by index; the tests that check this set 2 or 3 threads
    themselves), while on a shared 2-core machine torch's spinning OpenMP threads make each small op many
    times slower than one thread is."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_graph_dir(tmp_path_factory) -> Path:
    """The ``tiny`` preset (10,000 nodes, ~96k directed edges, 32 features) in the .npy layout."""
    out = tmp_path_factory.mktemp("tiny") / "graph"
    write_graph(out, "tiny", seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_graph(tiny_graph_dir):
    """The tiny graph as a validated :class:`GraphInput` (arrays memory-mapped read-only)."""
    return read_graph(tiny_graph_dir)


@pytest.fixture(scope="session")
def cora_dir() -> Path:
    """Cora (Planetoid public split) in the .npy layout, from ``../shared/data/cora``; skipped if absent."""
    if not (CORA_DIR / "edge_index.npy").is_file():
        pytest.skip(f"Cora not found at {CORA_DIR}")
    return CORA_DIR


@pytest.fixture(scope="session")
def tiny_parts_dir(tiny_graph, tmp_path_factory) -> Path:
    """The tiny graph partitioned into 2 parts with METIS (seed 0), CSC and CSR topology. Read-only."""
    out = tmp_path_factory.mktemp("tiny_parts") / "parts"
    partition_graph(tiny_graph, 2, out, method="metis", topologies=("csc", "csr"), seed=0)
    return out


@pytest.fixture(scope="session")
def shared_mag(tmp_path_factory):
    """``(parts folder, graph)``: the mag-tiny preset, METIS into 2 parts, CSC + CSR (:func:`mag_tiny_parts`).
    Read-only."""
    out = tmp_path_factory.mktemp("shared_mag") / "parts"
    return out, mag_tiny_parts(out)


@pytest.fixture(scope="session")
def shared_mag_cluster(shared_mag, tmp_path_factory):
    """2 daemons serving ``shared_mag`` for the whole session. Never stop, kill or reconfigure them in a
    test: start a cluster of your own for that."""
    with serving(shared_mag[0], log_dir=tmp_path_factory.mktemp("shared_mag_logs")) as servers:
        yield servers
