"""Fewer bytes between servers: peer rows in the loader's feature dtype, and other parts' hot rows replicated.

The peers here are in-process: a worker graph's :class:`RemoteSource` calls the peer's allow-listed functions
(:mod:`graphfeed.server.worker.rpc_api`) through a recording :class:`DataCalls`, so what a peer is asked and
what it answers can be checked directly; the batches must equal the in-process graph's.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphfeed.core.spec import SamplingSpec
from graphfeed.server.daemon.config import load_config
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.server.sampling.producer import produce_online
from graphfeed.server.sampling.source import LocalSource
from graphfeed.server.worker import peer_cache, rpc_api
from graphfeed.server.worker.peers import PeerError, RemoteSource, replicate_hot_rows
from graphfeed.server.worker.telemetry import WorkerTelemetry
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.pending import Pending

SPEC = SamplingSpec(num_neighbors=(10, 5))


class InProcessPeers(DataCalls):
    """Peer calls answered by ``rpc_api`` in this process, as the peer part's worker; records every call."""

    kind = "in-process"

    def __init__(self, parts):
        super().__init__()
        self.workers = {p.part_id: SimpleNamespace(part=p, graph=SimpleNamespace(sources={p.part_id: LocalSource(p)}))
                        for p in parts}
        self.calls: list[tuple[int, str, tuple]] = []
        self.answers: list[object] = []
        self.refuse = False

    def call(self, part: int, name: str, args: tuple, timeout: float) -> Pending:
        self.calls.append((part, name, args))
        if self.refuse:
            return Pending.failed(ConnectionError(f"part{part} is unreachable"))
        rpc_api.bind(self.workers[part])
        try:
            value = getattr(rpc_api, name)(*args)
        except Exception as exc:  # noqa: BLE001 -- the caller gets it, as over a transport
            return Pending.failed(exc)
        finally:
            rpc_api.bind(None)
        self.answers.append(value)
        return Pending.completed(value)

    def gathered(self) -> int:
        """Rows the peers were asked for by ``gather``."""
        return sum(int(args[1].numel()) for _, name, args in self.calls if name == "gather")


@pytest.fixture(scope="module")
def parts(tiny_parts_dir):
    return open_parts(tiny_parts_dir)[1]


def worker_graph_of(parts, peers: InProcessPeers) -> PartitionedGraph:
    """Part 0's worker graph: part 0 here, part 1 through ``peers``."""
    return PartitionedGraph([LocalSource(parts[0]), RemoteSource(1, 5.0, WorkerTelemetry(), peers)])


def seeds_of(parts, n: int = 300) -> torch.Tensor:
    start = parts[0].nodes("_N").start
    return torch.arange(start, start + n, dtype=torch.int64)


def batch(graph, seeds, dtype):
    return produce_online(graph, seeds, SPEC, seed=7, input_type="_N", feature_dtype=dtype)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_peer_rows_travel_in_the_feature_dtype_and_the_batch_is_unchanged(parts, dtype):
    peers = InProcessPeers(parts)
    remote = batch(worker_graph_of(parts, peers), seeds_of(parts), dtype)
    assert_same(remote, batch(PartitionedGraph.in_process(parts), seeds_of(parts), dtype))
    rows = [a for (_, name, _), a in zip(peers.calls, peers.answers) if name == "gather"]
    assert rows, "the batch needed rows of part 1, so part 1 was asked"
    assert all(r.x.dtype == dtype and r.y.dtype == torch.int64 for r in rows)


def test_peer_rows_stay_as_stored_without_a_feature_dtype(parts):
    peers = InProcessPeers(parts)
    assert_same(batch(worker_graph_of(parts, peers), seeds_of(parts), None),
                batch(PartitionedGraph.in_process(parts), seeds_of(parts), None))
    assert all(a.x.dtype == torch.float32 for (_, n, _), a in zip(peers.calls, peers.answers) if n == "gather")


def test_a_peer_refuses_a_dtype_that_is_no_feature_transport_dtype(parts):
    peers = InProcessPeers(parts)
    gids = torch.tensor([parts[1].nodes("_N").start])
    with pytest.raises(ValueError, match="feature_dtype must be one of"):
        peers.call_sync(1, "gather", ("_N", gids, "int64"), 5.0)


