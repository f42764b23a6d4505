"""Figures of one ``graphfeed partition`` run: wall time, peak RSS of every process, bytes written, edge cut.

Runs the command as a child process and samples its process tree (the partitioner, and with
``--workers`` the Dask scheduler's and workers' processes) every ``--interval`` seconds with psutil:
each process's peak resident set size and its bytes written (``/proc/PID/io`` ``write_bytes``,
which counts what reached the page cache for the disk).  A process's counter also holds the bytes of
every child it has reaped (Linux adds them when it waits for the child), so summing the processes
counted a Dask worker twice, once itself and once in the partitioner that started its cluster
(``--workers``: 2.3 GB instead of 1.1 GB in ``docs/partition-scale.md``).  The total is therefore this
process's own counter after it reaped the partitioner, which then holds every descendant exactly
once; ``written_mb_by_process`` keeps the samples (inclusive).  Prints one JSON line::

    python -m graphfeed.bench.partition_scale --label random2 -- \\
        graphs/products-chunked -p 2 -o parts/products --method random --memory-limit 2GB

Everything after ``--`` is passed to ``graphfeed partition``.  Memory of processes that start and end
between two samples is missed: keep ``--interval`` well below a task's duration.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _tree(root) -> list:
    try:
        return [root, *root.children(recursive=True)]
    except Exception:  # noqa: BLE001 -- the tree changes while we look at it; a missed sample is harmless
        return [root]


def _sample(procs, peaks: dict, written: dict) -> None:
    import psutil

    for p in procs:
        try:
            rss = p.memory_info().rss
            io = p.io_counters().write_bytes
            name = " ".join(p.cmdline()[1:3]) or p.name()
        except (psutil.Error, OSError):
            continue
        key = f"{p.pid} {name}"
        peaks[key] = max(peaks.get(key, 0), rss)
        written[key] = max(written.get(key, 0), io)


def _own_write_bytes() -> int:
    """This process's ``write_bytes``: its own writes and those of every descendant it (and they) reaped."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("write_bytes"))


def measure(cmd: list[str], interval: float) -> dict:
    import psutil

    written_before = _own_write_bytes()
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(child.pid)
    peaks: dict[str, int] = {}
    written: dict[str, int] = {}
    while child.poll() is None:
        _sample(_tree(root), peaks, written)
        time.sleep(interval)
    out, err = child.communicate()
    seconds = time.perf_counter() - t0
    return {"rc": child.returncode, "wall_s": round(seconds, 1), "stdout": out, "stderr_tail": err[-2000:],
            "peak_rss_mb": {k: round(v / 2**20) for k, v in sorted(peaks.items(), key=lambda kv: -kv[1])},
            "written_mb": round((_own_write_bytes() - written_before) / 2**20),
            "written_mb_by_process": {k: round(v / 2**20) for k, v in sorted(written.items(), key=lambda kv: -kv[1])}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("partition_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.partition_args[1:] if args.partition_args[:1] == ["--"] else args.partition_args
    result = measure([sys.executable, "-m", "graphfeed.cli.main", "partition", *rest], args.interval)
    output = rest[rest.index("-o") + 1] if "-o" in rest else rest[rest.index("--output") + 1]
    meta_path = Path(output) / "META.json"
    if result["rc"] == 0 and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        total = sum(meta["num_edges"].values())
        result.update(edge_cut=meta["edge_cut"], edges=total, cut_share=round(meta["edge_cut"] / max(total, 1), 4),
                      output_mb=round(sum(p.stat().st_size for p in Path(output).rglob("*") if p.is_file()) / 2**20))
    result.pop("stdout")
    print(json.dumps({"label": args.label, **result}))
    return 0 if result["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
