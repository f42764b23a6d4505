"""Leases while a data group forms: each server's heartbeat starts when that server holds the group.

On a loaded host one server's ``OpenGroup`` (it starts a worker process) can take longer than a short
lease; the servers that answered first must be renewed meanwhile, or they reap the group before it forms
(seen under load: "reaped: lease expired: no Heartbeat for 2 s" during a 2-server connect)."""
from __future__ import annotations

import threading
import time

from graphfeed.client.cluster import CAPABILITY_HEADER, ServerConn
from graphfeed.client.group import DataGroup
from graphfeed.proto import control_pb2 as pb
from graphfeed.transport import rpc_group

LEASE = 0.4           # heartbeat interval = lease / 4, at least 0.2 s
SLOW_OPEN = 1.5       # part 1's OpenGroup: several leases


class _Stub:
    def __init__(self, part: int, log: list, opened: threading.Event):
        self.part, self.log, self.opened = part, log, opened

    def OpenGroup(self, req, timeout, metadata=None):   # noqa: N802 -- named as the gRPC method it stands in for
        assert metadata is None, "OpenGroup carries no capability: it is what returns one"
        if self.part == 1:
            time.sleep(SLOW_OPEN)
            self.opened.set()
        return pb.OpenGroupReply(lease_seconds=LEASE, worker_pid=1000 + self.part,
                                 group_capability=b"cap-%d" % self.part)

    def Heartbeat(self, req, timeout, metadata=None):   # noqa: N802 -- named as the gRPC method it stands in for
        assert metadata == [(CAPABILITY_HEADER, b"cap-%d" % self.part)], metadata   # the group's own capability
        self.log.append((self.part, self.opened.is_set()))
        return pb.HeartbeatReply()


class _Conn(ServerConn):
    def draining(self, timeout: float) -> bool:
        return False


def test_a_slow_open_does_not_let_the_first_servers_lease_lapse():
    log: list = []
    slow_done = threading.Event()
    servers = [_Conn(address=f"127.0.0.1:{5000 + p}", channel=None, stub=_Stub(p, log, slow_done),
                     info=pb.ClusterInfo(part_id=p)) for p in (0, 1)]
    group = DataGroup(servers, advertise_host="127.0.0.1", timeout=10, rpc_timeout=10, lease_seconds=LEASE,
                      transport="torch-rpc")
    try:
        group._open_all()
        renewed_early = [ok for part, ok in log if part == 0 and not ok]
        assert len(renewed_early) >= 3, f"part 0 was not renewed while part 1 opened: {log}"
        assert [s.extra["worker_pid"] for s in group.opened] == [1000, 1001]
    finally:
        group.close()   # the heartbeats stop and the torch RPC rendezvous it reserved is released
    assert not any(t.is_alive() for t in group._threads)
    host, _, port = group.rendezvous.rpartition(":")
    assert port and (host.lower(), int(port)) not in rpc_group._reserved, "the rendezvous is still reserved"
