"""`graphfeed bench sample`: the measurement on a small synthetic graph, and the CLI's output."""
from __future__ import annotations

import json

import pytest

from graphfeed.bench.sample import SampleBenchConfig, bench_sample
from graphfeed.cli.main import main as cli_main
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.server.sampling import dispatch


@pytest.fixture(scope="module")
def tiny_p2(tmp_path_factory):
    ei, x, y, splits = synth.generate_preset("tiny")
    root = tmp_path_factory.mktemp("bench") / "tiny_p2"
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, root, method="random")
    return root, splits


@pytest.mark.parametrize("features", [False, True])
def test_bench_sample_fields_and_values(tiny_p2, features):
    root, splits = tiny_p2
    r = bench_sample(SampleBenchConfig(str(root), (5, 3), batch_size=100, features=features, epochs=2, threads=1))
    n_train = len(splits["train"])
    assert r["seeds_per_epoch"] == n_train
    _, parts = open_parts(root)
    assert r["batches_per_epoch"] == sum(-(-p.split("train").numel() // 100) for p in parts)  # batches stay in a part
    assert r["implementation"] == dispatch.IMPLEMENTATION
    assert r["threads"] == 1 and r["features"] is features and r["epochs"] == 2 and r["num_parts"] == 2
    assert r["num_neighbors"] == [5, 3] and r["batch_size"] == 100 and r["input"] == "train"
    # Rates are consistent with each other and with the per-epoch counts.
    assert r["seeds_per_s"] > 0 and r["peak_rss_mb"] > 10
    ratio = r["seeds_per_s"] / r["batches_per_s"]
    assert ratio == pytest.approx(n_train / r["batches_per_epoch"], rel=1e-3)
    # each seed has at most 5 first-hop edges, each first-hop node at most 3: edges/seed <= 5 + 15
    edges_per_seed = r["sampled_edges_per_epoch"] / n_train
    assert 1 < edges_per_seed <= 20
    assert r["sampled_edges_per_s"] == pytest.approx(r["seeds_per_s"] * edges_per_seed, rel=0.5)
    for k in ("seeds_per_s", "batches_per_s", "sampled_edges_per_s"):
        assert r["min"][k] <= r[k] <= r["max"][k]
    assert r["min"]["epoch_s"] <= r["epoch_s"] <= r["max"]["epoch_s"]


def test_bench_sample_all_input_and_fanout_all(tiny_p2):
    root, _ = tiny_p2
    r = bench_sample(SampleBenchConfig(str(root), (-1,), batch_size=4096, input="all", epochs=1))
    meta, parts = open_parts(root)
    assert r["seeds_per_epoch"] == 10_000
    assert r["batches_per_epoch"] == sum(-(-p.num_nodes // 4096) for p in parts)
    # fanout -1 over all nodes: every edge of the graph is sampled once per epoch
    assert r["sampled_edges_per_epoch"] == sum(meta.num_edges.values())


def test_cli_prints_one_json_line(tiny_p2, capsys):
    root, splits = tiny_p2
    rc = cli_main(["bench", "sample", "--graph", str(root), "--num-neighbors", "4,2", "--batch-size", "256",
                   "--epochs", "1", "--threads", "1", "--features"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1
    r = json.loads(out[0])
    assert r["seeds_per_epoch"] == len(splits["train"]) and r["features"] is True
    assert r["num_neighbors"] == [4, 2] and r["graph"] == str(root)


@pytest.mark.parametrize("argv, message", [
    (["--num-neighbors", "15,x"], "comma-separated list"),
    (["--num-neighbors", "15,0"], "invalid fanout"),
    (["--batch-size", "0"], "--batch-size"),
    (["--epochs", "0"], "--epochs"),
    (["--threads", "0"], "--threads"),
    (["--input", "training"], "--input"),
])
def test_cli_bad_arguments_are_one_line_errors(tiny_p2, capsys, argv, message):
    root, _ = tiny_p2
    rc = cli_main(["bench", "sample", "--graph", str(root)] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]


def test_cli_missing_graph_folder(tmp_path, capsys):
    rc = cli_main(["bench", "sample", "--graph", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert rc == 2 and "no such partition folder" in err


@pytest.fixture(scope="module")
def tiny_link_p2(tmp_path_factory):
    ei, x, y, splits = synth.generate_preset("tiny")
    root = tmp_path_factory.mktemp("bench_link") / "tiny_link_p2"
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, root, method="random",
                    link_split={"val": 0.05, "test": 0.1})
    return root


def test_cli_link_mode_counts_seed_edges(tiny_link_p2, tiny_p2, capsys):
    from graphfeed.server.partition.format.layout import read_meta

    rc = cli_main(["bench", "sample", "--graph", str(tiny_link_p2), "--link", "--input", "val", "--num-neighbors",
                   "4,2", "--batch-size", "256", "--epochs", "2", "--threads", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1
    r = json.loads(out[0])
    meta = read_meta(tiny_link_p2)
    assert r["seeds_per_epoch"] == meta.link_split_sizes()["val"], "seeds are the split's seed edges"
    assert r["batches_per_epoch"] == sum(-(-n // 256) for n in meta.link_splits["val"]["sizes"])
    assert (r["link"], r["neg_ratio"], r["features"], r["input"]) == (True, 1.0, True, "val")
    # one epoch's wall time behind both rates (each rounded to 0.1/s: a slow epoch's few batches/s round coarsely)
    assert r["batches_per_s"] == pytest.approx(r["seeds_per_s"] * r["batches_per_epoch"] / r["seeds_per_epoch"],
                                               abs=0.051)
    # endpoints of B seed edges plus B negatives: each of the <= 4B seed nodes has at most 4 + 8 edges
    assert 0 < r["sampled_edges_per_epoch"] <= 4 * r["seeds_per_epoch"] * 12
    without = bench_sample(SampleBenchConfig(str(tiny_link_p2), (4, 2), batch_size=256, epochs=1, input="val",
                                             link=True, neg_ratio=0))
    assert without["seeds_per_epoch"] == r["seeds_per_epoch"]
    assert without["sampled_edges_per_epoch"] < r["sampled_edges_per_epoch"], "negatives' endpoints are sampled too"
    rc = cli_main(["bench", "sample", "--graph", str(tiny_p2[0]), "--link"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--link-split" in err[0], "a partition without link splits names the fix"
