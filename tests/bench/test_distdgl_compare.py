"""bench/distdgl_compare.py: arguments, /proc accounting and process handling without DGL; the whole
run against real DistDGL servers when ``GRAPHFEED_DGL_PYTHON`` names a DGL 2.1 interpreter (its module
docstring says how to make one; CI has none, so that test skips there)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from graphfeed.bench import distdgl_compare as dd

SCRIPT = dd.__file__


@pytest.fixture()
def graph_dir(tmp_path):
    """A small graph folder in the .npy layout (a ring plus chords, 300 nodes)."""
    n = 300
    src = np.concatenate([np.arange(n), np.arange(n)])
    dst = np.concatenate([(np.arange(n) + 1) % n, (np.arange(n) * 7 + 3) % n])
    np.save(tmp_path / "edge_index.npy", np.stack([src, dst]).astype(np.int64))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((n, 8), dtype=np.float32))
    np.save(tmp_path / "y.npy", (np.arange(n) % 5).astype(np.int64))
    np.save(tmp_path / "train_idx.npy", np.arange(0, n, 3, dtype=np.int64))
    return tmp_path


def test_defaults_match_the_issue_workload(graph_dir):
    args = dd.parse_args(["--graph", str(graph_dir)])
    assert (args.method, args.parts, args.epochs, args.batch_size, args.role) == ("random", 2, 2, 1024, "main")
    assert dd.parse_fanouts(args.num_neighbors) == [15, 10, 5]
    # DGL samples the last list entry around the seeds: hop 1 (15) must come last
    assert dd.dgl_fanouts([15, 10, 5]) == [5, 10, 15]
    assert dd.part_dir(dd.parse_args(["--graph", str(graph_dir), "--method", "metis", "--workdir", "/w"])) \
        == "/w/metis-2"


@pytest.mark.parametrize("argv, names", [
    ([], "--graph is required"),
    (["--graph", "/nonexistent"], "--graph '/nonexistent' has no edge_index.npy"),
    (["--parts", "1"], "--parts must be >= 2"),
    (["--num-neighbors", "15,x"], "--num-neighbors '15,x'"),
    (["--num-neighbors", "15,0"], "--num-neighbors '15,0'"),
    (["--method", "hash"], "--method: invalid choice"),
    (["--timeout", "0"], "--timeout must be > 0"),
])
def test_bad_arguments_exit_with_a_line_naming_them(graph_dir, capsys, argv, names):
    base = [] if argv == [] or argv[0] == "--graph" else ["--graph", str(graph_dir)]
    with pytest.raises(SystemExit) as exc:
        dd.parse_args(base + argv)
    assert exc.value.code == 2
    assert names in capsys.readouterr().err


def test_importable_without_dgl():
    """The orchestrating side never imports DGL (CI has none); only the processes it starts do."""
    code = (f"import sys; sys.modules['dgl'] = None; sys.path.insert(0, {os.path.dirname(SCRIPT)!r}); "
            "import distdgl_compare as m; m.parse_args(['--role', 'server']); print(sys.modules['dgl'] is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"       # still the blocking placeholder: nothing imported dgl


def test_tree_cpu_counts_children_and_rss_reads_proc():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"])
    try:
        time.sleep(0.5)
        with_child = dd.tree_cpu_s([os.getpid()])
        alone = dd._stat_fields(os.getpid())
        assert alone is not None
        own = (int(alone[11]) + int(alone[12])) / dd._TICK
        assert with_child >= own + 0.2          # the busy child's CPU is in its parent's tree
        assert os.getpid() in dd._children(os.getpid()) and busy.pid in dd._children(os.getpid())
    finally:
        assert busy.wait(timeout=30) == 0
    assert dd.tree_cpu_s([busy.pid]) == 0       # gone: counts nothing
    rss = dd.peak_rss_mb(os.getpid())
    assert rss is not None and rss > 10
    assert dd.peak_rss_mb(busy.pid) is None


def test_run_stops_what_it_started_and_waits_are_bounded(tmp_path):
    run = dd.Run(dd.Deadline(0.5))
    sleeper = run.start([sys.executable, "-c", "import time; time.sleep(60)"], log=str(tmp_path / "s.log"))
    with pytest.raises(TimeoutError, match="--timeout reached while sleeping; see .*s.log"):
        run.wait(sleeper, "sleeping", str(tmp_path / "s.log"))
    t0 = time.monotonic()
    assert run.stop(grace_s=0.2) == [-9]      # killed (its process group), not waited for a minute
    assert time.monotonic() - t0 < 15
    failing = dd.Run(dd.Deadline(30))
    proc = failing.start([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="partitioning failed with exit code 3; see p.log"):
        failing.wait(proc, "partitioning", "p.log")


def test_launch_env_counts_sampler_processes_as_clients(graph_dir):
    args = dd.parse_args(["--graph", str(graph_dir), "--workdir", "/w", "--samplers", "2"])
    env = dd.dgl_env(args, "/w/ip_config.txt", "server")
    assert env["DGL_NUM_CLIENT"] == "3" and env["DGL_NUM_SAMPLER"] == "2" and env["DGL_NUM_SERVER"] == "1"
    assert env["DGL_CONF_PATH"] == "/w/random-2/gfbench.json" and env["DGL_ROLE"] == "server"
    assert env["DGL_GRAPH_FORMAT"] == "csc" and env["OMP_NUM_THREADS"] == "1" and "DGL_KEEP_ALIVE" not in env


def test_free_ports_are_distinct():
    ports = dd.free_ports(3)
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)


@pytest.mark.slow
def test_whole_run_against_distdgl_servers(graph_dir, tmp_path):
    python = os.environ.get("GRAPHFEED_DGL_PYTHON")
    if not python:
        pytest.skip("set GRAPHFEED_DGL_PYTHON to a DGL 2.1 interpreter (see bench/distdgl_compare.py)")
    cmd = [python, SCRIPT, "--graph", str(graph_dir), "--workdir", str(tmp_path / "w"), "--batch-size", "32",
           "--num-neighbors", "3,2", "--threads", "1", "--timeout", "240"]
    for cached in (False, True):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        r = json.loads(out.stdout.strip().splitlines()[-1])
        assert r["partition_cached"] is cached
        assert r["seeds_per_epoch"] == 100 and r["batches_per_epoch"] == 4          # all train nodes, 1 trainer
        # in-degree 2 everywhere (ring + chord): hop 1 takes both edges of the 100 seeds, hop 2 both of
        # each batch's <= 3 * 32 destinations
        assert 200 <= r["sampled_edges_per_epoch"] <= 200 + 2 * 3 * 100
        assert r["server_exit_codes"] == [0, 0] and r["trainer_exit_code"] == 0
        assert r["feature_rows_checked"] == 300 and r["leftover_shm_segments"] == []
        assert r["cpu_s_per_epoch"] >= r["trainer_cpu_s_per_epoch"] > 0
        assert r["min"]["seeds_per_s"] <= r["seeds_per_s"] <= r["max"]["seeds_per_s"]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_leftover_dgl_segments_of_the_run_are_removed_and_nothing_else():
    before = dd.shm_segments()
    ours = [f"{dd.GRAPH_NAME}_node_test{os.getpid()}", f"node~_N~test{os.getpid()}-kvdata-"]
    other = f"not-dgl-test-{os.getpid()}"
    for name in ours + [other]:
        with open(os.path.join("/dev/shm", name), "w") as f:
            f.write("x")
    try:
        assert dd.remove_dgl_segments(before) == sorted(ours)
        assert not any(os.path.exists(os.path.join("/dev/shm", n)) for n in ours)
        assert os.path.exists(os.path.join("/dev/shm", other))
    finally:
        for name in ours + [other]:
            if os.path.exists(os.path.join("/dev/shm", name)):
                os.unlink(os.path.join("/dev/shm", name))
