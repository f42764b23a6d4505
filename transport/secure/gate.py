"""The secure data path's gate: one thread accepts a worker listener's connections and runs every set-up
(:mod:`.handshake`, TLS included) without blocking, so no outsider gets a thread, and nothing an outsider does
stops it from accepting.

Bounds (:class:`~graphfeed.transport.path.ListenerLimits`): at most ``handshakes`` connections in set-up, at most
``handshakes_per_source`` of them from one IP address (more are closed at once, counted ``refused_cap`` /
``refused_source``); one deadline per connection from accept to the client's proof (``handshake_timeout``, however
slowly the bytes trickle in: ``handshake_timeout``).  A connection that proved its key is handed to the listener's
``admit`` (its serving thread).  Accept errors that say the process is out of something (file descriptors, buffers,
memory: ``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``) and threads that do not start pause accepting for a
bounded back-off (:data:`BACKOFF_FIRST` doubling to :data:`BACKOFF_MAX`), counted and logged once per
:data:`LOG_INTERVAL`; accepting resumes by itself.  Only :meth:`Gate.close` ends it.
"""
from __future__ import annotations

import collections
import errno
import selectors
import socket
import ssl
import struct
import sys
import threading
import time
from typing import Callable

from graphfeed.transport.path import ListenerLimits
from graphfeed.transport.secure.handshake import (
    HELLO,
    HELLO_START,
    MAC,
    Agreed,
    Refused,
    ServerAnswer,
    check_hello_start,
    close_socket,
    leave_tls,
)
from graphfeed.transport.secure.keys import PartyKeys

BACKOFF_FIRST = 0.05          # seconds accepting pauses after the first resource error
BACKOFF_MAX = 1.0             # seconds, at most, however many follow
LOG_INTERVAL = 60.0           # seconds between two log lines of one kind
ACCEPTS_PER_WAKE = 64         # connections accepted before the set-ups in progress get their turn
LOST_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})   # one connection lost, not the listener
# every kind the listener counts (graphfeed_data_path_listener_total{kind})
LISTENER_KINDS = ("accepted", "authenticated", "refused_cap", "refused_source", "refused_connections",
                  "handshake_timeout", "handshake_failed", "frame_refused", "accept_error", "thread_error")
_RESET = struct.pack("ii", 1, 0)   # SO_LINGER on, 0 s: close() resets, nothing of the connection lingers here


class ListenerStats:
    """The listener's counts by kind (:data:`LISTENER_KINDS`) and whether its set-up slots are all taken; any
    thread may count, the worker's metrics read :meth:`figures`."""

    def __init__(self):
        self._counts = dict.fromkeys(LISTENER_KINDS, 0)
        self._lock = threading.Lock()
        self.saturated = False

    def count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def figures(self) -> dict:
        return {"counts": self.counts(), "saturated": int(self.saturated)}


class Throttled:
    """Log lines of a topic at most once per ``interval`` seconds, each saying how many were held back."""

    def __init__(self, say: Callable[[str], None], interval: float = LOG_INTERVAL, clock=time.monotonic):
        self.say, self.interval, self.clock = say, interval, clock
        self._last: dict[str, float] = {}
        self._held: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, topic: str, line: str) -> None:
        with self._lock:
            now, last = self.clock(), self._last.get(topic)
            if last is not None and now - last < self.interval:
                self._held[topic] += 1
                return
            held, self._held[topic], self._last[topic] = self._held[topic], 0, now
        self.say(f"{line} ({held} more such since the last line; at most one line per {self.interval:g} s)")


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Setup:
    """One connection's set-up in progress, never blocking: TLS (when configured), the hello, the answer, the
    client's proof.  :meth:`advance` goes as far as the bytes at hand allow."""

    def __init__(self, sock, peer: str, source: str, deadline: float, keys: PartyKeys, binding: bytes,
                 trainer_cert: bool):
        self.sock, self.peer, self.source, self.deadline = sock, peer, source, deadline
        self.keys, self.binding, self.trainer_cert = keys, binding, trainer_cert
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.tls_done = not self.tls
        self.inbuf, self.need, self.out = b"", HELLO_START, b""
        self.answer: ServerAnswer | None = None
        self.want = selectors.EVENT_READ
        self.finished = False

    def advance(self) -> Agreed | None:
        """The agreed keys once the client proved its key; None while bytes are due (:attr:`want` says which way).
        Refused, OSError or ssl.SSLError when the set-up fails."""
        try:
            if not self.tls_done:
                self.sock.do_handshake()
                self.tls_done = True
            while True:
                if self.out:
                    self.out = self.out[self.sock.send(self.out):]
                    continue
                got = self.sock.recv(self.need - len(self.inbuf))
                if not got:
                    raise ConnectionError(f"connection closed after {len(self.inbuf)} of {self.need} bytes")
                self.inbuf += got
                if len(self.inbuf) == self.need:
                    agreed = self._step()
                    if agreed is not None:
                        return agreed
        except (BlockingIOError, ssl.SSLWantReadError):
            self.want = selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            self.want = selectors.EVENT_WRITE
        if self.out:
            self.want = selectors.EVENT_WRITE
        return None

    def _step(self) -> Agreed | None:
        if self.need == HELLO_START:
            check_hello_start(self.inbuf)
            self.need = HELLO
            return None
        if self.answer is None:
            no_cert = self.trainer_cert and not self.sock.getpeercert()
            self.answer = ServerAnswer.of(self.inbuf, self.keys, self.binding, no_cert)
            self.out, self.inbuf, self.need = self.answer.reply, b"", MAC
            return None
        return self.answer.check(self.inbuf)


