"""The secure data path's listener: a session worker answers allow-listed :class:`Function` calls from holders of
the group key (:class:`SecureServer`), and logs refused connections at a bounded rate (:class:`RefusalLog`)."""
from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from graphfeed.transport import wire
from graphfeed.transport.calls import Function, Handler
from graphfeed.transport.path import ListenerLimits
from graphfeed.transport.pending import Pending
from graphfeed.transport.secure.connection import Connection
from graphfeed.transport.secure.frames import FrameError
from graphfeed.transport.secure.gate import Gate, ListenerStats, Throttled, stderr_line
from graphfeed.transport.secure.handshake import Agreed, TlsServer
from graphfeed.transport.secure.keys import TRAINER, PartyKeys, party_keys, party_name

REFUSAL_LOG_INTERVAL = 60.0   # seconds between two log lines about refused connections
BACKLOG = 1024                # connections the kernel queues for the gate (a flood's burst, not a limit of ours)
CALL_HEADER = 64 << 10        # bytes of a call's header a listener reads at most: names, ids, records (tensors
                              # travel in the body); a longer one ends its connection before a byte of it is read

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
    function, a peer worker only those marked ``peers``.

    Connections are accepted and set up by one :class:`~.gate.Gate` thread within ``limits``
    (:class:`ListenerLimits`); one that proved its key gets a thread of its own (its reads) and a sender, up to
    ``limits.connections`` at once.  ``on_refused(peer, reason)``: a failed set-up or a refused frame (counted and
    logged at a bounded rate by :class:`RefusalLog`); ``say``: the listener's other lines (throttled: caps reached,
    a pause in accepting).  :attr:`stats` counts every kind of :data:`~.gate.LISTENER_KINDS`."""

    def __init__(self, host: str, key: bytes | PartyKeys, functions: Mapping[str, Function], *, name: str,
                 tls: TlsServer | None = None, on_refused: Callable[[str, str], None] | None = None,
                 threads: int = 16, port: int = 0, limits: ListenerLimits | None = None,
                 say: Callable[[str], None] | None = None):
        self.keys, self.functions, self.name = party_keys(key, me=0), dict(functions), name
        self.tls, self.limits, self.stats = tls, limits or ListenerLimits(), ListenerStats()
        self.on_refused = on_refused or (lambda peer, reason: None)
        self._log = Throttled(say or stderr_line)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{name}-call")
        sock = socket.create_server((host, port), backlog=BACKLOG)
        self.host, self.port = sock.getsockname()[:2]
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._gate = Gate(sock, name=name, keys=self.keys, ctx=tls.context() if tls is not None else None,
                          binding=tls.binding() if tls is not None else b"", trainer_cert=bool(tls and tls.client_ca),
                          limits=self.limits, stats=self.stats, admit=self._admit,
                          on_refused=lambda peer, reason: self.on_refused(peer, reason), log=self._log)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> "SecureServer":
        self._gate.start()
        return self

    def _admit(self, sock: socket.socket, agreed: Agreed, peer: str) -> None:
        """A connection that proved its key: its threads, within ``limits.connections``.  RuntimeError (the
        connection closed) when a thread does not start."""
        conn = Connection(sock, agreed.recv_key, agreed.send_key, mac=False, seal=True, where=peer, party=agreed.party,
                          max_header=CALL_HEADER, max_body=self.limits.call_bytes,
                          pooled=False)   # requests: a large one is freed once answered, not kept
        with self._lock:
            full = len(self._conns) >= self.limits.connections
            if not (full or self._closed):
                self._conns.add(conn)
        if full or self._closed:
            if full:   # counted and said before the close, which the other end sees at once
                self.stats.count("refused_connections")
                self._log("connections", f"data path: refused {party_name(agreed.party)} from {peer}: "
                          f"{self.limits.connections} authenticated connections are open, the most data_connections "
                          f"allows (raise it for a group of more parts, or find the party that keeps reconnecting)")
            conn.close()
            return
        try:
            conn.start_sender(f"{self.name}-send")
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True, name=f"{self.name}-conn").start()
        except RuntimeError:
            self._forget(conn)
            raise

    def _serve(self, conn: Connection, peer: str) -> None:
        try:
            while True:
                meta, value = conn.recv()
                self._dispatch(conn, meta, value)
        except FrameError as exc:
            self._refuse_frame(conn, peer, str(exc))
        except OSError:
            pass   # the peer went away
        except Exception as exc:  # noqa: BLE001 -- a frame that does not decode ends its connection, never the worker
            self._refuse_frame(conn, peer, f"a frame that does not decode ({type(exc).__name__}: {exc})")
        finally:
            self._forget(conn)

    def _refuse_frame(self, conn: Connection, peer: str, reason: str) -> None:
        if not self._closed and not conn.closed:
            self.stats.count("frame_refused")
            self.on_refused(peer, f"{party_name(conn.party)}: {reason}")

    def _forget(self, conn: Connection) -> None:
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
        """Stop listening, end every connection (waits for the gate's thread, not for calls running)."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        self._gate.close()
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
