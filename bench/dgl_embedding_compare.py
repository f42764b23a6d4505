"""DGL side of the embedding push comparison (issue 23): ``DistEmbedding`` + ``SparseAdam`` on DistDGL servers.

Runs in the DGL 2.1 virtual environment of :mod:`bench.distdgl_compare` (its docstring sets it up; graphfeed is
not imported here)::

    /tmp/dglvenv/bin/python bench/dgl_embedding_compare.py --graph /tmp/gfgraphs/mag-small --workdir /tmp/dglemb

``--graph`` is a typed graph folder as ``graphfeed generate --preset mag-small`` writes it (one folder per node
type with ``num_nodes.npy`` or ``x.npy``, one per edge type ``src__rel__dst`` with ``edge_index.npy``).  It is
partitioned once into ``--parts`` parts by ``dgl.distributed.partition_graph`` (structure only: the table is the
point here) and cached under ``--workdir``.  Then ``--parts`` DistDGL servers and one trainer start as
:mod:`bench.distdgl_compare` starts them (one emulated machine per part, the trainer on machine 0 with server
0), and the trainer makes a ``DistEmbedding`` of ``--dim`` over every node of ``--ntype`` (partitioned as that
type's nodes) with ``dgl.distributed.optim.SparseAdam``.

Measured, as ``graphfeed bench embedding`` measures its ``rows_applied_per_s_per_server``: ``--steps`` steps,
each of ``--rows`` random ids (duplicates included, ids on every server): the rows read with autograd, a loss
linear in them, ``backward()``, and the timed ``SparseAdam.step()`` -- which in DGL pulls the rows' Adam state
from the servers, computes the update in the trainer, and writes rows and state back.  Reported per server:
gradient rows per second (``rows`` / step time / servers, the graphfeed figure's definition) and distinct rows
per second; plus the same for ``--batch-rows`` distinct ids per step (one mag-small batch's authors at batch
size 512).  CPU seconds of the trainer and of every server process tree come from ``/proc``.  One warm-up step
first; medians over the steps.  Prints one JSON line; every process it starts is stopped; ``--timeout`` bounds
the whole run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any


def _sibling(name: str) -> Any:
    """The sibling script ``name``.py as a module (this one runs outside graphfeed, in the DGL venv)."""
    spec = importlib.util.spec_from_file_location(f"_gf_{name}", os.path.join(os.path.dirname(__file__), f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


dc = _sibling("distdgl_compare")   # the process and DGL plumbing of the sampling comparison
GRAPH_NAME = dc.GRAPH_NAME


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graph", help="typed graph folder of `graphfeed generate --preset mag-small`")
    p.add_argument("--ntype", default="author", help="node type of the table (default author: featureless)")
    p.add_argument("--method", choices=dc.METHODS, default="metis", help="partitioning method")
    p.add_argument("--parts", type=int, default=1,
                   help="partitions = DistDGL servers (default 1: DistDGL creates a table's rows of a part only "
                        "when a trainer on that part's machine asks, so one trainer reaches one part)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "dgl_embedding_compare"),
                   help="partition cache and run files")
    p.add_argument("--dim", type=int, default=128, help="embedding width")
    p.add_argument("--rows", type=int, default=50_000, help="random ids per step (duplicates included)")
    p.add_argument("--batch-rows", type=int, default=9_142, help="distinct ids per step of the batch-sized run")
    p.add_argument("--steps", type=int, default=5, help="measured steps per run (after one warm-up step)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1, help="OMP/torch threads of the trainer and of each server")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run, partitioning included")
    p.add_argument("--seed", type=int, default=0)
    dc.add_role_args(p)
    args = p.parse_args(argv)
    args.samplers = 0   # what distdgl_compare's env and commands read
    args.num_neighbors, args.batch_size, args.epochs = "1", 1, 1
    if args.role in ("main", "partition") and not (args.graph and os.path.isdir(os.path.join(args.graph, args.ntype))):
        p.error(f"--graph {args.graph!r} has no node type folder {args.ntype!r}: pass a typed graph folder "
                f"(graphfeed generate --preset mag-small)")
    if args.parts < 1 or args.dim < 1 or args.rows < 1 or args.batch_rows < 1 or args.steps < 1 or args.threads < 1:
        p.error("--parts, --dim, --rows, --batch-rows, --steps and --threads >= 1")
    return args


# ---- the typed graph and its partitions ---------------------------------------------------------------

def load_typed_graph(folder: str):
    """The folder's node types (counts) and edge types as a DGL heterograph, structure only."""
    import dgl
    import numpy as np
    import torch

    counts = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isdir(path) or "__" in name:
            continue
        if os.path.isfile(os.path.join(path, "num_nodes.npy")):
            counts[name] = int(np.load(os.path.join(path, "num_nodes.npy")))
        else:
            counts[name] = int(np.load(os.path.join(path, "x.npy"), mmap_mode="r").shape[0])
    edges = {}
    for name in sorted(os.listdir(folder)):
        if name.count("__") == 2:
            ei = np.load(os.path.join(folder, name, "edge_index.npy"))
            edges[tuple(name.split("__"))] = (torch.from_numpy(ei[0]), torch.from_numpy(ei[1]))
    return dgl.heterograph(edges, num_nodes_dict=counts)