class Gate:
    """Accepts on ``sock`` (a bound, listening socket; the gate owns it from now on) and sets up connections on one
    thread; ``admit(sock, agreed, peer)`` takes each that proved its key (RuntimeError: its thread did not start)."""

    def __init__(self, sock: socket.socket, *, name: str, keys: PartyKeys, ctx: ssl.SSLContext | None,
                 binding: bytes, trainer_cert: bool, limits: ListenerLimits, stats: ListenerStats,
                 admit: Callable[[socket.socket, Agreed, str], None], on_refused: Callable[[str, str], None],
                 log: Throttled):
        self.sock, self.name, self.keys, self.ctx, self.binding = sock, name, keys, ctx, binding
        self.trainer_cert, self.limits, self.stats, self.admit = trainer_cert, limits, stats, admit
        self.on_refused, self.log = on_refused, log
        sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._sel.register(sock, selectors.EVENT_READ, self)
        self._setups: set[Setup] = set()
        self._sources: collections.Counter = collections.Counter()
        self._queue: collections.deque[Setup] = collections.deque()   # in accept order: deadline order
        self._paused_until: float | None = None
        self._backoff = BACKOFF_FIRST
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-gate", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, drop the set-ups in progress and close the listening socket (waits for the thread)."""
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        elif self._thread.ident is None:   # never started
            self._cleanup()

    # ---- the loop --------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                try:
                    self._turn()
                except Exception as exc:  # noqa: BLE001 -- a failure here must not end the listener: said, then on
                    self.log("loop", f"data path: the listener's loop failed ({type(exc).__name__}: {exc}); it "
                                     f"goes on")
                    time.sleep(BACKOFF_FIRST)
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        for setup in list(self._setups):
            self._drop(setup)
        self._sel.close()
        for s in (self.sock, self._wake_r, self._wake_w):
            close_socket(s)

    def _turn(self) -> None:
        for key, _ in self._sel.select(self._timeout()):
            if self._closed:
                return
            if key.data is None:
                self._drain_wake()
            elif key.data is self:
                self._accept_some()
            else:
                self._advance(key.data)
        now = time.monotonic()
        self._expire(now)
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            self._sel.register(self.sock, selectors.EVENT_READ, self)

    def _timeout(self) -> float:
        """Seconds until the next deadline or the end of a pause (at most 1)."""
        now, until = time.monotonic(), [1.0]
        while self._queue and self._queue[0].finished:
            self._queue.popleft()
        if self._queue:
            until.append(self._queue[0].deadline - now)
        if self._paused_until is not None:
            until.append(self._paused_until - now)
        return max(0.0, min(until))

    def _drain_wake(self) -> None:
        try:
            self._wake_r.recv(64)
        except OSError:
            pass

    # ---- accepting ---------------------------------------------------------------------------------------

    def _accept_some(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, addr = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if self._closed:
                    return
                self.stats.count("accept_error")
                if exc.errno in LOST_ERRNOS:
                    continue
                self.pause(f"cannot accept a connection ({exc})")
                return
            self._backoff = BACKOFF_FIRST
            self.stats.count("accepted")
            self._take(sock, addr[0], f"{addr[0]}:{addr[1]}")

    def pause(self, why: str) -> None:
        """Stop accepting for the current back-off (doubled for the next one), and say why (throttled)."""
        if self._paused_until is None:
            self._sel.unregister(self.sock)
        self._paused_until = time.monotonic() + self._backoff
        self.log("pause", f"data path: {why}; accepting again in {self._backoff:g} s (the listener backs off up to "
                          f"{BACKOFF_MAX:g} s while the process is out of file descriptors, memory or threads)")
        self._backoff = min(2 * self._backoff, BACKOFF_MAX)

    def _take(self, sock: socket.socket, source: str, peer: str) -> None:
        lim = self.limits
        if len(self._setups) >= lim.handshakes:
            self._refuse_now(sock, "refused_cap", f"data path: refused a connection from {peer} at once: "
                             f"{lim.handshakes} connections are in set-up, the most data_handshakes allows")
            return
        if self._sources[source] >= lim.handshakes_per_source:
            self._refuse_now(sock, "refused_source", f"data path: refused a connection from {peer} at once: "
                             f"{lim.handshakes_per_source} connections from {source} are in set-up, the most "
                             f"data_handshakes_per_source allows")
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            if self.ctx is not None:
                sock = self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            close_socket(sock)
            self._refused(peer, f"no group handshake ({type(exc).__name__}: {exc})", "handshake_failed")
            return
        setup = Setup(sock, peer, source, time.monotonic() + lim.handshake_timeout, self.keys, self.binding,
                      self.trainer_cert)
        self._setups.add(setup)
        self._sources[source] += 1
        self._queue.append(setup)
        self._sel.register(sock, selectors.EVENT_READ, setup)
        self._saturation()
        self._advance(setup)

    def _refuse_now(self, sock: socket.socket, kind: str, line: str) -> None:
        self.stats.count(kind)
        _reset(sock)
        self.log(kind, line)

    # ---- set-ups -----------------------------------------------------------------------------------------

    def _advance(self, setup: Setup) -> None:
        if setup.finished:
            return
        try:
            agreed = setup.advance()
        except Exception as exc:  # noqa: BLE001 -- whatever a sender's bytes cause ends only its connection
            self._refused(setup.peer, str(exc) if isinstance(exc, Refused)
                          else f"no group handshake ({type(exc).__name__}: {exc})", "handshake_failed")
            self._drop(setup)
            return
        if agreed is None:
            self._sel.modify(setup.sock, setup.want, setup)
            return
        self._release(setup)
        self.stats.count("authenticated")
        self._hand_over(setup, agreed)

    def _hand_over(self, setup: Setup, agreed: Agreed) -> None:
        sock = setup.sock
        try:
            if setup.tls:
                sock = leave_tls(sock)
            sock.settimeout(None)
        except (OSError, ValueError) as exc:
            self._refused(setup.peer, f"no group handshake ({type(exc).__name__}: {exc})", "handshake_failed")
            close_socket(sock)
            return
        try:
            self.admit(sock, agreed, setup.peer)
        except Exception as exc:  # noqa: BLE001 -- "can't start new thread", out of memory: the connection goes
            self.stats.count("thread_error" if isinstance(exc, RuntimeError) else "accept_error")
            self.pause(f"cannot take the connection from {setup.peer} ({type(exc).__name__}: {exc}); it was closed")
            close_socket(sock)

    def _expire(self, now: float) -> None:
        while self._queue and self._queue[0].deadline <= now:
            setup = self._queue.popleft()
            if not setup.finished:   # counted before the close the other end sees
                self._refused(setup.peer, f"no group handshake within {self.limits.handshake_timeout:g} s",
                              "handshake_timeout")
                self._drop(setup)

    def _release(self, setup: Setup) -> None:
        """Take ``setup`` out of the gate's books (its socket stays open)."""
        setup.finished = True
        self._setups.discard(setup)
        self._sources[setup.source] -= 1
        if self._sources[setup.source] <= 0:
            del self._sources[setup.source]
        try:
            self._sel.unregister(setup.sock)
        except (KeyError, ValueError):
            pass
        self._saturation()

    def _drop(self, setup: Setup) -> None:
        self._release(setup)
        _reset(setup.sock)
        setup.sock, setup.answer, setup.inbuf = None, None, b""

    def _refused(self, peer: str, reason: str, kind: str) -> None:
        self.stats.count(kind)
        if not self._closed:
            self.on_refused(peer, reason)

    def _saturation(self) -> None:
        self.stats.saturated = len(self._setups) >= self.limits.handshakes


def _reset(sock) -> None:
    """Close ``sock`` at once with a reset: a refused or expired connection leaves nothing behind (no TIME_WAIT)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except (OSError, ValueError):
        pass
    close_socket(sock)