def test_halo_degree_counts_this_parts_edges_into_each_node(parts):
    part = parts[0]
    topo = part.edges(part.etype).topology("csc")
    degree = peer_cache.halo_degree(part, "_N")
    node = int(topo.indices[0])
    assert int(degree[node]) == int((topo.indices.to(torch.int64) == node).sum())
    assert int(degree.sum()) == topo.indices.numel()


def test_pick_takes_the_highest_halo_degree_rows_of_other_parts_within_the_budget(parts):
    part = parts[0]
    size = peer_cache.row_bytes(part, "_N")
    assert size == 32 * 4 + 8 + 8    # x fp32 [32], y int64, original id int64
    chosen = peer_cache.pick(part, 100 * size + size // 2, [1])["_N"]
    assert chosen.numel() == 100 and bool((chosen[1:] > chosen[:-1]).all())
    lo, hi = part.nodes("_N").book.range(1)
    assert bool(((chosen >= lo) & (chosen < hi)).all())
    degree = peer_cache.halo_degree(part, "_N")[lo:hi]
    assert int(degree[chosen - lo].min()) >= int(torch.sort(degree, descending=True).values[99])
    assert peer_cache.pick(part, 0, [1]) == {} and peer_cache.pick(part, 10 << 20, []) == {}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_replicated_rows_leave_the_batch_unchanged_and_peers_are_asked_for_fewer(parts, dtype):
    plain, cached = InProcessPeers(parts), InProcessPeers(parts)
    graph = worker_graph_of(parts, cached)
    budget = 1000 * peer_cache.row_bytes(parts[0], "_N")
    copied = replicate_hot_rows(graph, parts[0], budget, 5.0)
    assert 0 < copied <= budget
    cached.calls.clear()
    for seed_range in (seeds_of(parts, 300), seeds_of(parts, 50) + 500):
        reference = batch(PartitionedGraph.in_process(parts), seed_range, dtype)
        assert_same(batch(graph, seed_range, dtype), reference)
        assert_same(batch(worker_graph_of(parts, plain), seed_range, dtype), reference)
    assert 0 < cached.gathered() < plain.gathered() * 0.8


def test_all_rows_replicated_asks_the_peer_for_no_rows(parts):
    peers = InProcessPeers(parts)
    graph = worker_graph_of(parts, peers)
    replicate_hot_rows(graph, parts[0], 1 << 30, 5.0)
    source = graph.sources[1]
    gids = source.cached["_N"].gids[:64]
    peers.calls.clear()
    rows = graph.gather_typed("_N", gids, torch.bfloat16)
    assert peers.calls == []
    assert_same(dict(rows.items()), dict(PartitionedGraph.in_process(parts).gather_typed("_N", gids).items()))


def test_an_unreachable_peer_is_named_and_leaves_no_cache(parts):
    peers = InProcessPeers(parts)
    peers.refuse = True
    graph = worker_graph_of(parts, peers)
    with pytest.raises(PeerError, match="could not replicate hot rows of part1: part1 is unreachable"):
        replicate_hot_rows(graph, parts[0], 1 << 20, 5.0)
    assert graph.sources[1].cached == {}


def test_peer_cache_bytes_is_a_daemon_setting(tiny_parts_dir):
    cfg = load_config(environ={"GRAPHFEED_PEER_CACHE_BYTES": "64MiB"},
                      flags={"partition": str(tiny_parts_dir), "part": 0})
    assert cfg.peer_cache_bytes == 64 << 20


def test_peer_calls_are_bounded_below_a_pull(tiny_parts_dir):
    from graphfeed.server.worker.commands import GroupSpec

    spec = GroupSpec(group_id="g", rendezvous="", world_size=3, rank=1, part_id=0, partition_root=str(tiny_parts_dir))
    assert spec.peer_bound == spec.rpc_timeout / 2 == 30.0
    assert GroupSpec(**{**spec.__dict__, "peer_timeout": 4.0}).peer_bound == 4.0
    cfg = load_config(environ={"GRAPHFEED_PEER_TIMEOUT": "5"}, flags={"partition": str(tiny_parts_dir), "part": 0})
    assert GroupSpec.settings_of(cfg)["peer_timeout"] == 5.0
