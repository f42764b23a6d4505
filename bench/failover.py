"""Replicated parts under faults (issue 37's targets): ``graphfeed bench failover``.

Starts every part of ``--graph`` on ``--replicas`` daemons each (loopback, port 0, ``warm_workers`` 1), reads
one epoch of the input nodes without faults (the reference), then reads epochs again while the servers fail:

* ``--mode kill``: ``--kills`` times, spread evenly over the faulty epochs, ``kill -9`` of the replica the trainer
  uses for a part (the parts in turn; its daemon and session workers), started again on its port
  ``--restart-after`` s later (so the next kill of that part finds a replica to move to); a kill waits for the
  previous victim to be back;
* ``--mode rolling``: a rolling restart of every daemon in turn -- SIGTERM (a drain), its exit, the new one on the
  same port SERVING -- while the trainer reads; each daemon is restarted once.

The faults run on their own thread, one after another, asked for at evenly spread batches of ``--epochs``
epochs: the trainer keeps reading meanwhile, as a training job would, for more epochs while faults are still
going on.  The reference is then a second loader of the same arguments reading the same epochs without faults.

Every batch is compared with the reference (sampled ids, edges, seeds, as signatures): prints one JSON line with
the batches read, the batches that differed or were missing (``failed_batches``: the target is 0), whether every
seed came exactly once per epoch, the failovers and group re-formations, and the wait for each batch: its median,
p99 and the longest (``longest_wait_s``; the target is <= 2 s), against the longest wait of the fault-free epoch.
One trainer process reads (a DDP job's ranks each fail over the same way, on their own groups).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from graphfeed.testing.cluster import ServerProcess, running_cluster, start_server

MODES = ("kill", "rolling")
MAX_EPOCHS = 1000   # epochs read at most while faults are still going on


@dataclass(frozen=True)
class FailoverBenchConfig:
    graph: str
    mode: str = "kill"
    replicas: int = 2
    kills: int = 20
    epochs: int = 2               # faulty epochs (the kills are spread over them)
    restart_after: float = 1.0    # s a killed daemon stays down
    num_neighbors: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    input: str = "train"
    prefetch: int = 4
    seed: int = 0
    warm_workers: int = 1
    step_ms: float = 0.0          # a simulated training step per batch (a sleep)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.replicas < 2:
            raise ValueError(f"--replicas {self.replicas}: a failover needs at least 2 replicas of each part")
        if self.kills < 1 or self.epochs < 1:
            raise ValueError("--kills and --epochs must be at least 1")


def _signature(batch) -> tuple:
    return (hash(batch.n_id.numpy().tobytes()), hash(batch.edge_index.numpy().tobytes()), int(batch.batch_size))


class _Faults:
    """The faults against a list of servers (replaced in place as daemons come back), done one after another by
    the thread :meth:`start` starts, so the trainer keeps reading while a daemon stops and comes back."""

    def __init__(self, cfg: FailoverBenchConfig, servers: list[ServerProcess], log_dir: Path):
        self.cfg, self.servers, self.log_dir = cfg, servers, log_dir
        self.restarts: list[threading.Thread] = []
        self.errors: list[str] = []
        self.count = 0
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._thread = threading.Thread(target=self._run, name="failover-faults", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, fault, *args) -> None:
        """Do ``fault(*args)`` after the faults asked for before it."""
        with self._lock:
            self._outstanding += 1
        self._queue.put((fault, args))

    def finish(self, timeout: float = 300.0) -> None:
        """Wait for every fault asked for and every restart (RuntimeError past ``timeout``)."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the faults did not finish within {timeout:g} s (logs in {self.log_dir})")
        self.settle()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fault, args = item
            try:
                fault(*args)
            except Exception as exc:  # noqa: BLE001 -- reported in the result
                self.errors.append(f"{fault.__name__}{args[1:]}: {exc}")
            with self._lock:
                self._outstanding -= 1

    def _restart(self, victim: ServerProcess, part: int, delay: float) -> None:
        def run() -> None:
            time.sleep(delay)
            try:
                back = start_server(self.cfg.graph, part, log_dir=self.log_dir / f"back-{self.count}-{part}",
                                    args=("--port", str(victim.port)), env=_env(self.cfg))
            except Exception as exc:  # noqa: BLE001 -- reported in the result, the run goes on without it
                self.errors.append(f"restarting part {part} on port {victim.port} failed: {exc}")
                return
            self.servers[self.servers.index(victim)] = back

        t = threading.Thread(target=run, name=f"failover-restart-{part}", daemon=True)
        t.start()
        self.restarts.append(t)

    def settle(self, timeout: float = 120.0) -> None:
        for t in self.restarts:
            t.join(timeout)
        self.restarts = [t for t in self.restarts if t.is_alive()]
        if self.restarts:
            raise RuntimeError(f"{len(self.restarts)} daemon(s) did not come back within {timeout:g} s "
                               f"(logs in {self.log_dir})")

    def busy(self) -> bool:
        """Faults asked for and not done yet."""
        return self._outstanding > 0

    def kill_in_use(self, client, part: int) -> None:
        """kill -9 of the replica ``client`` uses for ``part``; it comes back after ``restart_after`` s."""
        self.settle()   # the previous victim is back: the part has a replica to move to again
        victim = next(s for s in self.servers if s.address == client.servers[part].address)
        victim.expect_exit = -signal.SIGKILL
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(30)
        victim.checked = True
        self.count += 1
        self._restart(victim, part, self.cfg.restart_after)

    def roll(self, client, index: int) -> None:
        """Restart daemon ``index``: SIGTERM (a drain), its exit, the new one on the same port."""
        victim = self.servers[index]
        part = victim.part
        victim.signal(signal.SIGTERM)
        code = victim.wait(60)
        victim.checked = True
        if code != 0:
            self.errors.append(f"{victim.address} exited {code} on SIGTERM")
        self.count += 1
        self._restart(victim, part, 0.0)
        self.settle()