def partition_dir(args: argparse.Namespace) -> str:
    return os.path.join(os.path.abspath(args.workdir), f"{args.method}-{args.parts}")


def run_partition(args: argparse.Namespace) -> None:
    import dgl

    t0 = time.perf_counter()
    g = load_typed_graph(args.graph)
    dgl.distributed.partition_graph(g, GRAPH_NAME, args.parts, partition_dir(args), part_method=args.method,
                                    graph_formats=["csc"])
    with open(os.path.join(partition_dir(args), "marker.json"), "w") as f:
        json.dump({"graph": os.path.abspath(args.graph), "partition_s": round(time.perf_counter() - t0, 1)}, f)


def ensure_partition(args: argparse.Namespace, run: Any) -> dict:
    marker = os.path.join(partition_dir(args), "marker.json")
    try:
        with open(marker) as f:
            done = json.load(f)
        if done.get("graph") == os.path.abspath(args.graph):
            return dict(done, partition_cached=True)
    except (OSError, ValueError):
        pass
    os.makedirs(partition_dir(args), exist_ok=True)
    log = os.path.join(partition_dir(args), "partition.log")
    run.wait(run.start(_role_cmd(args, "partition"), log=log), f"partitioning ({args.method})", log)
    with open(marker) as f:
        return dict(json.load(f), partition_cached=False)


# ---- the trainer ------------------------------------------------------------------------------------

def timed_steps(emb, opt, ids_of, steps: int, server_pids: list[int], dim: int) -> dict:
    """One warm-up step, then ``steps`` steps of ids ``ids_of(k)``: median step seconds and rows, CPU seconds."""
    import torch

    def one(k: int) -> tuple[float, int, int]:
        ids = ids_of(k)
        grad = torch.randn(ids.numel(), dim) * 1e-3
        opt.zero_grad()   # DGL keeps each forward's trace until zero_grad: else a step re-applies the earlier ones
        rows = emb(ids)
        (rows * grad).sum().backward()
        t0 = time.perf_counter()
        opt.step()
        return time.perf_counter() - t0, ids.numel(), int(torch.unique(ids).numel())

    one(-1)
    own, cpu0 = [os.getpid()], dc.tree_cpu_s([os.getpid()])
    srv0 = dc.tree_cpu_s(server_pids)
    runs = [one(k) for k in range(steps)]
    secs = statistics.median(r[0] for r in runs)
    return {"step_ms": round(secs * 1e3, 2), "rows": runs[0][1], "distinct_rows": runs[0][2],
            "trainer_cpu_ms_per_step": round((dc.tree_cpu_s(own) - cpu0) * 1e3 / steps, 2),
            "servers_cpu_ms_per_step": round((dc.tree_cpu_s(server_pids) - srv0) * 1e3 / steps, 2),
            "_secs": secs}


def init_rows(shape, dtype):
    """The table's first rows (module level: DGL pickles it to the servers, which run this file too)."""
    import torch

    return torch.empty(shape, dtype=dtype).normal_(0.0, 0.1)


