"""The secure data path's caller: :class:`SecureClient` (one authenticated connection to a worker, calls multiplexed
on it) and :class:`SecureCalls` (the :class:`~graphfeed.transport.calls.DataCalls` of a group, one client per part)."""
from __future__ import annotations

import hashlib
import itertools
import socket
import ssl
import threading
import time
from typing import Callable, Mapping

from graphfeed.transport import registry, wire
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.errors import PeerLost, translated
from graphfeed.transport.pending import Pending
from graphfeed.transport.secure.connection import Connection
from graphfeed.transport.secure.handshake import Refused, client_handshake, close_socket, leave_tls
from graphfeed.transport.secure.keys import PartyKeys, party_keys

CONNECT_TIMEOUT = 10.0
SWEEP_INTERVAL = 0.25         # seconds between checks for calls past their timeout


class SecureClient:
    """One authenticated connection to a worker's :class:`SecureServer` (party ``party``: the part it serves);
    calls are multiplexed on it.  ``key``: this end's :class:`PartyKeys` (bytes: a group root, as the trainer)."""

    def __init__(self, address: str, key: bytes | PartyKeys, *, where: str, tls: ssl.SSLContext | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, party: int = 0):
        self.address, self.keys, self.where, self.tls = address, party_keys(key), where, tls
        self.party = int(party)
        self.part = self.party   # the part it reaches, for PeerLost
        self.connect_timeout = float(connect_timeout)
        self._ids = itertools.count(1)
        self._calls: dict[int, tuple[Pending, float]] = {}
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._broken: str | None = None

    def connect(self) -> Connection:
        host, _, port = self.address.rpartition(":")
        try:
            raw = socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout)
        except OSError as exc:   # refused, unreachable: nothing listens there (any more)
            raise self._lost(f"cannot reach {self.where}'s data path at {self.address}: {exc}") from None
        sock: socket.socket = raw
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            binding = b""
            if self.tls is not None:
                sock = self.tls.wrap_socket(raw, server_side=False)
                der = sock.getpeercert(binary_form=True)
                binding = hashlib.sha256(der or b"").digest()
            agreed = client_handshake(sock, self.keys, self.party, binding, f"{self.where} at {self.address}")
            suite = None
            if isinstance(sock, ssl.SSLSocket):
                suite = sock.cipher()
                sock = leave_tls(sock)
        except ssl.SSLError as exc:
            close_socket(sock)
            raise ConnectionError(f"TLS with {self.where}'s data path at {self.address} failed: {exc}") from None
        except Refused as exc:
            close_socket(sock)
            raise ConnectionError(f"{self.where}'s data path at {self.address}: {exc}") from None
        except OSError as exc:   # reset or closed during the set-up: the worker went away
            close_socket(sock)
            raise self._lost(f"{self.where}'s data path at {self.address}: {exc}") from None
        sock.settimeout(None)
        conn = Connection(sock, agreed.recv_key, agreed.send_key, mac=False, seal=True,
                          where=f"{self.where} ({self.address})", party=agreed.party)
        conn.tls_suite = suite
        threading.Thread(target=self._read, args=(conn,), name=f"graphfeed-dp-{self.where}", daemon=True).start()
        return conn

    def _connection(self) -> Connection:
        with self._lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
        conn = self.connect()
        with self._lock:
            if self._conn is not None and not self._conn.closed:   # another caller connected meanwhile
                conn.close()
                return self._conn
            self._conn = conn
            return conn

    def call(self, name: str, args: tuple, timeout: float) -> Pending:
        pending = Pending()
        try:
            conn = self._connection()
        except ConnectionError as exc:
            pending.set_exception(exc)
            return pending
        call_id = next(self._ids)
        with self._lock:
            self._calls[call_id] = (pending, time.monotonic() + float(timeout))
        try:
            conn.send({"k": "call", "id": call_id, "fn": name}, list(args))
        except (OSError, wire.WireError) as exc:
            self._fail(call_id, exc if isinstance(exc, wire.WireError)
                       else self._lost(f"cannot send {name} to {self.where}: {exc}"))
        return pending

    def _lost(self, wording: str) -> PeerLost:
        """This connection's peer is gone (reset, closed, refused): the data path's typed error."""
        return PeerLost(self.part, wording, SecureCalls.label)

    def _read(self, conn: Connection) -> None:
        why = "closed"
        try:
            while True:
                meta, value = conn.recv()
                call_id = meta.get("id")
                with self._lock:
                    entry = self._calls.pop(call_id, None) if isinstance(call_id, int) else None
                if entry is None:
                    continue   # the answer of a call that timed out
                if meta.get("k") == "ok":
                    entry[0].set_result(value)
                else:
                    error = wire.rebuild_error(meta.get("type"), meta.get("msg"), self.where)
                    entry[0].set_exception(translated(self.part, error, SecureCalls.label))
        except (OSError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
            self._fail_all(conn, self._lost(f"the data-path connection to {self.where} ({self.address}) "
                                            f"was lost: {why}"))

    def _fail(self, call_id: int, exc: BaseException) -> None:
        with self._lock:
            entry = self._calls.pop(call_id, None)
        if entry is not None:
            entry[0].set_exception(exc)

    def _fail_all(self, conn: Connection, exc: BaseException) -> None:
        with self._lock:
            if self._conn is not conn:
                return
            self._conn = None
            calls, self._calls = list(self._calls.values()), {}
        for pending, _ in calls:
            pending.set_exception(exc)

    def sweep(self, now: float) -> None:
        """Fail the calls past their deadline."""
        with self._lock:
            late = [k for k, (_, deadline) in self._calls.items() if deadline <= now]
            entries = [self._calls.pop(k) for k in late]
        for pending, _ in entries:
            pending.set_exception(TimeoutError(f"the call to {self.where} ({self.address}) timed out"))

    def close(self) -> None:
        with self._lock:
            conn = self._conn
        if conn is not None:
            conn.close()


class SecureCalls(DataCalls):
    """Calls to the group's workers over :class:`SecureClient` connections (one per part, made on first use)."""

    kind = registry.SECURE
    label = "the secure data path"

    def __init__(self, key: bytes | PartyKeys, endpoints: Mapping[int, str] | None = None, *,
                 tls: ssl.SSLContext | None = None, name: Callable[[int], str] = lambda p: f"part{p}"):
        super().__init__()
        self.keys, self.tls, self.name = party_keys(key), tls, name
        self._clients: dict[int, SecureClient] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        if endpoints:
            self.set_endpoints(endpoints)

    def set_endpoints(self, endpoints: Mapping[int, str]) -> None:
        with self._lock:
            for part, address in endpoints.items():
                old = self._clients.get(int(part))
                if old is None or old.address != address:
                    if old is not None:
                        old.close()
                    self._clients[int(part)] = SecureClient(address, self.keys, where=self.name(int(part)),
                                                            tls=self.tls, party=int(part))
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep, name="graphfeed-dp-sweep", daemon=True)
                self._sweeper.start()

    def connect(self, parts=None) -> None:
        """Open (and authenticate) the connections now: ConnectionError naming the first part that fails."""
        for part in (parts if parts is not None else list(self._clients)):
            self._client(part)._connection()

    def _client(self, part: int) -> SecureClient:
        client = self._clients.get(int(part))
        if client is None:
            raise ConnectionError(f"no data-path address for part {part} (the group has not formed)")
        return client

    def call(self, part: int, name: str, args: tuple, timeout: float) -> Pending:
        self._check_open()
        try:
            client = self._client(part)
        except ConnectionError as exc:
            return Pending.failed(exc)
        return client.call(name, args, timeout)

    def _sweep(self) -> None:
        while not self._stop.wait(SWEEP_INTERVAL):
            now = time.monotonic()
            for client in list(self._clients.values()):
                client.sweep(now)

    def close(self) -> None:
        super().close()
        self._stop.set()
        for client in list(self._clients.values()):
            client.close()
