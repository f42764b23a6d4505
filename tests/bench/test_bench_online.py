"""``graphfeed bench online``: latency of ``Client.sample`` through real ``graphfeed serve`` daemons."""
from __future__ import annotations

import json

import psutil
import pytest

from graphfeed.bench.online import percentile
from graphfeed.cli.main import main as cli_main


def test_started_servers_report_p50_p99_per_size(tiny_parts_dir, tiny_graph, capsys):
    before = _children()   # e.g. a shared cluster this test process started earlier
    rc = cli_main(["bench", "online", "--graph", str(tiny_parts_dir), "--servers", "2", "--num-neighbors", "5,3",
                   "--requests", "20", "--warmup", "2", "--sizes", "1,64,100000"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1, out
    r = json.loads(out[0])
    n = r["num_nodes"]
    assert n == tiny_graph.x.shape[0] and (r["servers"], r["num_parts"]) == (2, 2)
    assert sorted(r["latency"], key=int) == ["1", "64", str(n)]     # a size above the graph is capped at its nodes
    for row in r["latency"].values():
        assert row["requests"] == 20
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"] and row["p50_ms"] <= row["max_ms"]
    assert r["num_neighbors"] == [5, 3] and r["implementation"] in ("native", "reference")
    assert not _children() - before, "no child process may survive the bench"


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    assert percentile([3.0], 99) == 3.0


@pytest.mark.parametrize("argv, message", [
    (["--servers", "2"], "give --graph DIR"),
    (["--servers", "1", "--graph", "/nonexistent/parts"], "no such partition folder"),
    (["--servers", "127.0.0.1:1", "--sizes", "0"], "--sizes must be positive"),
    (["--servers", "127.0.0.1:1", "--sizes", "a,b"], "--sizes 'a,b' is not a comma-separated list"),
])
def test_bad_arguments_exit_2(capsys, argv, message):
    assert cli_main(["bench", "online", *argv]) == 2
    assert message in capsys.readouterr().err


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}
