"""The torch-RPC rendezvous port is held from the moment the trainer names it to the servers until its store takes it.

Before, the trainer picked a free port, closed it, sent it in ``OpenGroup`` and bound it again only at the join,
seconds later (the workers start in between): another process could take it meanwhile ("Address already in use",
seen in a parallel test run)."""
from __future__ import annotations

import socket

import pytest

from graphfeed.transport import rpc_group


def test_a_reserved_rendezvous_port_cannot_be_taken_until_released():
    address = rpc_group.reserve_rendezvous("127.0.0.1")
    host, _, port = address.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0
    with pytest.raises(OSError):   # held: another bind of the port fails
        socket.create_server((host, int(port)))
    rpc_group.release_rendezvous(address)
    rpc_group.release_rendezvous(address)   # twice: nothing left to close, no error
    socket.create_server((host, int(port))).close()   # free again


def test_the_rank0_store_takes_over_the_reserved_socket():
    address = rpc_group.reserve_rendezvous("127.0.0.1")
    host, _, port = address.rpartition(":")
    handler = rpc_group._rendezvous_handler(
        f"{rpc_group.SCHEME}://{address}?rank=0&world_size=1&join_timeout=10")
    store, rank, world = next(handler)   # binding the port again would fail: the store uses the held socket
    assert (rank, world) == (0, 1)
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert (host, int(port)) not in rpc_group._reserved   # taken: release_rendezvous has nothing to close
    del store
