"""DistDGL side of the 2-server comparison (issue 11): ``DistGraph`` servers + one trainer.

Runs in a SEPARATE virtual environment (DGL 2.1 needs torch 2.2; graphfeed is not imported
here, and this module imports DGL only in the processes it starts)::

    python3 -m venv /tmp/dglvenv
    /tmp/dglvenv/bin/pip install dgl==2.1.0 torch==2.2.1 'numpy<2' torchdata==0.7.1 pandas pydantic pyyaml psutil
    /tmp/dglvenv/bin/python bench/distdgl_compare.py --graph /tmp/s11/med --method random --workdir /tmp/distdgl

``--graph`` is a graph folder in the ``.npy`` layout (edge_index.npy, x.npy, y.npy,
train_idx.npy).  The graph is partitioned once per ``--method``/``--parts`` with
``dgl.distributed.partition_graph`` (x, y and the train mask as node data; METIS balances
the train nodes and the edges as DistDGL's examples do) and cached under ``--workdir``.

Then ``--parts`` DistDGL servers start as separate processes on 127.0.0.1 (one per part,
``DGL_NUM_SERVER=1``, the env vars of DGL's ``tools/launch.py``), and one trainer process
calls ``dgl.distributed.initialize``, opens the ``DistGraph`` and iterates a
``DistNodeDataLoader`` (``NeighborSampler``, no replacement, in-edges, shuffled) over ALL
training nodes, gathering x and y of every batch's input nodes -- the work graphfeed's
``bench remote`` does through one trainer.  (DistDGL's ``node_split`` cannot serve one
trainer over two parts: it asserts trainers % parts == 0; the union of its splits is the
whole train mask, which is what this script takes.)

Placement emulates one machine per part: the trainer shares "machine 0" with server 0 and
reads that part's structure and features through shared memory, as a DistDGL trainer does
with its colocated server; the other servers play remote machines (their structure is not
shared and their feature segments get private names, since DGL names them per machine and
two servers on one host would otherwise write the same segment), reached over DGL's TCP
sockets on loopback.

``--num-neighbors`` is hop-1 first, as in graphfeed (15,10,5: the seeds get 15); DGL's
``NeighborSampler`` wants the input layer first, so the list is reversed for it.  One
warm-up epoch, then ``--epochs`` measured epochs; seeds/s is their median (min/max too),
``cpu_s_per_epoch`` is user+system CPU of the trainer and every server process tree
(``/proc/<pid>/stat``), peak RSS per process (``VmHWM``).  Prints one JSON line.  Every
process this script starts is stopped at the end; ``--timeout`` bounds the whole run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

GRAPH_NAME = "gfbench"
METHODS = ("random", "metis")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graph", help="folder with edge_index.npy, x.npy, y.npy, train_idx.npy")
    p.add_argument("--method", choices=METHODS, default="random", help="partitioning method")
    p.add_argument("--parts", type=int, default=2, help="partitions = DistDGL servers (one per part)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "distdgl_compare"),
                   help="partition cache and run files")
    p.add_argument("--num-neighbors", default="15,10,5", help="fanouts, hop 1 (the seeds) first")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=2, help="measured epochs (after one warm-up epoch)")
    p.add_argument("--threads", type=int, default=1,
                   help="OMP/torch threads of the trainer and of each server (2 on 2 cores: slower, oversubscribed)")
    p.add_argument("--samplers", type=int, default=0,
                   help="DGL_NUM_SAMPLER: sampler processes of the trainer (0: it samples itself)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run, partitioning included")
    p.add_argument("--seed", type=int, default=0)
    add_role_args(p)
    args = p.parse_args(argv)
    _check_args(p, args)
    return args


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.role in ("main", "partition") and not args.graph:
        p.error("--graph is required: a folder with edge_index.npy, x.npy, y.npy, train_idx.npy")
    if args.role in ("main", "partition") and not os.path.isfile(os.path.join(args.graph, "edge_index.npy")):
        p.error(f"--graph {args.graph!r} has no edge_index.npy: pass a graph folder in the .npy layout")
    if args.parts < 2:
        p.error(f"--parts must be >= 2 (got {args.parts}): this is the distributed comparison")
    if args.epochs < 1 or args.batch_size < 1 or args.threads < 1 or args.samplers < 0:
        p.error("--epochs, --batch-size and --threads must be >= 1 and --samplers >= 0")
    try:
        fanouts = parse_fanouts(args.num_neighbors)
    except ValueError:
        fanouts = []
    if not fanouts:
        p.error(f"--num-neighbors {args.num_neighbors!r}: give positive integers, hop 1 first, e.g. 15,10,5")
    if args.timeout <= 0:
        p.error("--timeout must be > 0 seconds")


def parse_fanouts(text: str) -> list[int]:
    """'15,10,5' -> [15, 10, 5] (hop 1 first); [] when any entry is not a positive integer."""
    fanouts = [int(k) for k in text.split(",")]
    return fanouts if all(k > 0 for k in fanouts) else []


def dgl_fanouts(fanouts: list[int]) -> list[int]:
    """DGL's NeighborSampler samples ``fanouts[-1]`` around the seeds: reverse the hop-1-first list."""
    return list(reversed(fanouts))


