"""DDP training of a GraphSAGE node classifier from graphfeed servers — a script to copy.

Launch one process per rank with torchrun (servers may run on other hosts)::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST0:29500 \\
        -m graphfeed.cli.train_ddp --servers cluster.yaml --epochs 10

``--servers`` is a cluster YAML file (``servers: [host:port, ...]``) or a comma-separated
``host:port`` list.  Each rank connects to every server (its own torch RPC group), and
gets exactly ``len(loader)`` batches per epoch (see docs/concepts.md, "Epoch contract"), so the
DDP loop needs no ``Join``.  Only rank 0 prints.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import SAGEConv

import graphfeed.client


class SAGE(torch.nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float = 0.0):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), self.dropout, self.training)
        return x


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", required=True, help="cluster YAML file or comma-separated host:port list")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--num-neighbors", default="10,5,5", help="per-hop fanouts; also sets the number of layers")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.0, help="dropout between layers")
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true", help="progress bar on rank 0")
    p.add_argument("--connect-timeout", type=float, default=120.0,
                   help="seconds to wait for the servers to open this trainer's group (each starts a session "
                        "worker: slower on a busy machine; default 120)")
    return p.parse_args(argv)


def cluster_arg(servers: str):
    return servers if servers.endswith((".yaml", ".yml")) else [s for s in servers.split(",") if s]


def init_distributed() -> tuple[int, int]:
    """gloo process group from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    if "RANK" not in os.environ:
        return 0, 1
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    return dist.get_rank(), dist.get_world_size()


def global_sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate(model, loader) -> float:
    model.eval()
    correct = total = 0
    for batch in loader:
        pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(-1)
        correct += int((pred == batch.y[:batch.batch_size]).sum())
        total += batch.batch_size
    c, n = global_sum(correct, total)
    return c / max(n, 1)


def train_epoch(model, loader, optimizer, progress) -> tuple[float, int, float]:
    model.train()
    loss_sum, steps = 0.0, 0
    start = time.perf_counter()
    for batch in progress(loader):
        optimizer.zero_grad()
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        loss.backward()
        optimizer.step()
        loss_sum += loss.item()
        steps += 1
    seconds = time.perf_counter() - start
    loss_total, steps_total = global_sum(loss_sum, steps)
    return loss_total / max(steps_total, 1), int(steps_total), seconds


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world = init_distributed()
    torch.manual_seed(args.seed)
    fanouts = [int(k) for k in args.num_neighbors.split(",")]
    say = print if rank == 0 else (lambda *a, **k: None)
    with graphfeed.client.connect(cluster_arg(args.servers), timeout=args.connect_timeout) as client:
        num_features = client.features["x"][0][0]
        common = dict(num_neighbors=fanouts, prefetch=args.prefetch, seed=args.seed)
        train = client.neighbor_loader(input_nodes="train", batch_size=args.batch_size, shuffle=True, **common)
        val = client.neighbor_loader(input_nodes="val", batch_size=2048, **common)
        test = client.neighbor_loader(input_nodes="test", batch_size=2048, **common)
        sage = SAGE(num_features, args.hidden, client.num_classes, len(fanouts), dropout=args.dropout)
        model: torch.nn.Module = DistributedDataParallel(sage) if dist.is_initialized() else sage
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        progress = _progress_bar(rank == 0 and args.progress)
        say(f"graph: {client.num_nodes} nodes, {client.num_parts} servers, "
            f"{world} rank(s), {len(train)} train batches per rank per epoch")
        for epoch in range(args.epochs):
            loss, steps, seconds = train_epoch(model, train, optimizer, progress)
            acc = evaluate(model, val)
            say(f"epoch {epoch:2d}  loss {loss:.4f}  val acc {acc:.4f}  "
                f"{steps / world / seconds:.2f} batches/s per rank", flush=True)
        test_acc = evaluate(model, test)
        say(f"test acc {test_acc:.4f}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _progress_bar(enabled: bool):
    if not enabled:
        return lambda it: it
    from tqdm import tqdm

    return lambda it: tqdm(it, total=len(it), leave=False, file=sys.stderr, desc="train")


def _run() -> int:
    """:func:`main` as a command: Ctrl-C exits 130, a server failure (one that stopped on purpose
    included) one line and 1, not a traceback."""
    try:
        return main()
    except KeyboardInterrupt:
        return 130
    except graphfeed.client.ServerError as exc:
        print(f"train_ddp: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(_run())
