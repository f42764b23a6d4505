"""Same-host peers: a session worker reads the parts of peer servers that share its files directly.

The rest of the suite runs with ``colocated_reads: false`` (conftest), the path servers on different
hosts take; here the daemons run with it on, as they do by default.
"""
from __future__ import annotations

import shutil

import pytest
import torch
from helpers.graphs import assert_same_batch, check_typed_batch

import graphfeed.client as gf
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.format.layout import part_files_identity
from graphfeed.testing.cluster import running_cluster, start_server, stop_processes

ON = {"GRAPHFEED_COLOCATED_READS": "true"}
FANOUTS = [5, 3]


def _reads_locally(server) -> bool:
    return "from their files on this host" in server.log_path.read_text(errors="replace")


def test_identity_is_the_files_not_their_content(tiny_parts_dir, tmp_path):
    same = part_files_identity(tiny_parts_dir, 1)
    assert same is not None and same == part_files_identity(tiny_parts_dir, 1)
    assert part_files_identity(tiny_parts_dir, 0) != same
    copy = tmp_path / "copy"
    shutil.copytree(tiny_parts_dir, copy)
    assert part_files_identity(copy, 1) != same          # equal bytes, other files: another host's copy
    assert part_files_identity(copy, 7) is None          # no such part folder


def test_colocated_workers_give_the_local_loaders_batches(tiny_parts_dir, tiny_graph, tmp_path):
    args = dict(batch_size=256, shuffle=True, seed=3)
    src, dst = (torch.from_numpy(a[:600].astype("int64")) for a in tiny_graph.edge_index)
    link = dict(edge_label_index=torch.stack([src, dst]), neg_sampling="binary", batch_size=128, seed=5)
    with running_cluster(tiny_parts_dir, log_dir=tmp_path / "logs", env=ON) as servers, \
            gf.connect([s.address for s in servers], timeout=60) as client:
        got = list(client.neighbor_loader("train", FANOUTS, prefetch=2, **args))
        got_link = list(client.link_neighbor_loader(FANOUTS, prefetch=2, **link))
        assert all(_reads_locally(s) for s in servers), "each worker reads the other part from its files"
    want = list(LocalNeighborLoader(tiny_parts_dir, FANOUTS, **args))
    assert len(got) == len(want) > 1
    for a, b in zip(got, want):
        assert_same_batch(a, b)
    want_link = list(LocalLinkNeighborLoader(tiny_parts_dir, FANOUTS, **link))
    assert len(got_link) == len(want_link) > 1
    for a, b in zip(got_link, want_link):
        assert_same_batch(a, b)


def test_colocated_typed_batches_equal_local(shared_mag, tmp_path):
    parts, graph = shared_mag
    args = dict(batch_size=96, input_nodes=("paper", "train"), shuffle=True, seed=7)
    with running_cluster(parts, log_dir=tmp_path / "logs", env=ON) as servers, \
            gf.connect([s.address for s in servers], timeout=60) as client:
        got = list(client.neighbor_loader(num_neighbors=[4, 3], prefetch=2, **args))
        assert all(_reads_locally(s) for s in servers)
    want = list(LocalNeighborLoader(parts, [4, 3], **args))
    assert len(got) == len(want) > 1
    for a, b in zip(got, want):
        assert_same_batch(a, b)
        check_typed_batch(a, graph, {e: [4, 3] for e in graph.edge_types})


def test_servers_of_different_copies_keep_to_rpc(tiny_parts_dir, tmp_path):
    """Two servers that each have their own copy of the partition (as on two hosts) do not read each other's
    files: the peer path stays torch RPC, and the batches are the same."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_parts_dir, copy)
    servers = [start_server(tiny_parts_dir, 0, log_dir=tmp_path / "a", env=ON)]   # SERVING when it returns
    try:
        servers.append(start_server(copy, 1, log_dir=tmp_path / "b", env=ON))
        args = dict(batch_size=512, seed=1)
        with gf.connect([s.address for s in servers], timeout=60) as client:
            got = list(client.neighbor_loader("train", FANOUTS, **args))
        assert not any(_reads_locally(s) for s in servers)
    finally:
        assert stop_processes([s.proc for s in servers]) == [0] * len(servers)
    want = list(LocalNeighborLoader(tiny_parts_dir, FANOUTS, **args))
    assert len(got) == len(want) > 1
    for a, b in zip(got, want):
        assert_same_batch(a, b)


@pytest.mark.parametrize("value, expected", [("false", False), ("on", True), (True, True)])
def test_colocated_reads_setting(value, expected):
    from graphfeed.server.daemon.config import PARSERS
    assert PARSERS["colocated_reads"](value) is expected
    with pytest.raises(ValueError, match="true or false"):
        PARSERS["colocated_reads"]("maybe")
