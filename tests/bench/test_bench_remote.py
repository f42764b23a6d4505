"""``graphfeed bench remote``: the bench figures through real ``graphfeed serve`` daemons.

The remote batches are the in-process ones (same seed, same epochs), so the per-epoch
counts -- seeds, batches, sampled edges -- must equal ``bench sample --features``'s exactly;
the rates differ only by the service's cost.
"""
from __future__ import annotations

import json
import shutil

import psutil
import pytest

from graphfeed.bench.remote import RemoteBenchConfig, bench_remote, transport_fields
from graphfeed.cli.main import main as cli_main
from graphfeed.server.partition.format.store import open_parts
from graphfeed.testing.cluster import running_cluster

RATES = ("seeds_per_s", "batches_per_s", "sampled_edges_per_s", "epoch_s")


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if text in cmd and p.pid != psutil.Process().pid:
            found.append(f"{p.pid}: {cmd}")
    return found


def _assert_consistent_rates(r: dict) -> None:
    for k in RATES:
        assert r["min"][k] <= r[k] <= r["max"][k], k
    assert r["seeds_per_s"] / r["batches_per_s"] == pytest.approx(r["seeds_per_epoch"] / r["batches_per_epoch"],
                                                                  rel=1e-2)


@pytest.mark.slow
def test_started_servers_same_counts_as_inprocess_and_clean_shutdown(tiny_parts_dir, tiny_graph, capsys):
    before = _children()   # e.g. a shared cluster this test process started earlier
    rc = cli_main(["bench", "remote", "--graph", str(tiny_parts_dir), "--servers", "2", "--num-neighbors", "5,3",
                   "--batch-size", "100", "--prefetch", "2", "--epochs", "2", "--compare"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1, out
    r = json.loads(out[0])
    ref = r["inprocess"]
    n_train = len(tiny_graph.splits["train"])
    _, parts = open_parts(tiny_parts_dir)
    assert r["seeds_per_epoch"] == ref["seeds_per_epoch"] == n_train
    assert r["batches_per_epoch"] == ref["batches_per_epoch"] == sum(-(-p.split("train").numel() // 100)
                                                                     for p in parts)
    assert r["sampled_edges_per_epoch"] == ref["sampled_edges_per_epoch"], "same batches as in-process"
    assert (r["servers"], r["num_parts"], r["prefetch"], r["epochs"]) == (2, 2, 2, 2)
    assert r["features"] is True and r["inprocess_features"] is True and ref["num_parts"] == 2
    assert r["num_neighbors"] == [5, 3] and r["batch_size"] == 100 and r["server_addresses"] is None
    assert r["ratio_vs_inprocess"] == pytest.approx(r["seeds_per_s"] / ref["seeds_per_s"], abs=1e-3)
    assert r["cpu_ratio_vs_inprocess"] == pytest.approx(r["cpu_s_per_epoch"] / ref["cpu_s_per_epoch"], abs=1e-3)
    _assert_consistent_rates(r)
    # memory and CPU: the trainer's share is part of the total; every server reported a process tree
    assert r["cpu_s_per_epoch"] > r["cpu_s_per_epoch_trainer"] > 0
    assert len(r["servers_peak_rss_mb_each"]) == 2 and min(r["servers_peak_rss_mb_each"]) > 100
    assert r["servers_peak_rss_mb"] == pytest.approx(sum(r["servers_peak_rss_mb_each"]), abs=0.2)
    assert r["peak_rss_mb"] > 100 and ref["peak_rss_mb"] > 100
    assert not _processes_mentioning(str(tiny_parts_dir)), "the daemons must be gone"
    assert not _children() - before, "no child process may survive the bench"


def test_running_servers_by_address(tiny_parts_dir, tiny_graph, tmp_path):
    with running_cluster(tiny_parts_dir, log_dir=tmp_path) as servers:
        addresses = tuple(s.address for s in servers)
        r = bench_remote(RemoteBenchConfig(addresses, num_neighbors=(4,), batch_size=64, prefetch=1, epochs=1,
                                           input="val"))
    assert r["seeds_per_epoch"] == len(tiny_graph.splits["val"])
    assert r["servers"] == 2 and r["server_addresses"] == list(addresses) and r["graph"] is None
    assert r["servers_peak_rss_mb"] is None and r["cpu_s_per_epoch"] is None  # not visible from the client
    assert r["cpu_s_per_epoch_trainer"] > 0 and "ratio_vs_inprocess" not in r
    assert (r["channel"], r["shm_batches"], r["rpc_batches"]) == ("shm", r["batches_per_epoch"], 0), \
        "loopback servers: every measured batch through shared memory"
    _assert_consistent_rates(r)


class _Channel:
    def __init__(self, kind: str, counts: dict | None = None):
        self.kind = kind
        if counts is not None:
            self.counts = counts


def test_the_channel_claimed_is_how_the_measured_batches_travelled():
    counts = {"shm": 10, "rpc": 0, "too_big": 4, "slot_wait": 0, "grown": 1}
    before = {"shm": 2, "rpc": 0, "too_big": 4, "slot_wait": 0, "grown": 1}   # the warm-up's too-big batches
    assert transport_fields(_Channel("shm", counts), before) == {
        "channel": "shm", "shm_batches": 8, "rpc_batches": 0, "shm_grown": 1}
    assert transport_fields(_Channel("shm", counts), {})["channel"] == "shm+torch-rpc"
    assert transport_fields(_Channel("shm", dict(counts, shm=2)), before)["channel"] == "torch-rpc"
    assert transport_fields(_Channel("torch-rpc"), {}) == {
        "channel": "torch-rpc", "shm_batches": None, "rpc_batches": None, "shm_grown": None}


def test_feature_cache_lowers_the_feature_bytes_of_the_same_epoch(tiny_parts_dir, tmp_path):
    with running_cluster(tiny_parts_dir, log_dir=tmp_path) as servers:
        addresses = tuple(s.address for s in servers)
        runs = [bench_remote(RemoteBenchConfig(addresses, num_neighbors=(4, 2), batch_size=64, prefetch=2, epochs=1,
                                               feature_cache_mb=mb)) for mb in (0.0, 0.05)]
    plain, cached = runs
    assert cached["feature_cache_mb"] == 0.05 and plain["feature_cache_mb"] == 0.0
    assert (cached["seeds_per_epoch"], cached["sampled_edges_per_epoch"]) == \
        (plain["seeds_per_epoch"], plain["sampled_edges_per_epoch"])
    assert 0 <= cached["feature_bytes_per_epoch"] < plain["feature_bytes_per_epoch"]


@pytest.mark.parametrize("argv, message", [
    (["--servers", "3"], "needs a partition folder with 3 part(s)"),
    (["--servers", "two"], "give a number of servers to start"),
    (["--servers", "0"], "at least 1"),
    (["--servers", "2", "--prefetch", "0"], "--prefetch must be at least 1"),
    (["--servers", "2", "--num-neighbors", "5,-2"], "--num-neighbors"),
    (["--servers", "2", "--input", "everything"], "--input must be one of"),
    (["--servers", "2", "--feature-cache-mb", "-1"], "--feature-cache-mb must be a number of MiB >= 0"),
    (["--servers", "2", "--hosts", "3"], "give --servers N (or host:port,...) or --hosts N, one of them"),
    (["--servers", "2", "--link-rate", "1gbit"], "--link-rate shapes the links of emulated hosts: give --hosts N"),
    (["--hosts", "4"], "--hosts 4: the trainer takes one host and each of the 2 part(s)"),
    (["--hosts", "3", "--link-rate", "fast"], "link_rate must be a tc rate such as '1gbit'"),
    (["--hosts", "3", "--compare"], "--compare runs with --servers only"),
    (["--servers", "2", "--tls"], "--tls makes a certificate for emulated hosts: give --hosts N"),
    (["--servers", "2", "--peer-cache-mb", "-1"], "--peer-cache-mb must be a number of MiB >= 0"),
])
def test_bad_arguments_exit_2_with_one_line(tiny_parts_dir, capsys, argv, message):
    before = _children()   # e.g. a shared cluster this test process started earlier
    rc = cli_main(["bench", "remote", "--graph", str(tiny_parts_dir), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert not _children() - before, "nothing may be started for bad arguments"


@pytest.mark.parametrize("argv, message", [
    (["--servers", "2"], "give --graph DIR"),
    (["--servers", "127.0.0.1:1", "--compare"], "--compare runs the in-process bench"),
    (["--servers", "1", "--graph", "/nonexistent/parts"], "no such partition folder"),
])
def test_missing_graph_exit_2(capsys, argv, message):
    assert cli_main(["bench", "remote", *argv]) == 2
    assert message in capsys.readouterr().err


def test_server_that_cannot_start_is_one_line_exit_1(tiny_parts_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_parts_dir, broken)
    next(broken.glob("part_1/nodes/*/x.npy")).unlink()
    rc = cli_main(["bench", "remote", "--graph", str(broken), "--servers", "2", "--epochs", "1"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.startswith("graphfeed bench remote: error: server part 1 exited with code 4 before it was ready")
    assert "Traceback" not in err
    assert not _processes_mentioning(str(broken)), "the started server 0 must be stopped too"


def test_link_mode_through_two_servers_equals_inprocess_counts(tmp_path, capsys):
    from graphfeed.server.partition.build.builder import GraphInput, partition_graph
    from graphfeed.server.partition.format.layout import read_meta
    from graphfeed.server.partition.inputs import synth

    ei, x, y, splits = synth.generate_preset("tiny")
    root = tmp_path / "tiny_link"
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, root, method="random", link_split={"val": 0.05})
    rc = cli_main(["bench", "remote", "--graph", str(root), "--servers", "2", "--link", "--input", "val",
                   "--neg-ratio", "2", "--num-neighbors", "4,2", "--batch-size", "200", "--prefetch", "2",
                   "--epochs", "1", "--compare"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1, out
    r = json.loads(out[0])
    ref = r["inprocess"]
    assert r["seeds_per_epoch"] == ref["seeds_per_epoch"] == read_meta(root).link_split_sizes()["val"]
    assert r["batches_per_epoch"] == ref["batches_per_epoch"] and r["servers"] == 2
    assert r["sampled_edges_per_epoch"] == ref["sampled_edges_per_epoch"], "the same link batches as in-process"
    assert (r["link"], r["neg_ratio"], r["input"]) == (True, 2.0, "val")
    assert r["ratio_vs_inprocess"] == pytest.approx(r["seeds_per_s"] / ref["seeds_per_s"], abs=1e-3)
    _assert_consistent_rates(r)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}
