"""``graphfeed demo``: the whole product on one machine.

Generates the ``small`` synthetic graph (100k nodes, 2M edges), partitions it in two
(METIS), starts two ``graphfeed serve`` daemons on loopback, trains a 3-layer GraphSAGE
with 2 DDP ranks (gloo, CPU) from remote loaders, prints per-epoch loss, validation
accuracy and batches/s and the final test accuracy, then shuts everything down.
Every child process is stopped on exit, Ctrl-C included; every wait is bounded.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from graphfeed.testing.cluster import LocalCluster, stop_processes

HEALTH_TIMEOUT_S = 120.0
STOP_GRACE_S = 30.0
# After Ctrl-C nothing is worth waiting for: the ranks and servers got the same SIGINT (the servers
# drain, and the trainers end as soon as a server they use says it is draining), then SIGTERM; what is
# still running this long after that is SIGKILLed, so Ctrl-C ends the demo in seconds.
INTERRUPT_GRACE_S = 5.0


def add_arguments(parser) -> None:
    parser.add_argument("--workdir", default="runs/demo", help="where the graph and partitions are kept (reused)")
    parser.add_argument("--preset", default="small", help="synthetic graph preset (tiny, small, medium)")
    parser.add_argument("--ranks", type=int, default=2, help="DDP ranks (trainer processes)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--num-neighbors", default="10,5,5")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--hidden", type=int, default=128, help="GraphSAGE hidden width")
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout between GraphSAGE layers")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up on training after this many seconds")


def run(args) -> int:
    work = Path(args.workdir)
    graph_dir, parts_dir = work / f"{args.preset}-graph", work / f"{args.preset}-2parts"
    _step(f"graph: {graph_dir}")
    _graphfeed("generate", "--preset", args.preset, "--out", str(graph_dir), "--skip-existing")
    _step(f"partition (METIS, 2 parts): {parts_dir}")
    _graphfeed("partition", str(graph_dir), "--num-parts", "2", "--method", "metis", "--output", str(parts_dir))
    # The servers stay in this process group: a terminal's Ctrl-C reaches them as it reaches the demo.
    servers = LocalCluster(parts_dir, 2, log_dir=_fresh_dir(work / "servers"), own_session=False,
                           start_timeout=HEALTH_TIMEOUT_S, stop_timeout=STOP_GRACE_S)
    ranks: list[subprocess.Popen] = []
    try:
        servers.start()
        _step(f"servers up: {', '.join(servers.addresses)}")
        code = _train(args, servers.addresses, ranks)
        _step("stopping servers (SIGTERM, drain)")
        bad = [c for c in servers.stop() if c != 0]
        if bad:
            what = "did not stop in time" if bad[0] is None else f"exited with code {bad[0]}"
            print(f"demo: a server {what}", file=sys.stderr)
            return 1
        return code
    except KeyboardInterrupt:
        print("\ndemo: interrupted, stopping every child process", file=sys.stderr)
        _stop_all(servers, ranks, INTERRUPT_GRACE_S)
        return 130
    finally:
        _stop_all(servers, ranks)


def _step(msg: str) -> None:
    print(f"== {msg}", flush=True)


def _graphfeed(*argv: str) -> None:
    """Run one ``graphfeed`` step; its own error line is above, so a failure is one more line, not a traceback."""
    from graphfeed.cli.main import UsageError

    res = subprocess.run([sys.executable, "-m", "graphfeed.cli", *argv])
    if res.returncode != 0:
        raise UsageError(f"`graphfeed {' '.join(argv)}` failed with exit code {res.returncode} (its error is above)")


def _fresh_dir(path: Path) -> Path:
    """``path``, emptied of an earlier run's server logs and port files."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(args, servers: list[str], ranks: list) -> int:
    _step(f"training: {args.ranks} DDP ranks (gloo), 3-layer GraphSAGE, {args.epochs} epochs")
    master_port = _free_port()
    for rank in range(args.ranks):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), OMP_NUM_THREADS="1",
                   TORCH_CPP_LOG_LEVEL=os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))  # no C++ warning per shutdown
        cmd = [sys.executable, "-m", "graphfeed.cli.train_ddp", "--servers", ",".join(servers),
               "--epochs", str(args.epochs), "--num-neighbors", args.num_neighbors,
               "--batch-size", str(args.batch_size), "--lr", str(args.lr),
               "--hidden", str(args.hidden), "--dropout", str(args.dropout)] + (["--progress"] if rank == 0 else [])
        proc = subprocess.Popen(cmd, env=env, stdout=None if rank == 0 else subprocess.DEVNULL)
        ranks.append(proc)
    deadline = time.monotonic() + args.timeout
    for proc in ranks:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            print(f"demo: training did not finish within {args.timeout:.0f} s", file=sys.stderr)
            return 1
    codes = [p.returncode for p in ranks]
    if any(codes):
        print(f"demo: trainer exit codes {codes}", file=sys.stderr)
        return 1
    return 0


def _stop_all(servers: LocalCluster, ranks: list, grace: float = STOP_GRACE_S) -> None:
    """Stop the trainer ranks and the servers together (SIGTERM, ``grace`` s, SIGKILL); codes not judged.
    A SIGKILLed server's session workers die with it (they ask the kernel for that: PR_SET_PDEATHSIG)."""
    stop_processes([*ranks, *(s.proc for s in servers.servers)], grace)