def run_trainer(args: argparse.Namespace) -> None:
    import dgl
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    server_pids = [int(p) for p in args.server_pids.split(",") if p]
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    # DGL's sparse optimizers ask torch.distributed for the backend: one trainer is a world of one
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{dc.free_ports(1)[0]}", world_size=1, rank=0)
    g = dgl.distributed.DistGraph(GRAPH_NAME)
    n = g.num_nodes(args.ntype)

    emb = dgl.distributed.DistEmbedding(n, args.dim, name=f"{args.ntype}_emb", init_func=init_rows,
                                        part_policy=g.get_node_partition_policy(args.ntype))
    opt = dgl.distributed.optim.SparseAdam([emb], lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    rand = timed_steps(emb, opt, lambda k: torch.randint(0, n, (args.rows,), generator=gen), args.steps,
                       server_pids, args.dim)
    batch = timed_steps(emb, opt, lambda k: torch.randperm(n, generator=gen)[:args.batch_rows], args.steps,
                        server_pids, args.dim)
    servers = len(server_pids)
    out: dict[str, Any] = {}
    for name, r in (("random", rand), ("batch", batch)):
        secs = r.pop("_secs")
        out[name] = dict(r, rows_applied_per_s_per_server=round(r["rows"] / secs / servers),
                         distinct_rows_per_s_per_server=round(r["distinct_rows"] / secs / servers))
    out.update(table_rows=n, local_part=int(g.get_partition_book().partid))
    dgl.distributed.exit_client()   # shuts the servers down
    with open(args.result, "w") as f:
        json.dump(out, f)


# ---- the orchestrating process (no DGL import) --------------------------------------------------------

def _role_cmd(args: argparse.Namespace, role: str, *extra: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--workdir", args.workdir, "--method",
           args.method, "--parts", str(args.parts), "--ntype", args.ntype, "--dim", str(args.dim), "--rows",
           str(args.rows), "--batch-rows", str(args.batch_rows), "--steps", str(args.steps), "--lr", str(args.lr),
           "--threads", str(args.threads), "--seed", str(args.seed)]
    return cmd + (["--graph", args.graph] if args.graph else []) + list(extra)


def main_run(args: argparse.Namespace) -> dict:
    run = dc.Run(dc.Deadline(args.timeout))
    shm_before = dc.shm_segments()
    try:
        marker = ensure_partition(args, run)
        run.procs.clear()
        rundir = tempfile.mkdtemp(prefix="run-", dir=os.path.abspath(args.workdir))
        ip_config = os.path.join(rundir, "ip_config.txt")
        with open(ip_config, "w") as f:
            f.writelines(f"127.0.0.1 {port}\n" for port in dc.free_ports(args.parts))
        conf = os.path.join(partition_dir(args), GRAPH_NAME + ".json")
        servers = [run.start(_role_cmd(args, "server"), log=os.path.join(rundir, f"server{i}.log"),
                             env=dict(dc.dgl_env(args, ip_config, "server"), DGL_SERVER_ID=str(i),
                                      DGL_CONF_PATH=conf))
                   for i in range(args.parts)]
        result, log = os.path.join(rundir, "result.json"), os.path.join(rundir, "trainer.log")
        trainer = run.start(_role_cmd(args, "trainer", "--result", result,
                                      "--server-pids", ",".join(str(s.pid) for s in servers)),
                            env=dict(dc.dgl_env(args, ip_config, "client"), DGL_CONF_PATH=conf), log=log)
        run.wait(trainer, "the embedding steps", log)
        with open(result) as f:
            summary = json.load(f)
        codes = run.stop()
    finally:
        run.stop(grace_s=5.0)
        leaked = dc.remove_dgl_segments(shm_before)
    summary.update(implementation=dc._dgl_version(), optimizer="SparseAdam", graph=args.graph, ntype=args.ntype,
                   dim=args.dim, method=args.method, parts=args.parts, threads=args.threads, steps=args.steps,
                   partition_cached=marker["partition_cached"], server_exit_codes=codes[:-1],
                   trainer_exit_code=codes[-1], leftover_shm_segments=leaked, load_1min=round(os.getloadavg()[0], 2))
    return summary


def main(argv: list[str] | None = None) -> None:
    dc.run_role(parse_args(argv), run_partition, run_trainer, main_run)


if __name__ == "__main__":
    main()
