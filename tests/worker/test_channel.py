"""The transport seam: Pending (the neutral pending batch), the buffer's pulls through it, the
torch RPC edges (worker: rpc_api's adaptation to a torch future; trainer: TorchRpcChannel's
settling of the RPC future).  TorchRpcChannel end to end: tests/worker/test_worker.py,
tests/client/test_client_remote.py, tests/daemon/test_security.py."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed.rpc.internal as rpc_internal

from graphfeed.core.compact import pack
from graphfeed.server.worker import rpc_api
from graphfeed.server.worker.buffer import BatchBuffer
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.channel import BatchChannel, CallsChannel, ChannelClosed
from graphfeed.transport.pending import Pending
from graphfeed.transport.torch_rpc import TorchRpcChannel, settle


def _batch(n: int) -> dict[str, torch.Tensor]:
    return {"x": torch.arange(n)}


# ---- Pending --------------------------------------------------------------------------------------

def test_pending_value_and_callbacks_before_and_after_completion():
    pending, seen = Pending(), []
    pending.add_done_callback(lambda p: seen.append(("early", p.result())))
    assert not pending.done() and not pending.wait_done(0.01)
    pending.set_result(7)
    pending.add_done_callback(lambda p: seen.append(("late", p.result())))
    assert pending.done() and pending.wait_done(0) and pending.result() == pending.wait() == 7
    assert seen == [("early", 7), ("late", 7)]


def test_pending_error_is_raised_and_a_result_is_set_once():
    pending = Pending.failed(ValueError("broken batch"))
    with pytest.raises(ValueError, match="broken batch"):
        pending.result()
    with pytest.raises(RuntimeError, match="set exactly once"):
        pending.set_result(1)
    with pytest.raises(RuntimeError, match="set exactly once"):
        Pending.completed(1).set_exception(ValueError("late"))
    with pytest.raises(TypeError, match="takes an exception"):
        Pending().set_exception("not an exception")  # type: ignore[arg-type]


def test_pending_result_times_out_and_a_failing_callback_does_not_stop_the_others():
    pending, seen = Pending(), []
    with pytest.raises(TimeoutError, match="0.01 s"):
        pending.result(timeout=0.01)
    pending.add_done_callback(lambda p: 1 / 0)
    pending.add_done_callback(lambda p: seen.append(p.result()))
    pending.set_result("ok")  # the ZeroDivisionError is logged, not raised into the completing thread
    assert seen == ["ok"]


def test_pending_wakes_a_waiter_in_another_thread():
    pending = Pending()
    threading.Timer(0.05, pending.set_result, args=("late",)).start()
    assert pending.result(timeout=10) == "late"


def test_pending_then_maps_the_value_once_and_passes_errors_on():
    pending = Pending()
    doubled = pending.then(lambda v: v * 2)
    assert not doubled.done()
    pending.set_result(21)
    assert doubled.result(0) == 42 and Pending.completed(1).then(str).result(0) == "1"
    with pytest.raises(PermissionError, match="wrong session secret"):
        Pending.failed(PermissionError("wrong session secret")).then(lambda v: v).result(0)
    with pytest.raises(ZeroDivisionError):   # the function's own error, to whoever waits
        Pending.completed(0).then(lambda v: 1 / v).result(0)


class _Answers(DataCalls):
    """DataCalls answering every call with the worker's side of it: ``rpc_api``'s compact form of a batch."""

    kind = "fake"

    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def call(self, part, name, args, timeout):
        return Pending.completed(pack(self.batch))


def test_calls_channel_unpacks_pulls_and_samples_as_they_arrive():
    ei = torch.stack([torch.arange(40) % 7, torch.arange(40) // 4])
    batch = {"edge_index@_N__to___N": ei, "n_id@_N": torch.arange(40) * 3, "x@_N": torch.randn(40, 2)}
    channel = CallsChannel(_Answers(batch), rpc_timeout=5)
    pulled, sampled = channel.request(0, "s", b"k", 0, 0), channel.sample(0, "s", b"k", torch.arange(3), 0)
    for got in (pulled.result(0), sampled.result(0)):
        assert list(got) == list(batch)
        assert all(got[k].dtype == batch[k].dtype and torch.equal(got[k], batch[k]) for k in batch)


# ---- BatchBuffer's pulls --------------------------------------------------------------------------

def test_take_of_a_ready_batch_is_complete_at_once():
    buf = BatchBuffer(max_batches=2, max_bytes=1 << 20)
    assert buf.reserve(0)
    buf.put(0, _batch(4))
    pending = buf.take(0)
    assert isinstance(pending, Pending) and pending.done()
    assert torch.equal(pending.result()["x"], torch.arange(4))


def test_take_before_put_completes_in_the_putting_thread_outside_the_lock():
    buf = BatchBuffer(max_batches=2, max_bytes=1 << 20)
    pending, seen = buf.take(1), []
    assert not pending.done()

    def on_done(p: Pending) -> None:  # runs in put(): the buffer must be usable here (lock released)
        seen.append((threading.current_thread().name, buf.stats.served, buf.reserve(0)))

    pending.add_done_callback(on_done)
    assert buf.reserve(0)
    producer = threading.Thread(target=buf.put, args=(1, _batch(3)), name="producer")
    producer.start()
    producer.join(10)
    assert torch.equal(pending.result(timeout=10)["x"], torch.arange(3))
    assert seen == [("producer", 1, True)]


def test_close_fails_waiting_and_later_pulls_with_the_error():
    buf = BatchBuffer(max_batches=4, max_bytes=1 << 20)
    waiting = buf.take(2)
    buf.close(RuntimeError("producer failed on part 0"))
    with pytest.raises(RuntimeError, match="producer failed on part 0"):
        waiting.result(timeout=10)
    later = buf.take(3)
    assert later.done()
    with pytest.raises(RuntimeError, match="producer failed on part 0"):
        later.result()


def test_a_second_take_of_a_batch_is_refused():
    buf = BatchBuffer(max_batches=2, max_bytes=1 << 20)
    buf.take(0)
    with pytest.raises(ValueError, match="already requested"):
        buf.take(0)
    assert buf.reserve(0)
    buf.put(0, _batch(1))
    with pytest.raises(ValueError, match="already requested"):
        buf.take(0)


# ---- the torch RPC edges --------------------------------------------------------------------------

def test_rpc_api_adapts_a_pending_batch_to_a_torch_future():
    pending = Pending()
    fut = rpc_api._as_remote_errors(pending)
    assert isinstance(fut, torch.futures.Future) and not fut.done()
    pending.set_result(_batch(2))
    assert torch.equal(fut.wait()["x"], torch.arange(2))


def test_rpc_api_forwards_a_pending_error_as_a_remote_exception(monkeypatch):
    monkeypatch.setattr(rpc_api.rpc, "is_available", lambda: False)  # no RPC group in this process
    fut = rpc_api._as_remote_errors(Pending.failed(PermissionError("wrong session secret")))
    value = fut.wait()
    assert isinstance(value, rpc_internal.RemoteException)
    assert value.exception_type is PermissionError and "On worker: PermissionError" in value.msg


def test_torch_rpc_channel_settles_values_errors_and_errors_sent_as_values():
    for outcome, check in [
        (lambda f: f.set_result(_batch(2)), lambda p: torch.equal(p.result()["x"], torch.arange(2))),
        (lambda f: f.set_exception(RuntimeError("RPC timed out")), None),
        (lambda f: f.set_result(RuntimeError("RPC timed out")), None),  # older workers
    ]:
        fut, pending = torch.futures.Future(), Pending()
        fut.add_done_callback(lambda f, p=pending: settle(p, f))
        outcome(fut)
        assert pending.done()
        if check is not None:
            assert check(pending)
        else:
            with pytest.raises(RuntimeError, match="RPC timed out"):
                pending.result()


def test_a_closed_channel_refuses_requests():
    channel = TorchRpcChannel(rpc_timeout=5.0)
    assert isinstance(channel, BatchChannel) and channel.kind == "torch-rpc"
    channel.close()
    channel.close()  # idempotent
    with pytest.raises(ChannelClosed, match="connect a new client"):
        channel.request(0, "session", b"secret", 0, 0)
