"""Issue 35's fault matrix: every caller of the workers, a fault mid-run, the run equal to an uninterrupted one.

Faults: ``server`` (``kill -9`` of part 1's daemon and its session workers; restarted on its port about a second
later), ``worker`` (``kill -9`` of part 1's session worker alone; its daemon reaps the group, the trainer
re-forms it with a new worker) and ``replica`` (issue 37: part 1 served by two daemons, ``kill -9`` of the one
in use, which stays down for the rest of the run: the trainer moves the part to the other replica instead of
waiting; the killed one is started again after the cell, for the next).  Callers: the node loader, the link
loader, the typed loader, ``client.sample``, PyG's ``NeighborLoader`` over graphfeed's stores, and embedding
training with ``SparseAdam``.  Data paths: the default secure path, and token + TLS (server and replica kills; the
typed cells on the secure path only).  Each cell runs the
caller twice on one client -- once uninterrupted, once with the fault after its third step -- and checks the
second run equals the first: batch for batch (every seed once), sample for sample, and for embeddings the table's
rows bit for bit (the kill lands between steps, once every push was acknowledged: an acknowledged push is in the
owner's update log).  No caller sees a transport's raw error: each goes through the seam's one recovery path.

Other cells live elsewhere: a daemon SIGSTOP in ``test_pauses``, link outages in ``test_hosts``, torch RPC with
``GRAPHFEED_TEST_DATA_PATH=torch-rpc``.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers.graphs import assert_same_batch, mag_tiny_parts, partition_arrays
from helpers.pki import make_pki

import graphfeed.client as gf
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster, start_server

pytestmark = pytest.mark.slow

FANOUTS = [4, 2]
DIM = 8
TOKEN = "gf-fault-matrix-token-0123456789abcdef"
RESTART_DELAY = 1.0     # s between a server's kill and its restart on the same port
WORKER_GONE = 30.0      # s for a killed worker's pid to disappear
NODE = dict(batch_size=48, shuffle=True, seed=3, prefetch=2)
CALLERS = ("node", "link", "typed", "sample", "pyg", "embedding")
CELLS = [("secure", fault, caller) for fault in ("server", "worker", "replica") for caller in CALLERS] + \
        [("tls", fault, caller) for fault in ("server", "replica") for caller in CALLERS if caller != "typed"]


@pytest.fixture(scope="module")
def graph():
    return synth.generate(1200, 8, 8, 4)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    return partition_arrays(graph, tmp_path_factory.mktemp("matrix") / "parts", classes=4, parts=2,
                            name="fault-matrix-1200")


@pytest.fixture(scope="module")
def typed_parts(tmp_path_factory) -> Path:
    parts = tmp_path_factory.mktemp("matrix_mag") / "parts"
    mag_tiny_parts(parts)
    return parts


class Cluster:
    """The daemons (part 0, then part 1 once or -- the replica cells -- twice), how to connect to them, and how to
    start part 1 again after a kill."""

    def __init__(self, parts: Path, servers: list, log_dir: Path, connect: dict, serve: dict):
        self.parts, self.servers, self.log_dir, self.connect_kw, self.serve = parts, servers, log_dir, connect, serve
        self.down = None   # the replica killed by the running cell, started again after it

    def connect(self):
        return gf.connect([s.address for s in self.servers], timeout=60, reconnect_timeout=120, **self.connect_kw)

    def restart(self, victim) -> None:
        """Part 1 again on ``victim``'s port, in place of ``victim`` (the teardown stops the new one)."""
        time.sleep(RESTART_DELAY)
        self.servers[self.servers.index(victim)] = start_server(
            self.parts, 1, log_dir=self.log_dir / f"restart-{time.monotonic_ns()}",
            args=(*self.serve.get("args", ()), "--port", str(victim.port)),
            env=self.serve.get("env"), tls=self.serve.get("tls"))


