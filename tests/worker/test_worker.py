"""Session worker: BatchBuffer bounds, the worker process behind its handle, pulls over torch RPC."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from helpers.graphs import synthetic_parts

from graphfeed.core.batch import to_pyg
from graphfeed.core.compact import unpack
from graphfeed.core.spec import LoaderSpec, NodeInput, SamplingSpec
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.worker.buffer import BatchBuffer
from graphfeed.server.worker.commands import (
    BadRequest,
    CloseSession,
    EpochStarted,
    GroupSpec,
    NotFound,
    OpenSession,
    SessionClosed,
    StartEpoch,
    Stats,
    Stop,
    WorkerError,
    WorkerGone,
    execute,
)
from graphfeed.server.worker.handle import SessionWorkerHandle
from graphfeed.server.worker.process import EXIT_JOIN_FAILED
from graphfeed.transport import rpc_group


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
                     partition_root=str(root), group_key=KEY, **kw)


LOADER = LoaderSpec(SamplingSpec((5, 3)), NodeInput(split="train"), batch_size=64, shuffle=True, seed=3)
SECRET = b"k" * 32
KEY = b"g" * 32
PULL = rpc_group.remote("pull", KEY)


def test_worker_serves_the_local_loaders_batches(one_part):
    import torch.distributed.rpc as rpc

    port = _port()
    handle = SessionWorkerHandle.start(_spec(one_part, port, join_timeout=60, buffer_batches=2))
    try:
        assert handle.alive() and handle.exitcode() is None
        n_local = handle.call(OpenSession("s1", SECRET, LOADER)).local_input_nodes
        assert n_local == 240  # 8% of 3000 nodes are training nodes, all on the one part
        with pytest.raises(NotFound):
            handle.call(CloseSession("nope"))
        with pytest.raises(BadRequest, match="node ids out of range"):
            handle.call(OpenSession("s2", SECRET, LoaderSpec(SamplingSpec((5,)), NodeInput(ids=[1, 5000]))))
        with pytest.raises(BadRequest, match="already open"):
            handle.call(OpenSession("s1", SECRET, LOADER))

        rpc_group.join_group(rpc_group.TRAINER, 0, 2, f"127.0.0.1:{port}", rpc_timeout=30, join_timeout=60,
                            data_address="127.0.0.1")
        try:
            with pytest.raises(BadRequest, match="disagree"):
                handle.call(StartEpoch("s1", 0, (7,)))
            assert handle.call(StartEpoch("s1", 0, (n_local,))) == EpochStarted(4)
            futs = [rpc.rpc_async("part0", PULL, args=("s1", 0, seq, SECRET)) for seq in range(4)]
            got = [to_pyg(unpack(f.wait())) for f in futs]   # pulls answer in the compact wire form
            want = list(LocalNeighborLoader(one_part, [5, 3], batch_size=64, shuffle=True, seed=3))
            for a, b in zip(got, want, strict=True):
                for key in ("x", "y", "edge_index", "n_id", "e_id"):
                    assert torch.equal(a[key], b[key]), key
                assert (a.batch_size, a.seq, a.epoch) == (b.batch_size, b.seq, 0)
            with pytest.raises(ValueError, match="already requested"):  # the remote type is kept
                rpc.rpc_sync("part0", PULL, args=("s1", 0, 1, SECRET))
            with pytest.raises(ValueError, match="epoch 5 is not being served"):
                rpc.rpc_sync("part0", PULL, args=("s1", 5, 0, SECRET))
            with pytest.raises(Exception, match="not callable on a graphfeed session worker"):
                rpc.rpc_sync("part0", os.getpid)
            # every call names the group key: a wrong or missing key is refused
            for wrong in (b"", b"x" * 32):
                with pytest.raises(Exception, match="does not carry this worker's trainer group key"):
                    rpc.rpc_sync("part0", rpc_group.remote("gather", wrong), args=("_N", torch.arange(3)))
            [row] = handle.call(Stats()).rows
            assert (row.counts.batches_served, row.counts.buffered_batches, row.epoch) == (4, 0, 0)
            assert handle.call(CloseSession("s1")) == SessionClosed()
        finally:
            rpc.shutdown(graceful=False)
    finally:
        code = handle.stop(grace=10)
    assert code == 0


# ---- the command dispatcher: errors are classified where they happen -------------------------------

class _Worker:
    """A worker whose ``stats`` raises what it is given (the dispatcher's view of a SessionWorker)."""

    def __init__(self, error: Exception | None = None, reply=None):
        self.error, self.reply = error, reply

    def stats(self, cmd):
        if self.error is not None:
            raise self.error
        return self.reply


def test_dispatcher_keeps_bad_requests_and_makes_other_errors_internal():
    refused = execute(_Worker(BadRequest("batch 9 does not exist")), Stats())
    assert type(refused) is BadRequest and str(refused) == "batch 9 does not exist"
    # a ValueError that is not the request's fault (torch, a bug) must not read as INVALID_ARGUMENT
    failed = execute(_Worker(ValueError("shape mismatch")), Stats())
    assert type(failed) is WorkerError
    assert str(failed) == "Stats failed inside the worker: ValueError: shape mismatch"
    wrong = execute(_Worker(reply={"rows": []}), Stats())
    assert type(wrong) is WorkerError and "answered dict, not SessionRows" in str(wrong)
    unknown = execute(_Worker(), Stop())  # no stop method: an internal failure, not a crash
    assert type(unknown) is WorkerError and "AttributeError" in str(unknown)


def test_dispatcher_sends_only_protocol_error_classes():
    from graphfeed.server.worker.process import SessionNotFound

    err = execute(_Worker(SessionNotFound("unknown session 's9'")), Stats())
    assert type(err) is NotFound and str(err) == "unknown session 's9'"


def test_worker_exits_when_the_daemon_goes_away(one_part):
    handle = SessionWorkerHandle.start(_spec(one_part, _port(), join_timeout=60))
    handle._conn.close()  # what the kernel does when the daemon dies
    assert handle.proc.wait(30) == 0
    with pytest.raises(WorkerGone):
        handle.call(Stats(), timeout=5)


def test_worker_without_trainer_gives_up_joining(one_part):
    handle = SessionWorkerHandle.start(_spec(one_part, _port(), join_timeout=2))
    try:
        assert handle.proc.wait(60) == EXIT_JOIN_FAILED
    finally:
        handle.stop(grace=1)
    with pytest.raises(WorkerGone, match=f"worker pid {handle.pid} was stopped \\(exit code {EXIT_JOIN_FAILED}\\)"):
        handle.call(Stats(), timeout=5)


def test_worker_killed_is_reported_as_gone(one_part):
    handle = SessionWorkerHandle.start(_spec(one_part, _port(), join_timeout=60))
    os.kill(handle.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerGone, match="SIGKILL|died"):
        handle.call(Stats(), timeout=20)
    assert time.monotonic() - t0 < 10
    assert handle.stop(grace=1) == -signal.SIGKILL
