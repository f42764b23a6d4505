"""A DDP script that never calls ``client.close()`` (as PyG's ``distributed_sampling.py`` ported to graphfeed
does not) exits 0 on every rank: each process closes its own sessions and group at exit, within
``AT_EXIT_BOUND``, and waits on no other rank -- here rank 0 leaves an evaluation loader mid-epoch and neither
rank destroys its process group."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from helpers.graphs import synthetic_parts

from graphfeed.client.client import AT_EXIT_BOUND
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.testing.cluster import running_cluster

RANKS = 2
RUN_WAIT = 240.0     # seconds for both ranks to start, train two epochs and exit (a loaded 2-core host)
EXIT_SLACK = 15.0    # seconds beyond AT_EXIT_BOUND from a rank's last line to its exit (interpreter teardown)
GROUPS_WAIT = 10.0   # seconds for the servers to show no group once both ranks exited

RANK = textwrap.dedent("""
    import sys, time
    import torch, torch.distributed as dist
    import graphfeed.client as gf
    rank, store, servers = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    client = gf.connect(servers, timeout=60)
    loader = client.neighbor_loader("train", [4, 2], batch_size=8, shuffle=True, seed=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch.x[:batch.batch_size]), batch.y[:batch.batch_size])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        dist.barrier()
    if rank == 0:   # evaluation on one rank, left mid-epoch with a live iterator
        for i, batch in enumerate(client.neighbor_loader(None, [-1], batch_size=64, rank=0, world_size=1)):
            if i == 1:
                break
    print(f"trained {time.time()}", flush=True)
    # no client.close(), no dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("ddp_no_close") / "parts", nodes=800, avg_degree=4, features=4,
                           classes=2, parts=2, name="ddp-no-close-800")


def test_two_ranks_that_never_close_exit_0_and_leave_no_group(parts_dir, tmp_path):
    with running_cluster(parts_dir, log_dir=tmp_path / "logs") as servers:
        addresses = ",".join(s.address for s in servers)
        started = time.monotonic()
        ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(tmp_path / "store"), addresses],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(RANKS)]
        outputs, exited = [], []
        for p in ranks:
            try:
                outputs.append(p.communicate(timeout=max(1.0, RUN_WAIT - (time.monotonic() - started)))[0])
            except subprocess.TimeoutExpired:
                for q in ranks:
                    q.kill()
                raise AssertionError(f"rank pid {p.pid} did not exit within {RUN_WAIT:g} s") from None
            exited.append(time.time())
        assert [p.returncode for p in ranks] == [0] * RANKS, "\n".join(o[-3000:] for o in outputs)
        trained = [float(next(line for line in o.splitlines() if line.startswith("trained")).split()[1])
                   for o in outputs]
        # rank 1's exit is seen only after rank 0's: bound each by when it was seen at the latest
        took = [round(e - t, 1) for e, t in zip(exited, trained)]
        assert max(took) < AT_EXIT_BOUND + EXIT_SLACK, f"seconds from the last line to the exit: {took}"
        deadline = time.monotonic() + GROUPS_WAIT
        for s in servers:
            while True:
                with grpc.insecure_channel(s.address) as channel:
                    left = pb_grpc.ControlStub(channel).GetStats(pb.StatsRequest(), timeout=30).groups_open
                if left == 0:
                    break
                assert time.monotonic() < deadline, f"{s.name} still holds {left} groups {GROUPS_WAIT:g} s later"
                time.sleep(0.2)
            assert "closed by client" in s.logs() and "group_reap" not in s.logs()
        print(f"both ranks exited 0; seconds from their last line to their exit (at most): {took}")