def _cluster(parts: Path, tmp: Path, connect: dict, replicas: bool = False, **serve):
    env = {"GRAPHFEED_EMBEDDING_DIR": str(tmp / "tables"), **serve.pop("env", {})}   # shared by part 1's replicas
    serve["env"] = env
    with running_cluster(parts, [0, 1, 1] if replicas else None, log_dir=tmp / "logs", **serve) as servers:
        yield Cluster(parts, servers, tmp, connect, serve)


@pytest.fixture(scope="module")
def secure(parts_dir, tmp_path_factory):
    yield from _cluster(parts_dir, tmp_path_factory.mktemp("secure"), {})


@pytest.fixture(scope="module")
def secure_typed(typed_parts, tmp_path_factory):
    yield from _cluster(typed_parts, tmp_path_factory.mktemp("secure_typed"), {})


@pytest.fixture(scope="module")
def secure_replica(parts_dir, tmp_path_factory):
    yield from _cluster(parts_dir, tmp_path_factory.mktemp("secure_replica"), {}, replicas=True)


@pytest.fixture(scope="module")
def secure_typed_replica(typed_parts, tmp_path_factory):
    yield from _cluster(typed_parts, tmp_path_factory.mktemp("secure_typed_replica"), {}, replicas=True)


def _tls(parts_dir, tmp_path_factory, name: str, replicas: bool = False):
    import grpc

    pki = make_pki(tmp_path_factory.mktemp(f"{name}_pki"))
    creds = grpc.ssl_channel_credentials(root_certificates=Path(pki.ca).read_bytes())
    yield from _cluster(parts_dir, tmp_path_factory.mktemp(name), dict(token=TOKEN, tls_ca=pki.ca), replicas,
                        args=("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
                        env={"GRAPHFEED_TOKEN": TOKEN}, tls=creds)


@pytest.fixture(scope="module")
def tls(parts_dir, tmp_path_factory):
    yield from _tls(parts_dir, tmp_path_factory, "tls")


@pytest.fixture(scope="module")
def tls_replica(parts_dir, tmp_path_factory):
    yield from _tls(parts_dir, tmp_path_factory, "tls_replica", replicas=True)


# ---- faults -------------------------------------------------------------------------------------------

def _kill_server(cluster: Cluster, client) -> None:
    victim = cluster.servers[1]
    victim.expect_exit = -signal.SIGKILL
    os.killpg(victim.pid, signal.SIGKILL)   # the daemon and its session workers
    victim.wait(30)
    victim.checked = True
    cluster.restart(victim)


def _kill_replica(cluster: Cluster, client) -> None:
    """``kill -9`` of the part-1 replica the trainer uses; it stays down until the cell ends."""
    victim = next(s for s in cluster.servers if s.address == client.servers[1].address)
    victim.expect_exit = -signal.SIGKILL
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(30)
    victim.checked = True
    cluster.down = victim


def _kill_worker(cluster: Cluster, client) -> None:
    pid = int(client.servers[1].extra["worker_pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WORKER_GONE
    while _alive(pid):
        assert time.monotonic() < deadline, f"the killed worker {pid} is still there after {WORKER_GONE:g} s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


FAULTS = {"server": _kill_server, "worker": _kill_worker, "replica": _kill_replica}


# ---- callers: each runs to its end, calling ``fault()`` after its third step, and returns what it made -----

def _batches(loader, fault) -> list:
    got = []
    for i, batch in enumerate(loader):
        got.append(batch)
        if i == 2 and fault is not None:
            fault()
    return got


def _node(client, fault):
    loader = client.neighbor_loader("test", FANOUTS, **NODE)
    return _batches(loader, fault)


def _link(client, fault):
    edges = _edges(client)
    loader = client.link_neighbor_loader(FANOUTS, edge_label_index=edges, batch_size=64, shuffle=True, seed=3,
                                         neg_sampling_ratio=1.0, prefetch=2)
    return _batches(loader, fault)


def _edges(client) -> torch.Tensor:
    """The same 600 edges each run: sampled once from the graph the servers hold."""
    batch = client.sample(torch.arange(0, 1200, 2), [8], seed=1)
    ei = torch.stack([batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]])
    assert ei.shape[1] >= 600
    return ei[:, :600].contiguous()


def _typed(client, fault):
    loader = client.neighbor_loader(num_neighbors=FANOUTS, input_nodes=("paper", "train"), batch_size=24,
                                    shuffle=True, seed=5, prefetch=2)
    return _batches(loader, fault)


def _sample(client, fault):
    got = []
    for k in range(6):   # seeds on both parts, one call per server in turn
        ids = torch.tensor([5 + k, 700 + k, 11 * k, 1100 + k, 640 - k])
        got.append(client.sample(ids, FANOUTS, seed=9 + k))
        if k == 2 and fault is not None:
            fault()
    return got


def _pyg(client, fault):
    from torch_geometric.loader import NeighborLoader

    from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore

    ids = torch.randperm(1200, generator=torch.Generator().manual_seed(4))   # 50 batches: far past its read-ahead
    loader = NeighborLoader((GraphfeedFeatureStore(client), GraphfeedGraphStore(client)), num_neighbors=FANOUTS,
                            input_nodes=ids, batch_size=24, shuffle=False)
    return _batches(loader, fault)


def _embedding(client, fault):
    """The README's loop: a linear model over the table's rows, SparseAdam on the table; the rows after it."""
    torch.manual_seed(0)
    name = "matrix"   # the same table each run (closed at its end), from the same seed
    table = client.embedding(dim=DIM, seed=1, field="emb", name=name)
    loader = client.neighbor_loader("test", FANOUTS, embeddings=[table], **NODE)
    model = torch.nn.Linear(DIM, 4)
    dense, sparse = torch.optim.Adam(model.parameters(), lr=0.01), gf.SparseAdam([table], lr=0.05)
    steps = 0
    for i, batch in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(batch.emb)[:batch.batch_size], batch.y[:batch.batch_size])
        loss.backward()
        dense.step(), sparse.step()
        dense.zero_grad()
        steps += 1
        if i == 2 and fault is not None:
            table.flush()   # every push acknowledged: in its owner's update log
            fault()
    assert steps == len(loader)
    rows = table.rows(torch.arange(table.num_rows))
    table.close()
    return [rows]


CALL = {"node": _node, "link": _link, "typed": _typed, "sample": _sample, "pyg": _pyg, "embedding": _embedding}


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    else:
        assert_same_batch(a, b)


@pytest.mark.parametrize(("path", "fault", "caller"), CELLS, ids=["-".join(c) for c in CELLS])
def test_a_fault_mid_run_leaves_the_run_equal_to_an_uninterrupted_one(path, fault, caller, request):
    name = path + ("_typed" if caller == "typed" else "") + ("_replica" if fault == "replica" else "")
    cluster: Cluster = request.getfixturevalue(name)
    try:
        with cluster.connect() as client:
            want = CALL[caller](client, None)
            before, moved = client.reconnects, client.replicas.failovers
            got = CALL[caller](client, lambda: FAULTS[fault](cluster, client))
            assert client.reconnects >= before + 1, "the fault did not reach the trainer: no recovery was needed"
            if fault == "replica":   # the part moved to the live replica; the killed one was not waited for
                assert client.replicas.failovers >= moved + 1
                assert client.servers[1].address != cluster.down.address
    finally:
        if cluster.down is not None:
            down, cluster.down = cluster.down, None
            cluster.restart(down)
    assert len(got) == len(want) and (caller == "embedding" or len(want) > 3)
    for k, (a, b) in enumerate(zip(got, want)):
        try:
            _same(a, b)
        except AssertionError as exc:
            raise AssertionError(f"{caller} after a {fault} kill on the {path} path: item {k} of {len(want)} "
                                 f"differs from the uninterrupted run: {exc}") from None
