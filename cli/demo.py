"""``graphfeed demo``: the whole product on one machine.

Generates the ``small`` synthetic graph (100k nodes, 2M edges), partitions it in two
(METIS), starts two ``graphfeed serve`` daemons on loopback, trains a 3-layer GraphSAGE
with 2 DDP ranks (gloo, CPU) from remote loaders, prints per-epoch loss, validation
accuracy and batches/s and the final test accuracy, then shuts everything down.
Every child process is stopped on exit, Ctrl-C included; every wait is bounded.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HEALTH_TIMEOUT_S = 120.0
STOP_GRACE_S = 30.0


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
    children: list[subprocess.Popen] = []
    try:
        servers = [_start_server(parts_dir, k, work, children) for k in range(2)]
        _step(f"servers up: {', '.join(servers)}")
        code = _train(args, servers, children)
        _step("stopping servers (SIGTERM, drain)")
        codes = _stop_all(children)
        bad = [c for c in codes if c not in (0, None)]
        if bad:
            print(f"demo: a server exited with code {bad[0]}", file=sys.stderr)
            return 1
        return code
    except KeyboardInterrupt:
        print("\ndemo: interrupted, stopping every child process", file=sys.stderr)
        _stop_all(children)
        return 130
    finally:
        _stop_all(children)


def _step(msg: str) -> None:
    print(f"== {msg}", flush=True)


def _graphfeed(*argv: str) -> None:
    res = subprocess.run([sys.executable, "-m", "graphfeed.cli", *argv])
    if res.returncode != 0:
        raise RuntimeError(f"`graphfeed {' '.join(argv)}` failed with exit code {res.returncode}")


def _start_server(parts_dir: Path, part: int, work: Path, children: list) -> str:
    port_file = work / f"server{part}.port"
    port_file.unlink(missing_ok=True)
    log = open(work / f"server{part}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "graphfeed.cli", "serve", "--partition", str(parts_dir),
                             "--part", str(part), "--host", "127.0.0.1", "--port", "0",
                             "--port-file", str(port_file)], stdout=log, stderr=subprocess.STDOUT)
    children.append(proc)
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None:
            raise RuntimeError(f"server {part} exited with code {proc.returncode}; see {log.name}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"server {part} did not bind within {HEALTH_TIMEOUT_S:.0f} s; see {log.name}")
        time.sleep(0.1)
    address = f"127.0.0.1:{int(port_file.read_text().strip())}"
    _wait_serving(address, deadline, proc, log.name)
    return address


def _wait_serving(address: str, deadline: float, proc, log_name: str) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server {address} exited with code {proc.returncode}; see {log_name}")
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {address} not SERVING after {HEALTH_TIMEOUT_S:.0f} s; see {log_name}")
            time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(args, servers: list[str], children: list) -> int:
    _step(f"training: {args.ranks} DDP ranks (gloo), 3-layer GraphSAGE, {args.epochs} epochs")
    master_port = _free_port()
    ranks = []
    for rank in range(args.ranks):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), OMP_NUM_THREADS="1",
                   TORCH_CPP_LOG_LEVEL=os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))  # no C++ warning per shutdown
        cmd = [sys.executable, "-m", "graphfeed.cli.train_ddp", "--servers", ",".join(servers),
               "--epochs", str(args.epochs), "--num-neighbors", args.num_neighbors,
               "--batch-size", str(args.batch_size), "--lr", str(args.lr),
               "--hidden", str(args.hidden), "--dropout", str(args.dropout)] + (["--progress"] if rank == 0 else [])
        proc = subprocess.Popen(cmd, env=env, stdout=None if rank == 0 else subprocess.DEVNULL)
        children.append(proc)
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


def _stop_all(children: list) -> list:
    """SIGTERM every live child, wait up to the grace, then SIGKILL; returns exit codes."""
    for proc in children:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in children:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    codes = [p.returncode for p in children]
    children.clear()
    return codes
