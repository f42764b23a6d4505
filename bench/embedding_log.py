"""What the embedding update log costs an owner per push (``python -m graphfeed.bench.embedding_log``).

One part's table (``rows`` x ``dim``, float32, SparseAdam) in an :class:`EmbeddingStore`, pushed ``steps``
times with ``batch_rows`` random gradient rows (duplicates merged), with the update log off and on (one
record and one ``fsync`` per push, in ``--dir``: put it on the disk ``embedding_dir`` would be on; a tmpfs
makes the sync free).  Prints one JSON line: median and p90 ms per push of each arm, the log's bytes per push,
and ``overhead`` = on / off - 1 (medians).  The arms alternate push by push, so a busy machine slows both.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from graphfeed.core.embedding import EmbeddingSpec, SparseUpdate
from graphfeed.server.embedding import EmbeddingStore
from graphfeed.server.partition.format.book import RangePartitionBook


def bench_push_log(rows: int = 200_000, dim: int = 128, batch_rows: int = 20_000, steps: int = 30,
                   folder: str | None = None, seed: int = 0) -> dict:
    """Median / p90 ms per push with the log off and on; see the module docstring."""
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        book = RangePartitionBook([0, rows])
        spec = EmbeddingSpec("bench", "n", dim)
        stores = {"off": EmbeddingStore(0, {"n": book}, save_dir=tmp, log_updates=False),
                  "on": EmbeddingStore(0, {"n": book}, save_dir=tmp, log_updates=True)}
        for store in stores.values():
            store.create(spec, "bench")
        update, gen = SparseUpdate("adam", 0.01), torch.Generator().manual_seed(seed)
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(steps):
            ids = torch.randint(0, rows, (batch_rows,), generator=gen)
            grads = torch.randn(batch_rows, dim, generator=gen)
            for arm, store in stores.items():
                began = time.perf_counter()
                store.push("bench", ids, grads, update)
                times[arm].append((time.perf_counter() - began) * 1e3)
        log = stores["on"].table("bench").log
        log_bytes = log.size if log is not None else 0
    out: dict = {"rows": rows, "dim": dim, "batch_rows": batch_rows, "steps": steps,
                 "log_bytes_per_push": round(log_bytes / steps)}
    for arm, ms in times.items():
        out[f"push_ms_{arm}"] = round(statistics.median(ms), 3)
        out[f"push_p90_ms_{arm}"] = round(sorted(ms)[int(0.9 * (len(ms) - 1))], 3)
    out["overhead"] = round(out["push_ms_on"] / out["push_ms_off"] - 1, 3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch-rows", type=int, default=20_000)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--dir", default=None, help="where the log is written (default: the temp folder)")
    args = p.parse_args(argv)
    print(json.dumps(bench_push_log(args.rows, args.dim, args.batch_rows, args.steps, args.dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
