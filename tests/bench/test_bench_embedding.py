"""``graphfeed bench embedding``: typed training with and without server tables, through started daemons."""
from __future__ import annotations

import json

import psutil
import pytest

from graphfeed.cli.main import main as cli_main


def test_started_servers_report_accuracy_batch_time_and_push_throughput(shared_mag, capsys):
    parts, _ = shared_mag
    before = {p.pid for p in psutil.Process().children(recursive=True)}   # e.g. a shared cluster of this session
    rc = cli_main(["bench", "embedding", "--graph", str(parts), "--servers", "2", "--dim", "16", "--epochs", "1",
                   "--batch-size", "256", "--num-neighbors", "4,2", "--threads", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1, out
    r = json.loads(out[0])
    assert (r["servers"], r["dim"], r["featureless_types"], r["trainer_threads"]) == (2, 16, ["author"], 1)
    assert r["batches_plain"] == r["batches_embedding"] > 0
    assert r["batch_ms_plain"] > 0 and r["batch_ms_embedding"] > 0 and r["push_ms_embedding"] > 0
    assert r["table_rows_embedding"] == 3500 and r["rows_applied_per_s_per_server_embedding"] > 0
    assert 0 <= r["val_accuracy_plain"] <= 1 and 0 <= r["val_accuracy_embedding"] <= 1
    assert r["overhead"] == pytest.approx(r["batch_ms_embedding"] / r["batch_ms_plain"] - 1)
    # the model's own cost of learnable inputs (constant leaf rows, nothing travels) apart from the system's
    assert r["batches_constant"] == r["batches_plain"] and r["val_accuracy_constant"] >= 0
    assert r["model_overhead"] == pytest.approx(r["batch_ms_constant"] / r["batch_ms_plain"] - 1)
    assert r["system_overhead"] == pytest.approx(r["batch_ms_embedding"] / r["batch_ms_constant"] - 1)
    for arm in ("plain", "constant", "embedding"):
        assert all(r[f"{phase}_ms_{arm}"] >= 0 for phase in ("wait", "forward", "backward", "dense_step"))
        assert r[f"forward_ms_{arm}"] > 0 and r[f"cpu_ms_trainer_{arm}"] > 0 and r[f"cpu_ms_servers_{arm}"] > 0
    assert r["sparse_step_ms_embedding"] == r["push_ms_embedding"]
    assert r["emb_bytes_per_batch_embedding"] == pytest.approx(r["rows_pushed_per_step_embedding"] * 16 * 4)
    survivors = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not survivors, "no child process may survive the bench"


def test_bad_arguments_are_one_line(capsys):
    rc = cli_main(["bench", "embedding", "--servers", "2"])
    err = capsys.readouterr().err
    assert rc != 0 and "give --graph DIR" in err


def test_narrow_feature_dtype_halves_the_rows_bytes(shared_mag, capsys):
    parts, _ = shared_mag
    rc = cli_main(["bench", "embedding", "--graph", str(parts), "--servers", "2", "--dim", "16", "--epochs", "1",
                   "--batch-size", "256", "--num-neighbors", "4,2", "--feature-dtype", "bfloat16"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1, out
    r = json.loads(out[0])
    assert r["emb_bytes_per_batch_embedding"] == pytest.approx(r["rows_pushed_per_step_embedding"] * 16 * 2)
    assert 0 <= r["val_accuracy_embedding"] <= 1
