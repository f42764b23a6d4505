""""The peer is lost" is one typed error at the data-path seam: each transport turns its own wording into
:class:`PeerLost` naming the part, and keeps every other failure (a refusal, a timeout, a failed proof) as it was."""
from __future__ import annotations

import pickle
import socket

import pytest

from graphfeed.transport.errors import PeerLost, lost_in_text, peer_lost, translated
from graphfeed.transport.pending import Pending
from graphfeed.transport.secure import Function, PartyKeys, SecureCalls, SecureServer, new_group_key
from graphfeed.transport.torch_rpc import TorchRpcCalls, settle


def _chain(*texts: str) -> BaseException:
    exc: BaseException | None = None
    for text in reversed(texts):
        outer = RuntimeError(text)
        outer.__cause__ = exc
        exc = outer
    assert exc is not None
    return exc


def test_the_text_rule_sees_a_peer_gone_anywhere_in_the_chain():
    # seen when a garbage-killed worker's peer was read through TensorPipe's CMA channel (test_hardening)
    cma = ("producing batch 12 (epoch 0) on part 0 failed: PeerError: one_hop on peer worker part1 failed: "
           "process_vm_readv: No such process (this error originated at tensorpipe/channel/cma/context_impl.cc:60)")
    assert lost_in_text(_chain("batch 6 of epoch 0 failed", cma))
    assert lost_in_text(_chain("EPIPE: broken pipe"))
    assert lost_in_text(_chain("On part0: ConnectionError: part 1's worker is lost (the secure data path): reset"))


def test_a_refused_request_is_not_a_lost_peer():
    assert not lost_in_text(_chain("producing batch 3 failed: the batch has 9 GB, over max_batch_bytes (EOF)"))
    assert not lost_in_text(_chain("num_neighbors must be positive"))
    assert not lost_in_text(None)
    # a refusal or a timeout stays what it is, whatever words it holds
    for kept in (ValueError("ids thereof are out of range"), TimeoutError("connection closed? no answer in 5 s")):
        assert translated(1, kept, "torch RPC") is kept


def test_translation_names_the_part_keeps_the_wording_and_the_cause():
    raw = RuntimeError("EOF: connection closed by peer (this error originated at tensorpipe/core/pipe_impl.cc)")
    lost = translated(3, raw, "torch RPC")
    assert isinstance(lost, PeerLost) and isinstance(lost, ConnectionError)
    assert lost.part == 3 and lost.__cause__ is raw and "EOF: connection closed by peer" in lost.wording
    assert str(lost).startswith("part 3's worker is lost (torch RPC): EOF")
    assert translated(3, lost, "torch RPC") is lost
    outer = RuntimeError("StartEpoch failed")
    outer.__cause__ = lost
    assert peer_lost(outer) is lost and peer_lost(RuntimeError("EOF")) is None   # typed, not guessed
    again = pickle.loads(pickle.dumps(lost))
    assert (again.part, again.wording, again.transport) == (3, lost.wording, "torch RPC")


class _Future:
    def __init__(self, error: BaseException | None = None, value=None):
        self.error, self.value = error, value

    def wait(self):
        if self.error is not None:
            raise self.error
        return self.value


def test_torch_rpc_settles_its_lost_peer_as_peer_lost_and_the_rest_as_they_were():
    lost = Pending()
    settle(lost, _Future(RuntimeError("On WorkerInfo(id=2, name=part1): RuntimeError: EOF: end of file")), 1)
    with pytest.raises(PeerLost, match=r"part 1's worker is lost \(torch RPC\)") as caught:
        lost.result(1)
    assert caught.value.part == 1
    refused = Pending()
    settle(refused, _Future(ValueError("node id 9 is outside 0..5")), 1)
    with pytest.raises(ValueError, match="outside"):
        refused.result(1)
    slow = Pending()
    settle(slow, _Future(RuntimeError("RPC ran for more than set timeout (60000 ms) and will now be marked "
                                      "with an error")), 0)
    with pytest.raises(RuntimeError, match="set timeout"):
        slow.result(1)
    assert TorchRpcCalls.label == "torch RPC"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_secure_path_a_worker_gone_mid_call_and_one_not_listening_are_peer_lost():
    key = new_group_key()
    ring = PartyKeys.of_worker(key, 1, 3)   # part 1's worker (the trainer holds the root)
    srv = SecureServer("127.0.0.1", ring, {"echo": Function(lambda *a: a), "later": Function(lambda: Pending(), True)},
                       name="t").start()
    calls = SecureCalls(key, {1: srv.address, 2: f"127.0.0.1:{_free_port()}"})
    try:
        assert calls.call_sync(1, "echo", (7,), 10) == (7,)
        waiting = calls.call(1, "later", (), 30)
        srv.close()   # the worker goes away while the call waits
        with pytest.raises(PeerLost) as mid_call:
            waiting.result(20)
        assert mid_call.value.part == 1 and "was lost" in str(mid_call.value)
        with pytest.raises(PeerLost, match="cannot reach part2's data path") as refused:
            calls.call_sync(2, "echo", (1,), 5)
        assert refused.value.part == 2 and refused.value.transport == "the secure data path"
    finally:
        calls.close()
        srv.close()


def test_secure_path_a_failed_group_proof_is_not_a_lost_peer():
    srv = SecureServer("127.0.0.1", new_group_key(), {"echo": Function(lambda *a: a)}, name="t").start()
    outsider = SecureCalls(new_group_key(), {0: srv.address})
    try:
        with pytest.raises(ConnectionError, match="failed the group proof") as caught:
            outsider.call_sync(0, "echo", (1,), 10)
        assert not isinstance(caught.value, PeerLost)
    finally:
        outsider.close()
        srv.close()
