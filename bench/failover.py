"""Replicated parts under faults (issue 37's targets): ``graphfeed bench failover``.

Starts every part of ``--graph`` on ``--replicas`` daemons each (loopback, port 0, ``warm_workers`` 1) and
``--ranks`` trainer processes -- the ranks of a data-parallel job, each reading its share of every epoch
(``rank=``/``world_size=``) -- then, while they read, fails the servers one fault after another, ``--every`` s
apart:

* ``--mode kill``: ``--kills`` times ``kill -9`` of a replica in use (the parts in turn, and the ranks in turn:
  the replica that rank uses for that part; its daemon and session workers), started again on its port
  ``--restart-after`` s later; the next kill waits for it, so a part always has a replica to move to;
* ``--mode rolling``: a rolling restart of every daemon in turn -- SIGTERM (a drain), its exit, the new one on the
  same port SERVING.

Each rank reads at least ``--epochs`` epochs and on until the faults are over, then reads the same epochs again
with a second loader of the same arguments, without faults, and compares them batch by batch (sampled ids,
edges, seeds).  Prints one JSON line: the batches read, those that differed or were missing
(``failed_batches``: the target is 0), whether every seed came exactly once, the failovers and group
re-formations, and the wait for a batch over all ranks: its median, p99 and the longest (``longest_wait_s``; the
target is <= 2 s), against the longest wait of the fault-free reading.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from graphfeed.testing.cluster import ServerProcess, running_cluster, start_server

MODES = ("kill", "rolling")
MAX_EPOCHS = 1000      # epochs a rank reads at most while the faults go on
READY_TIMEOUT = 300.0  # s for every rank to connect and read its warm-up epoch
RESULT_TIMEOUT = 900.0  # s for a rank to finish once the faults are over


@dataclass(frozen=True)
class FailoverBenchConfig:
    graph: str
    mode: str = "kill"
    replicas: int = 2
    ranks: int = 1
    kills: int = 20
    every: float = 3.0            # s between faults (after the previous victim is back)
    epochs: int = 2               # epochs each rank reads at least
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
        if self.kills < 1 or self.epochs < 1 or self.ranks < 1:
            raise ValueError("--kills, --epochs and --ranks must be at least 1")


# ---- a rank: its own process -----------------------------------------------------------------------------

def _signature(batch) -> tuple:
    return (hash(batch.n_id.numpy().tobytes()), hash(batch.edge_index.numpy().tobytes()), int(batch.batch_size))


def _epoch(loader, on_batch) -> tuple[list, list[float]]:
    """Read one epoch; ``(signatures, waits)``; ``on_batch()`` after each batch."""
    sigs, waits = [], []
    last = time.monotonic()
    for batch in loader:
        waits.append(time.monotonic() - last)
        sigs.append(_signature(batch))
        del batch
        on_batch()
        last = time.monotonic()
    return sigs, waits


def _say(*words) -> None:
    print(*words, flush=True)


def run_rank(cfg: FailoverBenchConfig, rank: int, servers: list[str], stop_file: str) -> dict:
    """One rank: prints ``ready`` and ``uses ADDRESS...`` (its server per part, again after each re-formation),
    reads epochs until ``stop_file`` exists (and at least ``cfg.epochs``), then the reference; its figures."""
    import graphfeed.client as gf

    args = dict(batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed, prefetch=cfg.prefetch,
                rank=rank, world_size=cfg.ranks)
    with gf.connect(servers, timeout=120, reconnect_timeout=120) as client:
        warm = client.neighbor_loader(cfg.input, list(cfg.num_neighbors), **args)
        _epoch(warm, lambda: None)   # workers, caches, the shared-memory rings grown
        warm.close()
        loader = client.neighbor_loader(cfg.input, list(cfg.num_neighbors), **args)
        seen = [-1]

        def on_batch() -> None:
            time.sleep(cfg.step_ms / 1e3)
            if client.reconnects != seen[0]:
                seen[0] = client.reconnects
                _say("uses", *[s.address for s in client.servers])
                print(f"rank {rank}: re-form {client.reconnects}, rss {_rss_mb():.0f} MB", file=sys.stderr, flush=True)

        on_batch()
        _say("ready")
        got_sigs: list[list] = []
        waits: list[float] = []
        while len(got_sigs) < cfg.epochs or (not os.path.exists(stop_file) and len(got_sigs) < MAX_EPOCHS):
            sigs, got = _epoch(loader, on_batch)
            got_sigs.append(sigs)
            waits += got[1:]   # the first batch of an epoch waits for the epoch's start, faults or not
        failovers, reconnects = client.replicas.failovers, client.reconnects
        clean = client.neighbor_loader(cfg.input, list(cfg.num_neighbors), **args)   # the same epochs, no faults
        clean_waits: list[float] = []
        differ, same = 0, True
        for sigs in got_sigs:
            want, got = _epoch(clean, lambda: None)
            clean_waits += got[1:]
            differ += sum(a != b for a, b in zip(sigs, want)) + abs(len(want) - len(sigs))
            same &= sigs == want   # the same batches in order: every seed of the rank's share once
    return {"rank": rank, "epochs": len(got_sigs), "batches_per_epoch": len(got_sigs[0]),
            "batches": sum(len(s) for s in got_sigs), "failed_batches": differ, "seeds_once": same,
            "failovers": failovers, "reconnects": reconnects, "waits": [round(w, 4) for w in waits],
            "longest_wait_no_faults_s": round(max(clean_waits, default=0.0), 3), "max_rss_mb": round(_max_rss_mb())}


def _rss_mb() -> float:
    """This process's resident memory now, MB (anonymous and file pages; /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _max_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


