"""The secure data path as a registry entry: workers listen, the trainer connects and both prove the group key.

Worker: before it reports ``Started`` it listens on its data address (port 0) for holders of the group key
(TLS with the daemon's certificate), and reports the address; ``JoinPeers`` later tells it where its peers
listen.  No torch RPC agent, no TCPStore.  Trainer: each ``OpenGroup`` reply names its worker's listener;
``JoinGroup`` tells every worker where its peers are; the trainer then connects to each worker.  The trainer
listens on nothing.
"""
from __future__ import annotations

import socket
import ssl
from typing import Callable, Mapping, Sequence

from graphfeed.transport import registry, rpc_group
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.path import DataPath, GroupError, TlsFiles, TrainerEnd, WorkerEnd, WorkerHooks, WorkerPlace
from graphfeed.transport.secure.client import SecureCalls
from graphfeed.transport.secure.handshake import TlsServer, client_tls
from graphfeed.transport.secure.keys import PartyKeys, group_root
from graphfeed.transport.secure.server import RefusalLog, SecureServer


class SecureWorker(WorkerEnd):
    """A worker's listener for the trainer and its peers, and its connections to the peers' listeners."""

    calls: SecureCalls

    def __init__(self, place: WorkerPlace):
        super().__init__(place)
        self.calls = SecureCalls(place.group_key, tls=peer_tls(place), name=rpc_group.worker_name)
        self.server: SecureServer | None = None

    def listen(self, hooks: WorkerHooks) -> str:
        p = self.place
        tls = TlsServer(p.tls_cert, p.tls_key, p.tls_client_ca) if p.tls_cert and p.tls_key else None
        refused = RefusalLog(say=hooks.say, count=hooks.refused)
        self.server = SecureServer(p.data_address, p.group_key, hooks.functions(), name=f"part{p.part_id}-dp",
                                   tls=tls, on_refused=refused, limits=p.listener, say=hooks.say).start()
        host = self.server.host
        if host in ("0.0.0.0", "::"):   # a wildcard bind: peers reach this host by its name
            host = socket.gethostbyname(socket.gethostname())
        return f"[{host}]:{self.server.port}" if ":" in host else f"{host}:{self.server.port}"

    def listener_figures(self) -> dict:
        return self.server.stats.figures() if self.server is not None else {}

    def join_peers(self, endpoints: Mapping[int, str], hooks: WorkerHooks) -> None:
        import threading

        self.calls.set_endpoints(endpoints)
        threading.Thread(target=hooks.formed, name="colocate", daemon=True).start()

    def not_joined(self) -> str:
        return (f"the trainer's data-path group did not form within {self.place.join_timeout:g} s; "
                f"the trainer must send JoinGroup before StartEpoch")

    def close(self, formed: bool) -> None:
        if self.server is not None:
            self.server.close()
        self.calls.close()


def peer_tls(place: WorkerPlace) -> ssl.SSLContext | None:
    """A worker's TLS towards its peers: their certificates checked against ``tls_peer_ca`` when the daemon has one;
    without, none is checked -- the pair-key proof, bound to the certificate the worker saw, authenticates the peer.
    A worker shows no certificate of its own (a daemon's is a server certificate): its pair key is its identity."""
    if not place.tls_cert:
        return None
    return client_tls(ca=place.tls_peer_ca) if place.tls_peer_ca else client_tls(verify=False)


class SecureTrainer(TrainerEnd):
    """The trainer notes each worker's listener, then connects to each and proves it is the trainer."""

    def __init__(self, group_key: bytes, name: str, token: str | None = None):
        self.keys, self.name = PartyKeys.of_root(group_root(group_key, token)), name

    def opened(self, part: int, data_path: str, endpoint: str) -> str | None:
        if data_path != self.name or not endpoint:
            return (f"the server did not open a secure data path (an older graphfeed server?); upgrade it, or "
                    f"connect with transport={registry.TRUSTED_DEFAULT!r} on a trusted network")
        return None

    def join(self, *, endpoints: Mapping[int, str], names: Sequence[str], host: str, timeout: float,
             rpc_timeout: float, tls: TlsFiles | None, probe: Callable[[], dict[str, str]]) -> DataCalls:
        context = None if tls is None else client_tls(ca=tls.ca, cert=tls.cert, key=tls.key)
        calls = SecureCalls(self.keys, endpoints, tls=context, name=lambda p: names[p])
        try:
            calls.connect()
        except ConnectionError as exc:
            calls.close()
            raise GroupError(", ".join(names), f"the secure data path did not form: {exc}; is the servers' data "
                                               f"address reachable from this host?") from None
        return calls


class Secure(DataPath):
    """Authenticated calls (group-key handshake; MACed frames, or sealed AES-256-GCM frames with TLS)."""

    label = "the secure data path"
    authenticated = True
    joins_peers = True

    def worker(self, place: WorkerPlace) -> WorkerEnd:
        return SecureWorker(place)

    def trainer(self, group_key: bytes, token: str | None = None) -> TrainerEnd:
        return SecureTrainer(group_key, self.name, token)

    def worker_key(self, group_key: bytes, token: str | None, part: int, num_parts: int) -> PartyKeys:
        """Part ``part``'s ring: its pair keys with the trainer and the other parts -- never the group's root."""
        return PartyKeys.of_worker(group_root(group_key, token), part, num_parts)


PATH = Secure()
