"""``graphfeed bench failover``: replicated parts under kill -9s and a rolling restart, through real daemons."""
from __future__ import annotations

import json

import psutil
import pytest

from graphfeed.cli.main import main as cli_main


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.slow
@pytest.mark.parametrize("mode, ranks, faults", [("kill", 2, 2), ("rolling", 1, 4)])
def test_the_epochs_under_faults_equal_the_fault_free_ones(tiny_parts_dir, capsys, mode, ranks, faults):
    """Each part on 2 daemons; 2 ranks under 2 kill -9s of a replica in use (rank 0's of part 0, then rank 1's of
    part 1), or one rank while each of the 4 daemons is restarted in turn (SIGTERM: a drain, exit 0, the new one
    on its port): no batch differs, every seed once, and the ranks felt the faults (each kill re-formed a group)."""
    before = _children()
    rc = cli_main(["bench", "failover", "--graph", str(tiny_parts_dir), "--mode", mode, "--kills", "2",
                   "--ranks", str(ranks), "--every", "1", "--epochs", "1", "--batch-size", "64",
                   "--num-neighbors", "5,3", "--prefetch", "1", "--step-ms", "20"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1, out
    r = json.loads(out[-1])
    assert (r["mode"], r["parts"], r["replicas"], r["ranks"], r["faults"]) == (mode, 2, 2, ranks, faults), r
    assert r["errors"] == [] and r["batches"] >= r["epochs"] * r["batches_per_epoch"] > 0, r
    assert r["failed_batches"] == 0 and r["seeds_once"] is True, r
    assert r["reconnects"] >= (faults if mode == "kill" else 1), r
    assert 0 <= r["wait_median_s"] <= r["wait_p99_s"] <= r["longest_wait_s"], r
    assert not _children() - before, "no child process may survive the bench"


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "1"], "a failover needs at least 2 replicas"),
    (["--kills", "0"], "--kills, --epochs and --ranks must be at least 1"),
])
def test_bad_arguments_exit_2(tiny_parts_dir, capsys, argv, message):
    assert cli_main(["bench", "failover", "--graph", str(tiny_parts_dir), *argv]) == 2
    assert message in capsys.readouterr().err
