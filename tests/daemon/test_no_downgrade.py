"""The safe data path by default, and no way down from it (real daemons, a real client in this process).

* A daemon with no token and no TLS serves the secure data path: a client on the default transport forms it
  (the servers' ``ClusterInfo`` and the client's group say ``secure``), the trainer listens on nothing (no
  torch RPC agent, no TensorPipe, no rendezvous store) and an epoch delivers every seed once.
* Daemons that offer torch RPC (``data_path: torch-rpc``, the way whatever answers on a control port can) are
  refused by a client on the default transport -- with a token or without -- before it opens anything: the
  error names the server, what it offered and how to ask for torch RPC by name; no port opens here.
* Asked for by name on both ends, torch RPC still serves an epoch, and ``close()`` leaves no listening socket
  in this process (the rendezvous store's listener used to outlive it).
"""
from __future__ import annotations

import time

import psutil
import pytest
import torch

import graphfeed.client as gf
from graphfeed.client.errors import ServerError
from graphfeed.testing.cluster import running_cluster

TOKEN = "gf-downgrade-test-token-0123456789abcdef"
KW = dict(input_nodes="train", num_neighbors=[4, 2], batch_size=256, shuffle=True, seed=3)


_BEFORE: set[tuple[str, int]] = set()   # what this process listened on when the test began


def _all_listening() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


@pytest.fixture(autouse=True)
def _listening_before():
    """The suite runs many tests per process: a port an earlier test left open is not this test's trainer's
    (each test's own listeners are checked against what was open when it began)."""
    _BEFORE.clear()
    _BEFORE.update(_all_listening())
    yield


def _listening() -> list[tuple[str, int]]:
    """The TCP ports this process listens on that it did not when the test began."""
    return sorted(_all_listening() - _BEFORE)


def _none_listening(within: float = 10.0) -> list[tuple[str, int]]:
    """The ports still listening after ``within`` seconds of polling ([] as soon as there are none)."""
    deadline = time.monotonic() + within
    while (left := _listening()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _epoch_seeds(client) -> torch.Tensor:
    loader = client.neighbor_loader(**KW)
    return torch.cat([b.n_id[:b.batch_size] for b in loader])


@pytest.fixture(scope="module")
def default_cluster(tiny_parts_dir, tmp_path_factory):
    """Daemons as shipped: no token, no TLS, no data_path setting."""
    with running_cluster(tiny_parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


@pytest.fixture(scope="module")
def torch_rpc_cluster(tiny_parts_dir, tmp_path_factory):
    """Daemons that serve torch RPC because their data_path names it (each warns so)."""
    with running_cluster(tiny_parts_dir, env={"GRAPHFEED_DATA_PATH": "torch-rpc"},
                         log_dir=tmp_path_factory.mktemp("logs")) as servers:
        for server in servers:
            assert "trainers must ask for it by name" in server.logs()
        yield servers


def test_a_daemon_without_token_or_tls_serves_the_secure_path_and_the_trainer_listens_on_nothing(
        default_cluster, tiny_graph, monkeypatch):
    monkeypatch.delenv("GRAPHFEED_TRANSPORT", raising=False)   # the default, whatever the suite's variant
    with gf.connect([s.address for s in default_cluster], timeout=60) as client:
        assert [s.info.data_path for s in client.servers] == ["secure", "secure"]
        assert client.group.data_path == "secure" and client.group.calls.kind == "secure"
        assert client.group.rendezvous == ""
        seeds = _epoch_seeds(client)
        assert _listening() == [], "the trainer listens on a port over the default data path"
    assert seeds.numel() == len(tiny_graph.splits["train"]) == seeds.unique().numel()
    for server in default_cluster:
        assert "event=data_path" not in server.logs(), "a default daemon warned about an unauthenticated path"


@pytest.mark.parametrize("token, holder", [
    (TOKEN, "this client holds a token or TLS material and never follows a server to a weaker transport"),
    (None, "a client on transport='auto' forms only"),
])
def test_a_client_on_the_default_transport_refuses_servers_offering_torch_rpc(torch_rpc_cluster, monkeypatch,
                                                                              token, holder):
    monkeypatch.delenv("GRAPHFEED_TRANSPORT", raising=False)
    monkeypatch.delenv("GRAPHFEED_TOKEN", raising=False)
    addresses = [s.address for s in torch_rpc_cluster]
    with pytest.raises(ServerError) as caught:
        gf.connect(addresses, token=token, timeout=60)
    text = str(caught.value)
    assert caught.value.server in {f"{a} part {p}" for p, a in enumerate(addresses)}, text
    assert f"graphfeed server {caught.value.server}: the server offers data path 'torch-rpc'" in text
    assert holder in text
    assert "connect(..., transport='torch-rpc')" in text and "data_path: auto" in text
    assert _none_listening() == [], "a refused downgrade left a port open"
    with gf.connect(addresses, token=token, timeout=60, transport="torch-rpc") as client:   # by name: served
        assert client.group.data_path == "torch-rpc"


def test_torch_rpc_by_name_serves_an_epoch_and_close_leaves_no_listener(torch_rpc_cluster, monkeypatch):
    monkeypatch.delenv("GRAPHFEED_TRANSPORT", raising=False)
    assert _none_listening() == []
    client = gf.connect([s.address for s in torch_rpc_cluster], timeout=60, transport="torch-rpc")
    try:
        rendezvous = client.group.rendezvous
        port = int(rendezvous.rsplit(":", 1)[1])
        assert port in {p for _, p in _listening()}, f"the rendezvous {rendezvous} is not listening"
        seeds = _epoch_seeds(client)
        assert seeds.unique().numel() == seeds.numel() > 0
    finally:
        client.close()
    assert _none_listening() == [], "after close() this process still listens (the rendezvous store?)"
    with gf.connect([s.address for s in torch_rpc_cluster], timeout=60, transport="torch-rpc") as again:
        assert _epoch_seeds(again).numel() == seeds.numel()   # a second group forms after the first closed
    assert _none_listening() == []