# ---- process CPU and memory from /proc ---------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()   # fields from 3 (state) on; comm may hold spaces


def _children(root: int) -> list[int]:
    """``root`` and its live descendants."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        fields = _stat_fields(int(name)) if name.isdigit() else None
        if fields is not None:
            parent[int(name)] = int(fields[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier]
        tree += frontier
    return tree


def tree_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds so far of the live processes ``pids`` and their descendants."""
    total = 0
    for root in pids:
        for pid in _children(root):
            fields = _stat_fields(pid)
            if fields is not None:
                total += int(fields[11]) + int(fields[12])   # utime, stime (fields 14, 15)
    return total / _TICK


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM of ``pid`` in MiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


# ---- partitioning (its own process: its peak memory is gone before the servers start) ----------

def part_dir(args: argparse.Namespace) -> str:
    return os.path.join(os.path.abspath(args.workdir), f"{args.method}-{args.parts}")


def part_config(args: argparse.Namespace) -> str:
    return os.path.join(part_dir(args), GRAPH_NAME + ".json")


def _marker(args: argparse.Namespace) -> str:
    return os.path.join(part_dir(args), "distdgl_compare.json")


def cached_partition(args: argparse.Namespace) -> dict | None:
    """The marker of a finished partition of this graph, or None when it must be built."""
    try:
        with open(_marker(args)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if marker.get("graph") == os.path.abspath(args.graph) else None


def load_dgl_graph(folder: str):
    import dgl
    import numpy as np
    import torch

    edge_index = np.load(os.path.join(folder, "edge_index.npy"), mmap_mode="r")
    x = torch.from_numpy(np.load(os.path.join(folder, "x.npy")))
    g = dgl.graph((torch.from_numpy(np.ascontiguousarray(edge_index[0])),
                   torch.from_numpy(np.ascontiguousarray(edge_index[1]))), num_nodes=x.shape[0])
    g.ndata["x"] = x
    g.ndata["y"] = torch.from_numpy(np.load(os.path.join(folder, "y.npy")))
    train_mask = torch.zeros(g.num_nodes(), dtype=torch.bool)
    train_mask[torch.from_numpy(np.load(os.path.join(folder, "train_idx.npy"))).long()] = True
    g.ndata["train_mask"] = train_mask
    return g


def run_partition(args: argparse.Namespace) -> None:
    """Role ``partition``: write ``part_dir`` and its marker (partition seconds, peak RSS)."""
    import resource

    import dgl
    import numpy as np

    t0 = time.perf_counter()
    g = load_dgl_graph(args.graph)
    load_s = time.perf_counter() - t0
    metis = args.method == "metis"
    t0 = time.perf_counter()
    orig_nids, _ = dgl.distributed.partition_graph(
        g, GRAPH_NAME, args.parts, part_dir(args), part_method=args.method, return_mapping=True,
        balance_ntypes=g.ndata["train_mask"] if metis else None, balance_edges=metis, graph_formats=["csc"])
    np.save(os.path.join(part_dir(args), "orig_nids.npy"), orig_nids.numpy())
    marker = dict(graph=os.path.abspath(args.graph), method=args.method, parts=args.parts,
                  load_s=round(load_s, 1), partition_s=round(time.perf_counter() - t0, 1),
                  partition_peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    with open(_marker(args), "w") as f:
        json.dump(marker, f)


# ---- servers --------------------------------------------------------------------------------------

def _private_kv_segments(tag: str) -> None:
    """Give this server's feature segments names of their own (see the module docstring)."""
    from dgl.distributed import kvstore

    shared = kvstore.empty_shared_mem
    kvstore.empty_shared_mem = lambda name, is_create, shape, dtype: shared(tag + name, is_create, shape, dtype)


def run_server() -> None:
    """Role ``server``: one DistGraphServer configured by DGL's launch env vars; returns on shutdown."""
    from dgl.distributed import DistGraphServer, rpc

    server_id, num_servers = int(os.environ["DGL_SERVER_ID"]), int(os.environ["DGL_NUM_SERVER"])
    remote = server_id // num_servers != 0       # machine 0 hosts the trainer
    if remote:
        _private_kv_segments(f"gfm{server_id // num_servers}-")
    rpc.reset()
    server = DistGraphServer(server_id, os.environ["DGL_IP_CONFIG"], num_servers,
                             int(os.environ["DGL_NUM_CLIENT"]), os.environ["DGL_CONF_PATH"],
                             disable_shared_mem=remote, graph_format=os.environ["DGL_GRAPH_FORMAT"].split(","))
    server.start()


# ---- trainer --------------------------------------------------------------------------------------

@dataclass
class Epoch:
    wall_s: float
    seeds: int
    batches: int
    edges: int
    cpu_s: float
    trainer_cpu_s: float


def run_epoch(g, loader, server_pids: list[int]) -> Epoch:
    """One pass over ``loader`` gathering x and y of each batch's input nodes, with the CPU it cost."""
    own = [os.getpid()]
    t0, own0, srv0 = time.perf_counter(), tree_cpu_s(own), tree_cpu_s(server_pids)
    seeds = batches = edges = 0
    for input_nodes, output_nodes, blocks in loader:
        x, y = g.ndata["x"][input_nodes], g.ndata["y"][input_nodes]
        assert x.shape[0] == y.shape[0] == input_nodes.shape[0]
        seeds += int(output_nodes.shape[0])
        edges += sum(int(b.num_edges()) for b in blocks)
        batches += 1
    wall, trainer = time.perf_counter() - t0, tree_cpu_s(own) - own0
    return Epoch(wall, seeds, batches, edges, trainer + tree_cpu_s(server_pids) - srv0, trainer)


def summarize(runs: list[Epoch]) -> dict:
    rates = {"seeds_per_s": [r.seeds / r.wall_s for r in runs],
             "batches_per_s": [r.batches / r.wall_s for r in runs],
             "sampled_edges_per_s": [r.edges / r.wall_s for r in runs]}
    out: dict = {k: round(statistics.median(v), 1) for k, v in rates.items()}
    out["min"] = {k: round(min(v), 1) for k, v in rates.items()}
    out["max"] = {k: round(max(v), 1) for k, v in rates.items()}
    out.update(cpu_s_per_epoch=round(statistics.median(r.cpu_s for r in runs), 2),
               trainer_cpu_s_per_epoch=round(statistics.median(r.trainer_cpu_s for r in runs), 2),
               seeds_per_epoch=runs[0].seeds, batches_per_epoch=runs[0].batches,
               sampled_edges_per_epoch=runs[0].edges)
    return out


def check_features(g, args: argparse.Namespace, rows: int = 2000) -> int:
    """x and y of ``rows`` random nodes (every part) equal the input graph's; returns the rows checked."""
    import numpy as np
    import torch

    orig = np.load(os.path.join(part_dir(args), "orig_nids.npy"))
    ids = torch.from_numpy(np.random.default_rng(args.seed).choice(len(orig), min(rows, len(orig)), replace=False))
    x = np.load(os.path.join(args.graph, "x.npy"), mmap_mode="r")
    y = np.load(os.path.join(args.graph, "y.npy"), mmap_mode="r")
    want = np.sort(orig[ids.numpy()])
    order = np.argsort(orig[ids.numpy()])
    if not (np.array_equal(g.ndata["x"][ids].numpy()[order], x[want])
            and np.array_equal(g.ndata["y"][ids].numpy()[order], y[want])):
        raise RuntimeError("distdgl_compare: the servers' x or y differ from the input graph's")
    return len(want)


def run_trainer(args: argparse.Namespace) -> None:
    """Role ``trainer``: connect, warm up, measure; writes the summary to ``--result``."""
    import dgl
    import torch

    torch.set_num_threads(args.threads)
    server_pids = [int(p) for p in args.server_pids.split(",") if p]
    t0 = time.perf_counter()
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    g = dgl.distributed.DistGraph(GRAPH_NAME)
    connect_s = time.perf_counter() - t0
    checked = check_features(g, args)
    train = torch.nonzero(g.ndata["train_mask"][0:g.num_nodes()]).squeeze(1)
    sampler = dgl.dataloading.NeighborSampler(dgl_fanouts(parse_fanouts(args.num_neighbors)), replace=False)
    loader = dgl.dataloading.DistNodeDataLoader(g, train, sampler, batch_size=args.batch_size,
                                                shuffle=True, drop_last=False)
    torch.manual_seed(args.seed)
    run_epoch(g, loader, server_pids)                                     # warm-up
    runs = [run_epoch(g, loader, server_pids) for _ in range(args.epochs)]
    out = summarize(runs)
    out.update(connect_s=round(connect_s, 1), feature_rows_checked=checked,
               local_part=int(g.get_partition_book().partid), server_peak_rss_mb=[peak_rss_mb(p) for p in server_pids])
    dgl.distributed.exit_client()                                         # shuts the servers down
    out["trainer_peak_rss_mb"] = peak_rss_mb(os.getpid())
    with open(args.result, "w") as f:
        json.dump(out, f)


# ---- the orchestrating process (no DGL import) ----------------------------------------------------

class Deadline:
    """The ``--timeout`` of the run, shared by every wait."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self, what: str) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"distdgl_compare: --timeout reached while {what}; raise --timeout")
        return left


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _role_cmd(args: argparse.Namespace, role: str, *extra: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--workdir", args.workdir,
           "--method", args.method, "--parts", str(args.parts), "--num-neighbors", args.num_neighbors,
           "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--threads", str(args.threads),
           "--samplers", str(args.samplers), "--seed", str(args.seed)]
    return cmd + (["--graph", args.graph] if args.graph else []) + list(extra)


def dgl_env(args: argparse.Namespace, ip_config: str, role: str) -> dict[str, str]:
    """The environment DGL's tools/launch.py gives a server or a trainer (one server per machine).

    Every sampler process is a DGL client of its own, so the servers wait for 1 + ``--samplers``.
    """
    env = dict(os.environ, DGL_DIST_MODE="distributed", DGL_ROLE=role, DGL_NUM_SERVER="1",
               DGL_NUM_CLIENT=str(1 + args.samplers), DGL_CONF_PATH=part_config(args), DGL_IP_CONFIG=ip_config,
               DGL_GRAPH_FORMAT="csc", DGL_NUM_SAMPLER=str(args.samplers), DGL_GROUP_ID="0",
               OMP_NUM_THREADS=str(args.threads), DGLBACKEND="pytorch")
    env.pop("DGL_KEEP_ALIVE", None)    # the trainer's exit shuts the servers down
    return env


class Run:
    """The processes of one run; ``stop()`` ends every one of them (process groups we started)."""

    def __init__(self, deadline: Deadline):
        self.deadline = deadline
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], env: dict[str, str] | None = None, log: str = "") -> subprocess.Popen:
        if not log:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        else:
            with open(log, "w") as out:     # the child holds its own descriptor
                proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, what: str, log: str) -> None:
        try:
            rc = proc.wait(timeout=self.deadline.left(what))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"distdgl_compare: --timeout reached while {what}; see {log}") from None
        if rc != 0:
            raise RuntimeError(f"distdgl_compare: {what} failed with exit code {rc}; see {log}")

    def stop(self, grace_s: float = 30.0) -> list[int | None]:
        """Wait up to ``grace_s`` for every process, then SIGKILL its group; returns the exit codes."""
        end = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        return [proc.returncode for proc in self.procs]


def ensure_partition(args: argparse.Namespace, run: Run) -> dict:
    marker = cached_partition(args)
    if marker is not None:
        return dict(marker, partition_cached=True)
    os.makedirs(part_dir(args), exist_ok=True)
    log = os.path.join(part_dir(args), "partition.log")
    run.wait(run.start(_role_cmd(args, "partition"), log=log), f"partitioning ({args.method})", log)
    marker = cached_partition(args)
    if marker is None:
        raise RuntimeError(f"distdgl_compare: partitioning wrote no marker; see {log}")
    return dict(marker, partition_cached=False)


def shm_segments() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def remove_dgl_segments(before: set[str]) -> list[str]:
    """Unlink the DGL segments of this run that a killed server left behind; returns their names.

    Only segments created during the run and named as DGL names this graph's (``GRAPH_NAME...``)
    or its feature stores (``...-kvdata-``) are touched.
    """
    left = sorted(n for n in shm_segments() - before if n.startswith(GRAPH_NAME) or n.endswith("-kvdata-"))
    for name in left:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass
    return left


def serve_and_train(args: argparse.Namespace, run: Run) -> tuple[dict, list[int | None]]:
    """Start the servers and the trainer, wait for the trainer's summary; returns it and the exit codes."""
    rundir = tempfile.mkdtemp(prefix="run-", dir=os.path.abspath(args.workdir))
    ip_config = os.path.join(rundir, "ip_config.txt")
    with open(ip_config, "w") as f:
        f.writelines(f"127.0.0.1 {port}\n" for port in free_ports(args.parts))
    servers = [run.start(_role_cmd(args, "server"), log=os.path.join(rundir, f"server{i}.log"),
                         env=dict(dgl_env(args, ip_config, "server"), DGL_SERVER_ID=str(i)))
               for i in range(args.parts)]
    result, log = os.path.join(rundir, "result.json"), os.path.join(rundir, "trainer.log")
    trainer = run.start(_role_cmd(args, "trainer", "--result", result,
                                  "--server-pids", ",".join(str(s.pid) for s in servers)),
                        env=dgl_env(args, ip_config, "client"), log=log)
    run.wait(trainer, "training", log)
    with open(result) as f:
        summary = json.load(f)
    return summary, run.stop()


def main_run(args: argparse.Namespace) -> dict:
    run = Run(Deadline(args.timeout))
    shm_before = shm_segments()
    try:
        marker = ensure_partition(args, run)
        run.procs.clear()
        summary, codes = serve_and_train(args, run)
    finally:
        run.stop(grace_s=5.0)
        leaked = remove_dgl_segments(shm_before)
        if leaked:
            print(f"distdgl_compare: removed {len(leaked)} shared-memory segments the servers left", file=sys.stderr)
    summary.update(method=args.method, parts=args.parts, partition_s=marker["partition_s"],
                   partition_peak_rss_mb=marker["partition_peak_rss_mb"],
                   partition_cached=marker["partition_cached"], server_exit_codes=codes[:-1],
                   trainer_exit_code=codes[-1], leftover_shm_segments=leaked,
                   implementation=_dgl_version(), graph=args.graph, num_neighbors=parse_fanouts(args.num_neighbors),
                   batch_size=args.batch_size, epochs=args.epochs, threads=args.threads, samplers=args.samplers,
                   load_1min=round(os.getloadavg()[0], 2))
    return summary


def _dgl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"distdgl-{version('dgl')}"
    except PackageNotFoundError:
        return "distdgl-unknown"


def add_role_args(p: argparse.ArgumentParser) -> None:
    """The hidden arguments by which a comparison starts its own processes (:func:`run_role`)."""
    p.add_argument("--role", choices=("main", "partition", "server", "trainer"), default="main",
                   help=argparse.SUPPRESS)
    p.add_argument("--server-pids", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)


def run_role(args: argparse.Namespace, partition, trainer, run) -> None:
    """What one process of a comparison does, by ``args.role``: partition, serve (DistDGL's server), train, or
    (``main``) ``run`` the whole comparison and print its JSON line."""
    if args.role == "partition":
        partition(args)
    elif args.role == "server":
        run_server()
    elif args.role == "trainer":
        trainer(args)
    else:
        print(json.dumps(run(args)))


def main(argv: list[str] | None = None) -> None:
    run_role(parse_args(argv), run_partition, run_trainer, main_run)


if __name__ == "__main__":
    main()