def _env(cfg: FailoverBenchConfig) -> dict[str, str]:
    return {"GRAPHFEED_WARM_WORKERS": str(cfg.warm_workers)}


def _epoch(loader, on_batch) -> tuple[list, list[float]]:
    """Read one epoch; ``(signatures, waits)``; ``on_batch(i)`` after each batch."""
    sigs, waits = [], []
    last = time.monotonic()
    for i, batch in enumerate(loader):
        waits.append(time.monotonic() - last)
        sigs.append(_signature(batch))
        del batch
        on_batch(i)
        last = time.monotonic()
    return sigs, waits


def bench_failover(cfg: FailoverBenchConfig) -> dict:
    import graphfeed.client as gf
    from graphfeed.server.partition.format.layout import read_meta

    parts = read_meta(cfg.graph).num_parts
    ids = [p for p in range(parts) for _ in range(cfg.replicas)]
    log_dir = Path(tempfile.mkdtemp(prefix="graphfeed-failover-"))
    began = time.monotonic()
    with running_cluster(cfg.graph, ids, log_dir=log_dir, env=_env(cfg)) as servers:
        faults = _Faults(cfg, servers, log_dir)
        args = dict(batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed, prefetch=cfg.prefetch)
        with gf.connect([s.address for s in servers], timeout=120, reconnect_timeout=120) as client:
            warm = client.neighbor_loader(cfg.input, list(cfg.num_neighbors), **args)
            _epoch(warm, lambda i: None)   # workers, caches and the shared-memory rings grown
            warm.close()
            loader = client.neighbor_loader(cfg.input, list(cfg.num_neighbors), **args)
            n = len(loader)
            total = cfg.epochs * n
            count = cfg.kills if cfg.mode == "kill" else len(servers)
            every = max(1, total // (count + 1))   # the faults asked for at evenly spread batches
            points = {every * (k + 1): k % parts if cfg.mode == "kill" else k for k in range(count)}
            got_sigs: list[list] = []
            waits: list[float] = []
            faults.start()
            while len(got_sigs) < cfg.epochs or (faults.busy() and len(got_sigs) < MAX_EPOCHS):
                def on_batch(i: int, base: int = len(got_sigs) * n) -> None:
                    time.sleep(cfg.step_ms / 1e3)
                    what = points.get(base + i)
                    if what is not None:
                        faults.put(faults.kill_in_use if cfg.mode == "kill" else faults.roll, client, what)

                sigs, got = _epoch(loader, on_batch)   # read on while the faults go on
                got_sigs.append(sigs)
                waits += got[1:]   # the first batch of an epoch waits for the epoch's start, faults or not
            faults.finish()
            failovers, reconnects = client.replicas.failovers, client.reconnects
            # the reference: the same epochs of a loader of the same arguments, without faults
            clean = client.neighbor_loader(cfg.input, list(cfg.num_neighbors), **args)
            clean_waits: list[float] = []
            differ = 0
            seeds_once = True
            for sigs in got_sigs:
                want, got = _epoch(clean, lambda i: None)
                clean_waits += got[1:]
                differ += sum(a != b for a, b in zip(sigs, want)) + abs(len(want) - len(sigs))
                seeds_once &= sigs == want   # the same batches in order: every seed once
            read = sum(len(sigs) for sigs in got_sigs)
    waits_sorted = sorted(waits)
    return {
        "mode": cfg.mode, "graph": str(cfg.graph), "parts": parts, "replicas": cfg.replicas,
        "faults": faults.count, "batches_per_epoch": n, "epochs": len(got_sigs), "batches": read,
        "failed_batches": differ, "seeds_once": seeds_once, "failovers": failovers, "reconnects": reconnects,
        "wait_median_s": round(statistics.median(waits), 4),
        "wait_p99_s": round(waits_sorted[min(len(waits) - 1, int(0.99 * len(waits)))], 3),
        "longest_wait_s": round(max(waits), 3), "longest_wait_no_faults_s": round(max(clean_waits), 3),
        "errors": faults.errors, "seconds": round(time.monotonic() - began, 1),
    }


def add_arguments(p) -> None:
    p.add_argument("--graph", required=True, help="partition folder (from `graphfeed partition`)")
    p.add_argument("--mode", default="kill", choices=MODES,
                   help="kill: kill -9 of the replica in use, --kills times; rolling: every daemon restarted once "
                        "(SIGTERM, then the new one) while the trainer reads (default kill)")
    p.add_argument("--replicas", type=int, default=2, help="daemons per part (default 2)")
    p.add_argument("--kills", type=int, default=20, help="--mode kill: kills over the faulty epochs (default 20)")
    p.add_argument("--epochs", type=int, default=2, help="faulty epochs after the reference epoch (default 2)")
    p.add_argument("--restart-after", type=float, default=1.0,
                   help="--mode kill: seconds a killed daemon stays down (default 1)")
    p.add_argument("--num-neighbors", default="15,10,5", help="per-hop fanouts (default 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    p.add_argument("--input", default="train", help="input nodes: train, val, test or all (default train)")
    p.add_argument("--prefetch", type=int, default=4, help="pulls in flight per server (default 4)")
    p.add_argument("--seed", type=int, default=0, help="shuffling and sampling seed (default 0)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="a simulated training step per batch, a sleep (default 0); the waits are measured around it")


def config_of(args) -> FailoverBenchConfig:
    return FailoverBenchConfig(graph=args.graph, mode=args.mode, replicas=args.replicas, kills=args.kills,
                               epochs=args.epochs, restart_after=args.restart_after,
                               num_neighbors=tuple(int(v) for v in args.num_neighbors.split(",")),
                               batch_size=args.batch_size, input=args.input, prefetch=args.prefetch, seed=args.seed,
                               step_ms=args.step_ms)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        result = bench_failover(config_of(args))
    except (RuntimeError, ValueError) as exc:
        print(f"graphfeed bench failover: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
