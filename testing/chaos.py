"""Chaos run: kill -9 random servers at random points of an epoch; the epoch must complete exactly once.

    python -m graphfeed.testing.chaos PARTITION --kills 10 --seed 1 [--batch-size 8]

One trainer (this process) reads an epoch once without faults (the reference), then reads
the same epoch again while, after randomly chosen batches, a random server is killed with
SIGKILL (its whole process group: daemon and session workers) and restarted on the same
port after a random delay.  The client's transparent resume must deliver exactly the
reference batches (same seeds, same sampled ids and edges), every input node once.
Used by ``tests/client/test_resilience.py`` with a couple of kills and by hand with more.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from graphfeed.testing.cluster import ServerProcess, running_cluster, start_server

RESTART_DELAY_MAX = 1.5   # seconds a killed server stays down at most
PREFETCH = 2              # the trainer's prefetch: the batches already asked for when a kill lands


@dataclass
class ChaosReport:
    batches: int                 # of the epoch, for this trainer
    kills: list[tuple[int, int]] = field(default_factory=list)   # (after batch, part)
    reconnects: int = 0
    resumes: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        return (f"{len(self.kills)} kill(s) over {self.batches} batches: {self.reconnects} reconnect(s), "
                f"{self.resumes} resume(s), epoch identical to the fault-free run, {self.seconds:.1f} s")


def _signature(batch) -> tuple:
    return (batch.n_id.tolist(), batch.edge_index.tolist(), int(batch.batch_size), int(batch.seq))


class _Restarter:
    """Kills a server and restarts it on its port from a thread; :meth:`settle` waits for that."""

    def __init__(self, servers: list[ServerProcess], partition, log_dir: Path):
        self.servers, self.partition, self.log_dir = servers, partition, log_dir
        self.pending: tuple[threading.Thread, int, list] | None = None
        self.count = 0

    def kill(self, part: int, delay: float) -> None:
        self.settle()
        victim = self.servers[part]
        victim.expect_exit = -signal.SIGKILL
        os.killpg(victim.pid, signal.SIGKILL)   # the daemon and its session workers
        victim.wait(30)
        victim.checked = True
        self.count += 1
        out: list = []
        where = self.log_dir / f"restart-{self.count}"

        def restart() -> None:
            time.sleep(delay)
            out.append(start_server(self.partition, part, log_dir=where, args=("--port", str(victim.port))))

        t = threading.Thread(target=restart, name=f"chaos-restart-{part}", daemon=True)
        t.start()
        self.pending = (t, part, out)

    def settle(self) -> None:
        """Wait for the pending restart (bounded) and put the new server in the list the cluster stops."""
        if self.pending is None:
            return
        t, part, out = self.pending
        self.pending = None
        t.join(120)
        if not out:
            raise AssertionError(f"part {part}'s server did not restart within 120 s (see {self.log_dir})")
        self.servers[part] = out[0]


def run_chaos(partition, kills: int, *, seed: int = 0, batch_size: int = 8, fanouts=(4, 2),
              log_dir: str | os.PathLike | None = None, reconnect_timeout: float = 120.0) -> ChaosReport:
    """Run the chaos epoch on a fresh local cluster of ``partition``; AssertionError when the epoch
    differs from the fault-free one (lost, repeated or different batches)."""
    import graphfeed.client as gf

    rng = random.Random(seed)
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="graphfeed-chaos-"))
    t0 = time.monotonic()
    with running_cluster(partition, log_dir=log_dir) as servers:
        restarter = _Restarter(servers, partition, log_dir)
        args = dict(batch_size=batch_size, shuffle=True, seed=seed, prefetch=PREFETCH)
        try:
            with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=reconnect_timeout) as client:
                reference = [_signature(b) for b in client.neighbor_loader("train", list(fanouts), **args)]
                loader = client.neighbor_loader("train", list(fanouts), **args)
                # A kill after one of the last batches can find them all asked for (prefetch) and produced
                # already, and the epoch ends without needing the killed server: kill before those.
                where = range(max(1, len(reference) - 1 - 2 * PREFETCH))
                points = set(rng.sample(where, min(kills, len(where))))
                report = ChaosReport(batches=len(reference))
                got = []
                for i, batch in enumerate(loader):   # the trainer waits in here while a server is down
                    got.append(_signature(batch))
                    if i in points:
                        part = rng.randrange(len(servers))
                        restarter.kill(part, rng.uniform(0, RESTART_DELAY_MAX))
                        report.kills.append((i, part))
                report.reconnects, report.resumes = client.reconnects, loader.stats()["resumes"]
        finally:
            restarter.settle()
    report.seconds = time.monotonic() - t0
    if got != reference:
        raise AssertionError(f"the chaos epoch differs from the fault-free one ({len(got)} vs {len(reference)} "
                             f"batches; kills after batches/parts {report.kills})")
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("partition")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args(argv)
    print(run_chaos(a.partition, a.kills, seed=a.seed, batch_size=a.batch_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
