"""The secure data path through real daemons (2 parts, peers over the data path): the attack, TLS, binding.

* An outsider process without the group key sends a crafted pickle (whose ``__reduce__`` would
  write a marker file), a forged handshake and every allow-listed call to each worker's listener
  (the one listener a worker has: the trainer's and the peers' calls arrive there) while the
  trainer runs an epoch: nothing runs, every attempt is dropped, the refusal metric counts them,
  one log line says so, the epoch has every seed exactly once and the servers stay SERVING.
* Nothing else listens: no torch RPC agent, no TensorPipe, no TCPStore in the trainer or the
  workers; the workers listen only on the data address.
* With TLS, a loopback proxy between every pair (trainer -> worker and worker -> worker) captures
  an epoch's bytes: no feature row, session id, session secret or token appears in clear.  With a
  token and no TLS, proxies on the control ports too: the group key crosses in clear (the capture is
  real) but no key derived from it, no session secret and no row; the group key alone opens nothing.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
from pathlib import Path

import grpc
import psutil
import pytest
import torch
from helpers.pki import make_pki
from prometheus_client.parser import text_string_to_metric_families

import graphfeed.client as gf
from graphfeed.client import group as client_group
from graphfeed.core.epoch import plan_epoch
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import SERVING, health_status, running_cluster
from graphfeed.transport import rpc_group
from graphfeed.transport.secure import SecureCalls
from graphfeed.transport.secure.keys import TRAINER, group_root, pair_key

TOKEN = "gf-secure-test-token-0123456789abcdef"
FANOUTS = [4, 2]
KW = dict(batch_size=32, shuffle=True, seed=5)


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    ei, x, y, splits = synth.generate(2000, 6, 16, 4)
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=4, fingerprint="secure-2000")
    out = tmp_path_factory.mktemp("secure") / "parts"
    builder.partition_graph(g, 2, out, method="metis", topologies=("csc",))
    return out


@pytest.fixture(scope="module")
def token_cluster(parts_dir, tmp_path_factory):
    """A token, no TLS: the data path's keys come from an X25519 exchange per connection behind the pair keys."""
    with running_cluster(parts_dir, args=("--metrics-port", "0"), env={"GRAPHFEED_TOKEN": TOKEN},
                         log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_cluster(parts_dir, pki, tmp_path_factory):
    with running_cluster(parts_dir, args=("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
                         env={"GRAPHFEED_TOKEN": TOKEN}, log_dir=tmp_path_factory.mktemp("logs"),
                         tls=_tls(pki)) as servers:
        yield servers


@pytest.fixture(scope="module")
def mtls_cluster(parts_dir, pki, tmp_path_factory):
    """mTLS on the control plane, so the data listeners ask the trainer for its certificate; the workers check
    their peers' certificates against tls_peer_ca."""
    tls = ("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca),
           "--tls-peer-ca", str(pki.ca))
    creds = grpc.ssl_channel_credentials(root_certificates=Path(pki.ca).read_bytes(),
                                         private_key=Path(pki.client_key).read_bytes(),
                                         certificate_chain=Path(pki.client_cert).read_bytes())
    with running_cluster(parts_dir, args=tls, env={"GRAPHFEED_TOKEN": TOKEN}, tls=creds,
                         log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


def _seeds_once(batches, n_train: int) -> None:
    seeds = torch.cat([b.n_id[:b.batch_size] for b in batches])
    assert seeds.numel() == n_train == seeds.unique().numel()


def _listening(pid: int) -> list[tuple[str, int]]:
    return sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
                  if c.status == psutil.CONN_LISTEN)


def _refused(server) -> float:
    with urllib.request.urlopen(f"http://{server.host}:{server.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "graphfeed_errors_total" and s.labels.get("kind") == "data_path_refused":
                return s.value
    return 0.0


# The outsider: it knows every worker's address (it could scan for them) but not the group key.
ATTACKER = textwrap.dedent('''
    import json, os, pickle, secrets, socket, struct, sys
    endpoints, marker, names = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])

    class Evil:
        def __reduce__(self):
            return (exec, (f"open({marker!r}, 'w').write('pwned')",))

    PAYLOAD = pickle.dumps(Evil())

    def frame(name):
        header = json.dumps({"k": "call", "id": 1, "fn": name, "v": [], "b": []}).encode()
        return struct.pack("!IQ", len(header), 0) + header + bytes(32)

    def attempt(address, first, then=b""):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=15) as s:
            s.settimeout(15)
            s.sendall(first)
            got = b""
            try:
                if then:   # a forged handshake: read the server's hello, answer with a guessed proof
                    while len(got) < 101:
                        chunk = s.recv(101 - len(got))
                        if not chunk:
                            return "closed"
                        got += chunk
                    s.sendall(secrets.token_bytes(32) + then)
                    got = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        return "closed" if not got else "answered"
                    got += chunk
            except (ConnectionResetError, BrokenPipeError):
                return "closed"
            except socket.timeout:
                return "timeout"

    results = {}
    for part, address in endpoints.items():   # a version-4 hello as the trainer, with a random key share
        hello = b"GFDP\\x04" + struct.pack("!ii", -1, int(part)) + secrets.token_bytes(64)
        out = [attempt(address, PAYLOAD), attempt(address, frame("gather")),
               attempt(address, hello, PAYLOAD)]
        out += [attempt(address, hello, frame(name)) for name in names]
        results[part] = out
    print(json.dumps(results))
''')


def test_an_outsider_without_the_key_runs_nothing_and_is_refused(token_cluster, parts_dir, tmp_path):
    addresses = [s.address for s in token_cluster]
    before = set(_listening(psutil.Process().pid))   # earlier tests in this process may have left a listener
    with gf.connect(addresses, token=TOKEN, timeout=60) as client:
        group = client.group
        assert group.data_path == "secure"
        import torch.distributed.rpc.api as rpc_api

        assert not rpc_api._is_current_rpc_agent_set()     # the trainer joined no torch RPC group ...
        assert set(_listening(psutil.Process().pid)) - before == set()   # ... and opened no listener
        for s in client.servers:                             # each worker: one listener, on the data address
            [(ip, port)] = _listening(s.extra["worker_pid"])
            assert (ip, port) == ("127.0.0.1", int(group.endpoints[s.part].rsplit(":", 1)[1]))
        before = [_refused(s) for s in token_cluster]
        loader = client.neighbor_loader("train", FANOUTS, **KW)
        out: dict = {}
        epoch = threading.Thread(target=lambda: out.update(batches=list(loader)), daemon=True)
        epoch.start()
        marker = tmp_path / "pwned"
        endpoints = json.dumps({str(k): v for k, v in group.endpoints.items()})
        run = subprocess.run([sys.executable, "-c", ATTACKER, endpoints, str(marker),
                              json.dumps(list(rpc_group.WORKER_RPC_FUNCTIONS))],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        epoch.join(300)
        assert not epoch.is_alive(), "the epoch did not finish during the attack"
        results = json.loads(run.stdout)
        attempts = 3 + len(rpc_group.WORKER_RPC_FUNCTIONS)
        assert results == {str(p): ["closed"] * attempts for p in range(2)}   # every attempt dropped, unanswered
        assert not marker.exists()
        _seeds_once(out["batches"], client.split_sizes["train"])
        after = [_refused(s) for s in token_cluster]
        assert [a - b for a, b in zip(after, before)] == [attempts, attempts]
        # and the trainer's own loaders still work
        _seeds_once(list(loader), client.split_sizes["train"])
    for s in token_cluster:
        assert health_status(s.address) == SERVING
        lines = [line for line in s.logs().splitlines() if "data path: refused a connection" in line]
        assert len(lines) == 1, lines   # rate-limited: one line per interval, however many attempts
        assert "pwned" not in s.logs()


def test_local_loader_equals_remote_loader_over_the_secure_path(token_cluster, parts_dir):
    with gf.connect([s.address for s in token_cluster], token=TOKEN, timeout=60) as client:
        assert client.group.data_path == "secure" and client.group.channel.kind in ("secure", "shm")
        loader = client.neighbor_loader("train", FANOUTS, **KW)
        remote = list(loader)
        local = list(LocalNeighborLoader(parts_dir, FANOUTS, **KW))
        assert len(remote) == len(local) > 1
        for a, b in zip(remote, local, strict=True):
            assert set(a.keys()) == set(b.keys())
            for key in b.keys():
                va, vb = a[key], b[key]
                assert torch.equal(va, vb) if torch.is_tensor(vb) else va == vb, key
        # every call the trainer makes carries its credentials: a wrong session secret is refused by name
        with pytest.raises(PermissionError, match="wrong session secret"):
            client.group.calls.call_sync(0, "pull", (loader.sessions[0], 0, 0, b"\0" * 32), 20)
        # drop_last packs the parts' remainders: a worker reads the other part's input (input_seeds) on this path
        counts = [p.split("train").numel() for p in open_parts(parts_dir)[1]]
        size = next(b for b in (24, 32, 40, 48, 56, 64) if any(
            e.packed for e in plan_epoch(counts, b, 2, seed=5, epoch=0, shuffle=True, drop_last=True)))
        for rank in range(2):
            packed = dict(KW, batch_size=size, drop_last=True, world_size=2, rank=rank)
            got = list(client.neighbor_loader("train", FANOUTS, **packed))
            want = list(LocalNeighborLoader(parts_dir, FANOUTS, **packed))
            assert len(got) == len(want) == -(-sum(counts) // 2) // size
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)


def test_join_group_never_makes_a_worker_dial_a_third_party(token_cluster):
    """An authenticated client names a foreign address as a peer: refused before the worker hears of it, and
    the group's own peers stay as they were."""
    with gf.connect([s.address for s in token_cluster], token=TOKEN, timeout=60, channel="rpc") as client:
        group = client.group
        foreign = ["203.0.113.9:22"] * len(token_cluster)
        for server, conn in zip(token_cluster, client.servers, strict=True):
            assert conn.address == server.address
            with grpc.insecure_channel(server.address) as channel:
                with pytest.raises(grpc.RpcError) as err:   # the group's own trainer (token and capability)
                    pb_grpc.ControlStub(channel).JoinGroup(
                        pb.JoinGroupRequest(group_id=group.group_id, endpoints=foreign),
                        metadata=[("authorization", f"Bearer {TOKEN}"), *conn.metadata], timeout=30)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "endpoint '203.0.113.9:22' of part" in err.value.details()
            assert "set peer_networks" in err.value.details()
        batches = list(client.neighbor_loader("train", FANOUTS, **KW))   # the peers still reach each other
        _seeds_once(batches, client.split_sizes["train"])


def test_a_server_with_security_refuses_torch_rpc(token_cluster):
    with pytest.raises(gf.ServerError, match="secure data path only"):
        gf.connect([s.address for s in token_cluster], token=TOKEN, timeout=60, transport="torch-rpc")


def test_torch_rpc_listeners_bind_only_the_data_address(parts_dir, tmp_path):
    """torch RPC asked for by name on both ends (the daemons' one log line says it is for trusted networks): its
    TensorPipe listeners and the trainer's rendezvous store listen on the data address only, never on every
    interface."""
    with running_cluster(parts_dir, log_dir=tmp_path, env={"GRAPHFEED_DATA_PATH": "torch-rpc"}) as servers:
        with gf.connect([s.address for s in servers], timeout=60, transport="torch-rpc") as client:
            assert client.group.data_path == "torch-rpc"
            mine = _listening(psutil.Process().pid)
            assert mine and {ip for ip, _ in mine} == {"127.0.0.1"}, mine   # the TCPStore and TensorPipe
            for s in client.servers:
                theirs = _listening(s.extra["worker_pid"])
                assert theirs and {ip for ip, _ in theirs} == {"127.0.0.1"}, theirs
            assert len(list(client.neighbor_loader("train", FANOUTS, **KW))) > 1
        for s in servers:
            assert "trusted networks only" in s.logs()


# ---- TLS: nothing in clear ----------------------------------------------------------------------------

class _Proxy:
    """A loopback TCP proxy to ``upstream`` that records every byte both ways."""

    def __init__(self, upstream: str, sink: bytearray, lock: threading.Lock):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.sink, self.lock = sink, lock
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.threads: list[threading.Thread] = []
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.sock.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                a.close()
                continue
            b.settimeout(None)
            pumps = [threading.Thread(target=self._pump, args=pair, daemon=True) for pair in ((a, b), (b, a))]
            self.threads += pumps
            for t in pumps:
                t.start()
            threading.Thread(target=self._close_after, args=(pumps, a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                with self.lock:
                    self.sink += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def _close_after(pumps, *socks) -> None:
        for t in pumps:
            t.join()
        for s in socks:
            s.close()

    def close(self) -> None:
        self.sock.close()
        for t in self.threads:
            t.join(10)


def _captured_epoch(servers, monkeypatch, addresses=None, during=None,
                   **connect) -> tuple[bytes, list, list[str], list[bytes]]:
    """An epoch with every data-path connection (trainer -> worker, worker -> worker) through a recording proxy;
    ``addresses``: the control ports to connect to (default the servers'); ``during(client)``: run before it closes."""
    sink, lock, proxies = bytearray(), threading.Lock(), []
    real = client_group.DataGroup._join_peers

    def proxied(self):
        for part, address in list(self.endpoints.items()):
            proxies.append(_Proxy(address, sink, lock))
            self.endpoints[part] = proxies[-1].address
        real(self)

    monkeypatch.setattr(client_group.DataGroup, "_join_peers", proxied)
    try:
        with gf.connect(addresses or [s.address for s in servers], token=TOKEN, timeout=60, channel="rpc",
                        **connect) as client:
            loader = client.neighbor_loader("train", FANOUTS, **KW)
            batches = list(loader)
            _seeds_once(batches, client.split_sizes["train"])
            sessions, secrets = list(loader.sessions), list(loader.session_set.secrets)
            if during is not None:
                during(client)
    finally:
        for p in proxies:
            p.close()
    with lock:
        return bytes(sink), batches, sessions, secrets


def _rows(batches) -> list[bytes]:
    """Feature rows (64 bytes each) of nodes other parts own: they crossed worker -> worker and worker -> trainer."""
    return [b.x[i].numpy().tobytes() for b in batches[:4]
            for i in range(b.batch_size, min(b.x.size(0), b.batch_size + 8))]


def test_with_tls_an_epoch_shows_nothing_in_clear(tls_cluster, pki, monkeypatch):
    data, batches, sessions, secrets = _captured_epoch(tls_cluster, monkeypatch, tls_ca=pki.ca)
    rows = _rows(batches)
    assert len(data) > sum(len(r) for r in rows) and rows
    assert not [r for r in rows if r in data]
    for sid in sessions:
        assert sid.encode() not in data
    for secret in secrets:
        assert secret not in data
    assert TOKEN.encode() not in data
    for s in tls_cluster:
        assert health_status(s.address, tls=_tls(pki)) == SERVING


def test_token_only_a_capture_of_both_planes_holds_no_key_secret_or_row(token_cluster, monkeypatch):
    """A token and no TLS, every control call and every data-path connection through a recording proxy: the group
    key crosses in clear (in OpenGroup: the capture is real), but no key made from it, no session secret, session id
    or feature row does; and while the group is open, the group key alone passes no worker's handshake."""
    control, lock = bytearray(), threading.Lock()
    fronts = [_Proxy(s.address, control, lock) for s in token_cluster]
    seen: dict = {}

    def replay(client) -> None:
        group_key = seen["group_key"] = client.group.group_key
        for part, address in client.group.endpoints.items():
            for guess in (group_key, group_root(group_key, None)):
                outsider = SecureCalls(guess, {part: address})
                with pytest.raises(ConnectionError, match="failed the group proof"):
                    outsider.call_sync(part, "part_identity", (), 10)
                outsider.close()

    try:
        data, batches, sessions, secrets = _captured_epoch(token_cluster, monkeypatch, [f.address for f in fronts],
                                                           during=replay)
    finally:
        for f in fronts:
            f.close()
    root = group_root(seen["group_key"], TOKEN)
    assert seen["group_key"] in control and sessions[0].encode() in control   # what plain gRPC carries
    made = [root, *(pair_key(root, TRAINER, p) for p in range(2)), pair_key(root, 0, 1), *secrets]
    assert len(secrets) == 2 and all(len(k) == 32 for k in made)
    for capture in (control, data):
        assert not [k for k in made if k in capture]
    assert not [r for r in _rows(batches) if r in data] and not [s for s in sessions if s.encode() in data]
    for s in token_cluster:
        assert health_status(s.address) == SERVING


def test_with_mtls_an_epoch_crosses_peers_that_check_each_other(mtls_cluster, pki):
    """Two parts: every batch needs the other part's rows and frontier (worker -> worker over TLS 1.3, the peer's
    certificate checked against tls_peer_ca), and the trainer's data connections show its client certificate."""
    with gf.connect([s.address for s in mtls_cluster], token=TOKEN, timeout=60, channel="rpc", tls_ca=pki.ca,
                    tls_cert=pki.client_cert, tls_key=pki.client_key) as client:
        batches = list(client.neighbor_loader("train", FANOUTS, **KW))
        _seeds_once(batches, client.split_sizes["train"])
        assert {client.group.calls._client(p)._connection().tls_suite[1] for p in range(2)} == {"TLSv1.3"}
    for s in mtls_cluster:
        assert "refused a connection" not in s.logs()


def _tls(pki):
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=Path(pki.ca).read_bytes())
