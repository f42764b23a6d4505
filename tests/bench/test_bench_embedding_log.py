"""``python -m graphfeed.bench.embedding_log``: the update log's cost per push, both arms measured."""
from __future__ import annotations

from graphfeed.bench.embedding_log import bench_push_log


def test_the_bench_measures_both_arms_and_the_log_holds_every_push(tmp_path):
    r = bench_push_log(rows=2_000, dim=8, batch_rows=300, steps=4, folder=str(tmp_path))
    assert r["push_ms_off"] > 0 and r["push_ms_on"] > 0 and r["push_p90_ms_on"] >= r["push_ms_on"]
    assert r["log_bytes_per_push"] > 300 * 8 * 4   # at least the summed gradient rows
    assert r["overhead"] == round(r["push_ms_on"] / r["push_ms_off"] - 1, 3)
