"""Online sampling (``Client.sample``) through real daemons on loopback: 2 parts, 3000 nodes."""
from __future__ import annotations

import threading

import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
import graphfeed.client.online as online
from graphfeed.server.loader.local import LocalNeighborLoader, sample_nodes
from graphfeed.server.partition.format.store import open_parts
from graphfeed.testing.cluster import SERVING, health_status

FANOUTS = [4, 3]
NUM_NODES = 3000


@pytest.fixture(scope="module")
def graph(shared_graph):
    return shared_graph


@pytest.fixture(scope="module")
def parts_dir(shared_parts):
    return shared_parts


@pytest.fixture(scope="module")
def client(shared_cluster):
    with gf.connect([s.address for s in shared_cluster], timeout=60) as c:
        yield c
    assert all(health_status(s.address, "graphfeed.control.v1.Control") == SERVING for s in shared_cluster)


def _owned_by(parts_dir, part: int) -> torch.Tensor:
    return open_parts(parts_dir)[1][part].orig_id


def test_sample_equals_the_local_reference_across_parts(client, parts_dir, graph):
    ei, x, y, _ = graph
    ids = torch.cat([_owned_by(parts_dir, 1)[:20], _owned_by(parts_dir, 0)[:20]])[torch.randperm(40)]
    for seed in (0, 7):
        got = client.sample(ids, FANOUTS, seed=seed)
        assert_same_batch(got, sample_nodes(parts_dir, ids, FANOUTS, seed=seed))
    assert torch.equal(got.n_id[:got.batch_size], ids) and torch.equal(got.input_id, torch.arange(40))
    assert torch.equal(got.x, torch.as_tensor(x)[got.n_id]) and torch.equal(got.y, torch.as_tensor(y)[got.n_id])
    edges = set((torch.as_tensor(ei[0]) * NUM_NODES + torch.as_tensor(ei[1])).tolist())
    src, dst = got.n_id[got.edge_index[0]], got.n_id[got.edge_index[1]]
    assert set((src * NUM_NODES + dst).tolist()) <= edges                 # every sampled edge exists
    assert int(torch.bincount(got.edge_index[1][:got.num_sampled_edges[0]], minlength=40)[:40].max()) <= FANOUTS[0]
    assert not torch.equal(client.sample(ids, FANOUTS, seed=1).edge_index, got.edge_index)   # the seed matters


def test_sample_of_one_part_equals_a_loaders_first_batch(client, parts_dir):
    ids = _owned_by(parts_dir, 1)[5:37]
    first = next(iter(LocalNeighborLoader(parts_dir, FANOUTS, input_nodes=ids, batch_size=64, seed=3)))
    got = client.sample(ids, FANOUTS, seed=3)
    for key in ("n_id", "x", "y", "edge_index", "e_id", "input_id", "batch_size", "num_sampled_nodes"):
        assert torch.equal(got[key], first[key]) if torch.is_tensor(first[key]) else got[key] == first[key], key


def test_sample_options_and_threads(client, parts_dir):
    ids = torch.tensor([0, 2999, 1500, 17])
    out = client.sample(ids, [-1], direction="out", feature_dtype="bf16", seed=5)
    assert_same_batch(out, sample_nodes(parts_dir, ids, [-1], direction="out", feature_dtype="bf16", seed=5))
    assert out.x.dtype == torch.bfloat16
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = client.sample(torch.arange(i * 50, i * 50 + 30), FANOUTS, seed=i)
        except BaseException as exc:  # noqa: BLE001 -- reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    for i, got in results.items():
        assert_same_batch(got, sample_nodes(parts_dir, torch.arange(i * 50, i * 50 + 30), FANOUTS, seed=i))


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([1, NUM_NODES]), rf"node_ids\[1\] = {NUM_NODES} is outside the graph: original node ids are "
                                   rf"0\.\.{NUM_NODES - 1}"),
    (torch.tensor([-4]), rf"node_ids\[0\] = -4 is outside the graph: .* 0\.\.{NUM_NODES - 1}"),
    (torch.tensor([1.0, 2.0]), "integer node ids, got dtype torch.float32"),
    (torch.tensor([], dtype=torch.int64), rf"node_ids is empty: .* 0\.\.{NUM_NODES - 1}"),
    (torch.tensor([[1, 2]]), r"1-D tensor .* shape \[1, 2\]"),
    (torch.tensor([3, 9, 3]), "repeats id 3"),
])
def test_bad_ids_are_refused_by_client_and_server_while_a_loader_runs(client, monkeypatch, bad, message):
    loader = client.neighbor_loader("train", FANOUTS, batch_size=64, shuffle=True)
    it = iter(loader)
    first = next(it)
    with pytest.raises(ValueError, match=message):                 # the client's check
        client.sample(bad, FANOUTS)
    # the worker's own check: the same message, as the INVALID_ARGUMENT class, naming the server
    monkeypatch.setattr(online, "check_sample_ids", lambda ids, *_: torch.as_tensor(ids))
    with pytest.raises(gf.InvalidRequest, match=r"127\.0\.0\.1:\d+ part \d: sample: .*" + message):
        client.sample(bad, FANOUTS)
    monkeypatch.undo()
    rest = list(it)                                                # the running loader is unaffected
    assert first.batch_size + sum(b.batch_size for b in rest) == int(loader.counts[0] + loader.counts[1])
    assert client.sample(torch.tensor([5]), FANOUTS).batch_size == 1   # the sessions still serve


def test_option_sets_beyond_the_cache_close_their_sessions(client):
    def online_sessions() -> int:
        return sum(row["kind"] == "online" for s in client.servers for row in _session_rows(s))

    for fanout in range(1, online.MAX_OPTION_SETS + 3):
        assert client.sample(torch.tensor([1, 2]), [fanout]).batch_size == 2
    assert online_sessions() == online.MAX_OPTION_SETS * len(client.servers)


def _session_rows(server) -> list[dict]:
    from graphfeed.proto import control_pb2 as pb

    stats = server.call("GetStats", pb.StatsRequest(), timeout=10)
    return [{"kind": s.kind, "group": s.group_id} for s in stats.sessions]


def test_bad_options_name_the_argument(client):
    with pytest.raises(ValueError, match="num_neighbors is required"):
        client.sample(torch.tensor([1]))
    with pytest.raises(ValueError, match="fanout"):
        client.sample(torch.tensor([1]), [3, -2])
    with pytest.raises(ValueError, match="seed must be"):
        client.sample(torch.tensor([1]), FANOUTS, seed=-1)

