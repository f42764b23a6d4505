"""Which pull failures count as a lost server (the client resumes) rather than a refused request (it fails)."""
from __future__ import annotations

from graphfeed.client.client import _lost_connection


def _chain(*texts: str) -> BaseException:
    exc: BaseException | None = None
    for text in reversed(texts):
        outer = RuntimeError(text)
        outer.__cause__ = exc
        exc = outer
    assert exc is not None
    return exc


def test_a_peer_process_gone_mid_call_is_a_lost_connection():
    # seen when a garbage-killed worker's peer was read through TensorPipe's CMA channel (test_hardening)
    cma = ("producing batch 12 (epoch 0) on part 0 failed: PeerError: one_hop on peer worker part1 failed: "
           "process_vm_readv: No such process (this error originated at tensorpipe/channel/cma/context_impl.cc:60)")
    assert _lost_connection(_chain("batch 6 of epoch 0 failed", cma))
    assert _lost_connection(_chain("EPIPE: broken pipe"))


def test_a_refused_request_is_not_a_lost_connection():
    assert not _lost_connection(_chain("producing batch 3 failed: the batch has 9 GB, over max_batch_bytes (EOF)"))
    assert not _lost_connection(_chain("num_neighbors must be positive"))
    assert not _lost_connection(None)
