"""Session worker: BatchBuffer bounds, the worker process behind its handle, pulls over torch RPC."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
import torch

from graphfeed.transport import rpc_group
from graphfeed.core.batch import to_pyg
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.worker.buffer import BatchBuffer
from graphfeed.server.worker.handle import GroupSpec, SessionWorkerHandle, WorkerError, WorkerGone
from graphfeed.server.worker.process import EXIT_JOIN_FAILED

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers_graphs import synthetic_parts  # noqa: E402


def _batch(nbytes: int) -> dict[str, torch.Tensor]:
    return {"x": torch.zeros(nbytes, dtype=torch.uint8)}


# ---- BatchBuffer ----------------------------------------------------------------------------------

def test_buffer_bounds_batches_and_frees_slots_on_take():
    buf = BatchBuffer(max_batches=2, max_bytes=1 << 20)
    assert buf.reserve(0.1) and buf.reserve(0.1)
    assert not buf.reserve(0.05), "a third slot must not be granted"
    buf.put(0, _batch(10))
    buf.put(1, _batch(20))
    assert (buf.stats.buffered_batches, buf.stats.buffered_bytes) == (2, 30)
    assert buf.take(0).wait()["x"].numel() == 10
    assert buf.reserve(0.1), "taking a batch frees its slot"
    assert (buf.stats.served, buf.stats.bytes_served, buf.stats.buffered_bytes) == (1, 10, 20)


def test_buffer_bounds_bytes_but_lets_one_big_batch_through():
    buf = BatchBuffer(max_batches=8, max_bytes=100)
    assert buf.reserve(0.1)
    buf.put(0, _batch(500))               # bigger than the cap: still accepted when the buffer is empty
    assert not buf.reserve(0.05), "over the byte cap: no new batch may start"
    buf.take(0).wait()
    assert buf.reserve(0.1)


def test_buffer_take_before_put_completes_later_and_errors_reach_futures():
    buf = BatchBuffer(max_batches=4, max_bytes=1 << 20)
    fut = buf.take(3)
    assert not fut.done()
    assert buf.reserve(0.1)
    threading.Timer(0.05, buf.put, args=(3, _batch(7))).start()
    assert fut.wait()["x"].numel() == 7
    with pytest.raises(ValueError, match="already requested"):
        buf.take(3)
    waiting = buf.take(5)
    buf.close(RuntimeError("producer exploded"))
    with pytest.raises(RuntimeError, match="producer exploded"):
        waiting.wait()
    with pytest.raises(RuntimeError, match="producer exploded"):
        buf.take(6).wait()
    assert not buf.reserve(0.05), "a closed buffer releases producers"


# ---- the worker process ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_part(tmp_path_factory):
    return synthetic_parts(tmp_path_factory.mktemp("worker") / "parts", nodes=3000, avg_degree=8, features=16,
                           classes=4, parts=1, name="worker-test")


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spec(root, port, **kw) -> GroupSpec:
    return GroupSpec(group_id="g-test", rendezvous=f"127.0.0.1:{port}", world_size=2, rank=1, part_id=0,
                     partition_root=str(root), **kw)


SESSION = dict(spec=SamplingSpec((5, 3)), split="train", node_ids=None, batch_size=64, shuffle=True,
               drop_last=False, seed=3, rank=0, world_size=1, kind="train", session_secret=b"k" * 32)
SECRET = SESSION["session_secret"]


def test_worker_serves_the_local_loaders_batches(one_part):
    import torch.distributed.rpc as rpc

    port = _port()
    handle = SessionWorkerHandle.start(_spec(one_part, port, join_timeout=60, buffer_batches=2))
    try:
        assert handle.alive() and handle.exitcode() is None
        n_local = handle.call("open_session", session_id="s1", **SESSION)
        assert n_local == 240  # 8% of 3000 nodes are training nodes, all on the one part
        with pytest.raises(WorkerError) as err:
            handle.call("close_session", session_id="nope")
        assert err.value.kind == "not_found"
        with pytest.raises(WorkerError) as err:
            handle.call("open_session", session_id="s2", **{**SESSION, "split": "bogus"})
        assert err.value.kind == "invalid" and "unknown split" in str(err.value)

        rpc_group.join_group(rpc_group.TRAINER, 0, 2, f"127.0.0.1:{port}", rpc_timeout=30, join_timeout=60,
                            data_address="127.0.0.1")
        try:
            with pytest.raises(WorkerError, match="disagree") as err:
                handle.call("start_epoch", session_id="s1", epoch=0, counts=[7])
            assert err.value.kind == "invalid"
            assert handle.call("start_epoch", session_id="s1", epoch=0, counts=[n_local]) == 4
            futs = [rpc.rpc_async("part0", rpc_group.PULL, args=("s1", 0, seq, SECRET)) for seq in range(4)]
            got = [to_pyg(f.wait()) for f in futs]
            want = list(LocalNeighborLoader(one_part, [5, 3], batch_size=64, shuffle=True, seed=3))
            for a, b in zip(got, want, strict=True):
                for key in ("x", "y", "edge_index", "n_id", "e_id"):
                    assert torch.equal(a[key], b[key]), key
                assert (a.batch_size, a.seq, a.epoch) == (b.batch_size, b.seq, 0)
            with pytest.raises(ValueError, match="already requested"):  # the remote type is kept
                rpc.rpc_sync("part0", rpc_group.PULL, args=("s1", 0, 1, SECRET))
            with pytest.raises(ValueError, match="epoch 5 is not being served"):
                rpc.rpc_sync("part0", rpc_group.PULL, args=("s1", 5, 0, SECRET))
            with pytest.raises(Exception, match="not callable on a graphfeed session worker"):
                rpc.rpc_sync("part0", os.getpid)
            [row] = handle.call("stats")
            assert (row["batches_served"], row["buffered_batches"], row["epoch"]) == (4, 0, 0)
        finally:
            rpc.shutdown(graceful=False)
    finally:
        code = handle.stop(grace=10)
    assert code == 0


def test_worker_exits_when_the_daemon_goes_away(one_part):
    handle = SessionWorkerHandle.start(_spec(one_part, _port(), join_timeout=60))
    handle._conn.close()  # what the kernel does when the daemon dies
    assert handle.proc.wait(30) == 0
    with pytest.raises(WorkerGone):
        handle.call("stats", timeout=5)


def test_worker_without_trainer_gives_up_joining(one_part):
    handle = SessionWorkerHandle.start(_spec(one_part, _port(), join_timeout=2))
    try:
        assert handle.proc.wait(60) == EXIT_JOIN_FAILED
    finally:
        handle.stop(grace=1)
    with pytest.raises(WorkerGone, match=f"worker pid {handle.pid} was stopped \\(exit code {EXIT_JOIN_FAILED}\\)"):
        handle.call("stats", timeout=5)


def test_worker_killed_is_reported_as_gone(one_part):
    handle = SessionWorkerHandle.start(_spec(one_part, _port(), join_timeout=60))
    os.kill(handle.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerGone, match="SIGKILL|died"):
        handle.call("stats", timeout=20)
    assert time.monotonic() - t0 < 10
    assert handle.stop(grace=1) == -signal.SIGKILL