# ---- the faults ------------------------------------------------------------------------------------------

class _Ranks:
    """The rank processes, the servers each uses (from their ``uses`` lines) and their results."""

    def __init__(self, cfg: FailoverBenchConfig, servers: list[str], work: Path):
        self.stop_file = str(work / "stop")
        self.uses: dict[int, list[str]] = {}
        self.results: dict[int, dict] = {}
        self.lines: dict[int, list[str]] = {r: [] for r in range(cfg.ranks)}
        self.ready: set[int] = set()
        self._cond = threading.Condition()
        self.procs: list[subprocess.Popen] = []
        self._logs = []
        self._readers = []
        for rank in range(cfg.ranks):
            argv = [sys.executable, "-m", "graphfeed.bench.failover", "--rank", str(rank), "--servers-of-rank",
                    ",".join(servers), "--stop-file", self.stop_file, "--config", json.dumps(dataclasses.asdict(cfg))]
            self._logs.append(open(work / f"rank{rank}.log", "w"))   # its warnings: the failovers it saw
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._logs[-1], text=True)
            self.procs.append(proc)
            reader = threading.Thread(target=self._read, args=(rank, proc), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _read(self, rank: int, proc) -> None:
        for line in proc.stdout:
            words = line.split()
            with self._cond:
                self.lines[rank] = (self.lines[rank] + [line.strip()])[-5:]
                if words[:1] == ["uses"]:
                    self.uses[rank] = words[1:]
                elif words[:1] == ["ready"]:
                    self.ready.add(rank)
                elif line.startswith("{"):
                    self.results[rank] = json.loads(line)
                self._cond.notify_all()

    def wait(self, what: str, done, timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: done() or any(p.poll() not in (None, 0) for p in self.procs),
                                       timeout):
                raise RuntimeError(f"the ranks did not {what} within {timeout:g} s: {self.lines}")
            failed = {r: p.returncode for r, p in enumerate(self.procs) if p.poll() not in (None, 0)}
            if failed:
                raise RuntimeError(f"rank(s) {sorted(failed)} exited {sorted(failed.values())} before they "
                                   f"{what}; their last lines: {self.lines}")

    def in_use(self, rank: int, part: int) -> str:
        with self._cond:
            return self.uses[rank][part]

    def finish(self) -> list[dict]:
        Path(self.stop_file).touch()
        self.wait("finish", lambda: len(self.results) == len(self.procs), RESULT_TIMEOUT)
        for p in self.procs:
            p.wait(60)
        return [self.results[r] for r in sorted(self.results)]

    def kill(self) -> None:
        """Kill the ranks still running and close their pipes and logs."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        for reader in self._readers:
            reader.join(10)
        for p in self.procs:
            p.stdout.close()   # type: ignore[union-attr]
        for log in self._logs:
            log.close()


class _Faults:
    def __init__(self, cfg: FailoverBenchConfig, servers: list[ServerProcess], log_dir: Path):
        self.cfg, self.servers, self.log_dir = cfg, servers, log_dir
        self.count = 0
        self.errors: list[str] = []

    def _restart(self, victim: ServerProcess, delay: float) -> None:
        time.sleep(delay)
        back = start_server(self.cfg.graph, victim.part, log_dir=self.log_dir / f"back-{self.count}",
                            args=("--port", str(victim.port)), env=_env(self.cfg))
        self.servers[self.servers.index(victim)] = back

    def kill(self, address: str) -> None:
        """kill -9 of the daemon at ``address`` (and its workers); back on its port ``restart_after`` s later."""
        victim = next(s for s in self.servers if s.address == address)
        victim.expect_exit = -signal.SIGKILL
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(30)
        victim.checked = True
        self.count += 1
        self._restart(victim, self.cfg.restart_after)

    def roll(self, index: int) -> None:
        """Restart daemon ``index``: SIGTERM (a drain), its exit, the new one on the same port."""
        victim = self.servers[index]
        victim.signal(signal.SIGTERM)
        code = victim.wait(120)
        victim.checked = True
        if code != 0:
            self.errors.append(f"{victim.address} exited {code} on SIGTERM")
        self.count += 1
        self._restart(victim, 0.0)


def _env(cfg: FailoverBenchConfig) -> dict[str, str]:
    return {"GRAPHFEED_WARM_WORKERS": str(cfg.warm_workers)}


def bench_failover(cfg: FailoverBenchConfig) -> dict:
    from graphfeed.server.partition.format.layout import read_meta

    parts = read_meta(cfg.graph).num_parts
    work = Path(tempfile.mkdtemp(prefix="graphfeed-failover-"))
    began = time.monotonic()
    with running_cluster(cfg.graph, [p for p in range(parts) for _ in range(cfg.replicas)], log_dir=work,
                         env=_env(cfg)) as servers:
        faults = _Faults(cfg, servers, work)
        ranks = _Ranks(cfg, [s.address for s in servers], work)
        try:
            ranks.wait("start", lambda: len(ranks.ready) == cfg.ranks, READY_TIMEOUT)
            count = cfg.kills if cfg.mode == "kill" else len(servers)
            for k in range(count):
                time.sleep(cfg.every)
                if cfg.mode == "kill":   # the replica rank k % ranks uses for part k % parts
                    faults.kill(ranks.in_use(k % cfg.ranks, k % parts))
                else:
                    faults.roll(k)
            results = ranks.finish()
        finally:
            ranks.kill()
    waits = sorted(w for r in results for w in r["waits"])
    return {
        "mode": cfg.mode, "graph": str(cfg.graph), "parts": parts, "replicas": cfg.replicas, "ranks": cfg.ranks,
        "faults": faults.count, "batches_per_epoch": results[0]["batches_per_epoch"],
        "epochs": min(r["epochs"] for r in results), "batches": sum(r["batches"] for r in results),
        "failed_batches": sum(r["failed_batches"] for r in results),
        "seeds_once": all(r["seeds_once"] for r in results),
        "failovers": sum(r["failovers"] for r in results), "reconnects": sum(r["reconnects"] for r in results),
        "wait_median_s": round(statistics.median(waits), 4),
        "wait_p99_s": round(waits[min(len(waits) - 1, int(0.99 * len(waits)))], 3),
        "longest_wait_s": round(waits[-1], 3),
        "longest_wait_no_faults_s": max(r["longest_wait_no_faults_s"] for r in results),
        "rank_max_rss_mb": max(r["max_rss_mb"] for r in results),
        "errors": faults.errors, "seconds": round(time.monotonic() - began, 1),
    }


def add_arguments(p) -> None:
    p.add_argument("--graph", required=True, help="partition folder (from `graphfeed partition`)")
    p.add_argument("--mode", default="kill", choices=MODES,
                   help="kill: kill -9 of a replica in use, --kills times; rolling: every daemon restarted once "
                        "(SIGTERM, then the new one) while the ranks read (default kill)")
    p.add_argument("--replicas", type=int, default=2, help="daemons per part (default 2)")
    p.add_argument("--ranks", type=int, default=1, help="trainer processes, each a rank's share (default 1)")
    p.add_argument("--kills", type=int, default=20, help="--mode kill: how many (default 20)")
    p.add_argument("--every", type=float, default=3.0,
                   help="seconds between faults, after the previous victim is back (default 3)")
    p.add_argument("--epochs", type=int, default=2, help="epochs each rank reads at least (default 2)")
    p.add_argument("--restart-after", type=float, default=1.0,
                   help="--mode kill: seconds a killed daemon stays down (default 1)")
    p.add_argument("--num-neighbors", default="15,10,5", help="per-hop fanouts (default 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    p.add_argument("--input", default="train", help="input nodes: train, val, test or all (default train)")
    p.add_argument("--prefetch", type=int, default=4, help="pulls in flight per server (default 4)")
    p.add_argument("--seed", type=int, default=0, help="shuffling and sampling seed (default 0)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="a simulated training step per batch, a sleep (default 0); the waits are measured around it")
    p.add_argument("--warm-workers", type=int, default=1,
                   help="each daemon's warm_workers: session workers started ahead (default 1; a failover of "
                        "every rank at once takes one per rank)")


def config_of(args) -> FailoverBenchConfig:
    return FailoverBenchConfig(graph=args.graph, mode=args.mode, replicas=args.replicas, ranks=args.ranks,
                               kills=args.kills, every=args.every, epochs=args.epochs,
                               restart_after=args.restart_after,
                               num_neighbors=tuple(int(v) for v in args.num_neighbors.split(",")),
                               batch_size=args.batch_size, input=args.input, prefetch=args.prefetch, seed=args.seed,
                               step_ms=args.step_ms, warm_workers=args.warm_workers)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)   # a rank process of the bench
    p.add_argument("--servers-of-rank", default="", help=argparse.SUPPRESS)
    p.add_argument("--stop-file", default="", help=argparse.SUPPRESS)
    p.add_argument("--config", default="", help=argparse.SUPPRESS)
    if "--rank" in (argv if argv is not None else sys.argv[1:]):
        args = p.parse_args(argv)
        fields = json.loads(args.config)
        cfg = FailoverBenchConfig(**dict(fields, num_neighbors=tuple(fields["num_neighbors"])))
        _say(json.dumps(run_rank(cfg, args.rank, args.servers_of_rank.split(","), args.stop_file)))
        return 0
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
