"""The secure data path's listener: a session worker answers allow-listed :class:`Function` calls from holders of
the group key (:class:`SecureServer`), and logs refused connections at a bounded rate (:class:`RefusalLog`)."""
from __future__ import annotations

import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from graphfeed.transport import wire
from graphfeed.transport.calls import Function, Handler
from graphfeed.transport.pending import Pending
from graphfeed.transport.secure.connection import Connection
from graphfeed.transport.secure.frames import FrameError
from graphfeed.transport.secure.handshake import (
    HANDSHAKE_TIMEOUT,
    Refused,
    TlsServer,
    close_socket,
    leave_tls,
    server_handshake,
)
from graphfeed.transport.secure.keys import TRAINER, PartyKeys, party_keys, party_name

REFUSAL_LOG_INTERVAL = 60.0   # seconds between two log lines about refused connections

class RefusalLog:
    """Counts refused connections and logs at most one line per ``interval`` seconds (with the count since)."""

    def __init__(self, say: Callable[[str], None], count: Callable[[], None] | None = None,
                 interval: float = REFUSAL_LOG_INTERVAL, clock=time.monotonic):
        self.say, self.count, self.interval, self.clock = say, count, interval, clock
        self.total = 0
        self._since = 0
        self._last: float | None = None
        self._lock = threading.Lock()

    def __call__(self, peer: str, reason: str) -> None:
        with self._lock:
            self.total += 1
            self._since += 1
            now = self.clock()
            if self._last is not None and now - self._last < self.interval:
                line = None
            else:
                line = (f"data path: refused a connection from {peer}: {reason} ({self._since} refused since the "
                        f"last such line; at most one line per {self.interval:g} s)")
                self._last, self._since = now, 0
        if self.count is not None:
            self.count()
        if line is not None:
            self.say(line)


class SecureServer:
    """A listener on ``host`` (port 0 unless given) answering :class:`Function` calls from the parties ``key`` shares
    a pair key with (:class:`PartyKeys`; bytes: a group root, this listener being part 0): the trainer may call every
    function, a peer worker only those marked ``peers``."""

    def __init__(self, host: str, key: bytes | PartyKeys, functions: Mapping[str, Function], *, name: str,
                 tls: TlsServer | None = None, on_refused: Callable[[str, str], None] | None = None,
                 threads: int = 16, port: int = 0):
        self.keys, self.functions, self.name = party_keys(key, me=0), dict(functions), name
        self.tls = tls
        self._ctx = tls.context() if tls is not None else None
        self._binding = tls.binding() if tls is not None else b""
        self.on_refused = on_refused or (lambda peer, reason: None)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{name}-call")
        self._sock = socket.create_server((host, port), backlog=64)
        self.host, self.port = self._sock.getsockname()[:2]
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._accept = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> "SecureServer":
        self._accept.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, addr = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock, f"{addr[0]}:{addr[1]}"), daemon=True,
                             name=f"{self.name}-conn").start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        try:
            if self._ctx is not None:
                sock = self._ctx.wrap_socket(sock, server_side=True)
            agreed = server_handshake(sock, self.keys, self._binding, bool(self.tls and self.tls.client_ca))
            if isinstance(sock, ssl.SSLSocket):
                sock = leave_tls(sock)
        except (Refused, OSError, ssl.SSLError, ValueError) as exc:
            reason = str(exc) if isinstance(exc, Refused) else f"no group handshake ({type(exc).__name__}: {exc})"
            if isinstance(exc, socket.timeout):
                reason = f"no group handshake within {HANDSHAKE_TIMEOUT:g} s"
            close_socket(sock)
            if not self._closed:
                self.on_refused(peer, reason)
            return
        sock.settimeout(None)
        conn = Connection(sock, agreed.recv_key, agreed.send_key, mac=False, seal=True, where=peer, party=agreed.party,
                          pooled=False)   # requests: a large one is freed once answered, not kept
        conn.start_sender(f"{self.name}-send")
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._conns.add(conn)
        try:
            while True:
                meta, value = conn.recv()
                self._dispatch(conn, meta, value)
        except FrameError as exc:
            if not self._closed and not conn.closed:
                self.on_refused(peer, str(exc))
        except (OSError, ValueError):
            pass   # the peer went away, or sent a frame this version cannot read: end its connection
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)

    def _dispatch(self, conn: Connection, meta: dict, value: Any) -> None:
        call_id, name = meta.get("id"), meta.get("fn")
        if meta.get("k") != "call" or not isinstance(call_id, int):
            raise wire.WireError("expected a call frame")
        func = self.functions.get(name) if isinstance(name, str) else None
        if func is None:
            allowed = ", ".join(sorted(self.functions))
            _reply_error(conn, call_id, PermissionError(
                f"{name!r} is not callable on a graphfeed session worker (allowed: {allowed})"))
            return
        if conn.party != TRAINER and not func.peers:
            allowed = ", ".join(sorted(n for n, f in self.functions.items() if f.peers))
            _reply_error(conn, call_id, PermissionError(
                f"{name!r} is the trainer's to call; {party_name(conn.party)} (a peer worker) may call: {allowed}"))
            return
        args = value if isinstance(value, (list, tuple)) else ()
        if func.is_async:
            try:
                pending = func.fn(*args)
            except Exception as exc:  # noqa: BLE001 -- the caller gets it
                _reply_error(conn, call_id, exc)
                return
            pending.add_done_callback(lambda p: _reply(conn, call_id, p))
        else:
            self._pool.submit(self._run, conn, call_id, func.fn, args)

    @staticmethod
    def _run(conn: Connection, call_id: int, fn: Handler, args) -> None:
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001 -- the caller gets it
            _reply_error(conn, call_id, exc)
            return
        _send(conn, {"k": "ok", "id": call_id}, value, call_id)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        try:
            self._sock.close()
        except OSError:
            pass
        for c in conns:
            c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _reply(conn: Connection, call_id: int, pending: Pending) -> None:
    try:
        value = pending.result()
    except Exception as exc:  # noqa: BLE001 -- the caller gets it
        _reply_error(conn, call_id, exc)
        return
    _send(conn, {"k": "ok", "id": call_id}, value, call_id)


def _reply_error(conn: Connection, call_id: int, exc: BaseException) -> None:
    kind, message = wire.error_fields(exc)
    _send(conn, {"k": "err", "id": call_id, "type": kind, "msg": message}, None, call_id)


def _send(conn: Connection, meta: dict, value: Any, call_id: int) -> None:
    conn.post(meta, value, call_id)
