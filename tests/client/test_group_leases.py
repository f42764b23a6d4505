"""Leases while a data group forms: each server's heartbeat starts when that server holds the group.

On a loaded host one server's ``OpenGroup`` (it starts a worker process) can take longer than a short
lease; the servers that answered first must be renewed meanwhile, or they reap the group before it forms
(seen under load: "reaped: lease expired: no Heartbeat for 2 s" during a 2-server connect)."""
from __future__ import annotations

import threading
import time

from graphfeed.client.cluster import ServerConn
from graphfeed.client.group import DataGroup
from graphfeed.proto import control_pb2 as pb

LEASE = 0.4           # heartbeat interval = lease / 4, at least 0.2 s
SLOW_OPEN = 1.5       # part 1's OpenGroup: several leases


class _Stub:
    def __init__(self, part: int, log: list, opened: threading.Event):
        self.part, self.log, self.opened = part, log, opened

    def OpenGroup(self, req, timeout):   # noqa: N802 -- named as the gRPC method it stands in for
        if self.part == 1:
            time.sleep(SLOW_OPEN)
            self.opened.set()
        return pb.OpenGroupReply(lease_seconds=LEASE, worker_pid=1000 + self.part)

    def Heartbeat(self, req, timeout):   # noqa: N802 -- named as the gRPC method it stands in for
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
        group._stop.set()
        for t in group._threads:
            t.join(5)
    assert not any(t.is_alive() for t in group._threads)
