"""A worker's secure data listener under attack, in one process: idle floods hold no threads, caps refuse the excess
at once, a slow drip is dropped at one absolute deadline (in clear and inside TLS), the listener outlives fd and
thread exhaustion and accepts again, and an authenticated sender's oversized or undecodable frame ends only its own
connection.  Every test ends with a key holder's call answered at once."""
from __future__ import annotations

import os
import resource
import select
import socket
import threading
import time

import pytest
from helpers.pki import make_pki

from graphfeed.server.daemon import metrics as m
from graphfeed.transport.path import ListenerLimits
from graphfeed.transport.secure import Function, PartyKeys, SecureCalls, SecureServer, TlsServer, client_tls
from graphfeed.transport.secure.connection import Connection
from graphfeed.transport.secure.frames import PREFIX
from graphfeed.transport.secure.gate import BACKOFF_MAX, LISTENER_KINDS
from graphfeed.transport.secure.handshake import MAGIC, VERSION, client_handshake
from graphfeed.transport.secure.server import CALL_HEADER

ROOT = b"l" * 32
AT_ONCE = 1.0          # seconds: "at once" for a key holder's first call (connect, set-up, answer)
SLACK = 1.0            # seconds past a deadline a dropped connection may take to be seen closed


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def make_server():
    made: list[SecureServer] = []

    def make(tls: TlsServer | None = None, **limits) -> tuple[SecureServer, list[str]]:
        lines: list[str] = []
        srv = SecureServer("127.0.0.1", PartyKeys.of_worker(ROOT, 0, 2), {"echo": Function(lambda *a: a)},
                           name="lst", tls=tls, limits=ListenerLimits(**limits), say=lines.append,
                           on_refused=lambda peer, reason: lines.append(f"refused {peer}: {reason}")).start()
        made.append(srv)
        return srv, lines

    yield make
    for srv in made:
        srv.close()


def _until(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g} s")
        time.sleep(0.01)


def _key_holder_call(srv: SecureServer, tls=None) -> float:
    """Seconds a new trainer connection takes to set up and answer one call."""
    calls = SecureCalls(ROOT, {0: srv.address}, tls=tls)
    try:
        t0 = time.monotonic()
        assert calls.call_sync(0, "echo", (7,), 10) == (7,)
        return time.monotonic() - t0
    finally:
        calls.close()


def _idle(srv: SecureServer, source: str = "127.0.0.3") -> socket.socket:
    """A connection from ``source`` that sends nothing (one the listener reset at once may be reset already)."""
    sock = socket.socket()
    sock.settimeout(5)
    sock.bind((source, 0))
    try:
        sock.connect_ex((srv.host, srv.port))
    except ConnectionResetError:
        pass
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed ``sock`` within ``seconds`` (reset or end of stream)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:   # reset; an SSL socket's end without close_notify
        return True


def _counts(srv: SecureServer) -> dict[str, int]:
    return srv.stats.counts()


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _authenticated(srv: SecureServer) -> tuple[socket.socket, Connection]:
    """A raw trainer connection that passed the set-up (frames sent by hand)."""
    sock = socket.create_connection((srv.host, srv.port), timeout=5)
    agreed = client_handshake(sock, PartyKeys.of_root(ROOT), 0, b"", "the test listener")
    sock.settimeout(None)
    return sock, Connection(sock, agreed.recv_key, agreed.send_key, mac=False, seal=True, where="lst")


class _NoFiles:
    """RLIMIT_NOFILE lowered and every descriptor under it taken; restored on exit."""

    def __enter__(self):
        self.limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (_fds() + 16, self.limits[1]))
        self.held: list[int] = []
        try:
            while True:
                self.held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        return self

    def free(self, n: int) -> None:
        for _ in range(n):
            os.close(self.held.pop())

    def __exit__(self, *exc):
        for fd in self.held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, self.limits)


# ---- floods -----------------------------------------------------------------------------------------------

def test_2000_idle_connections_hold_no_thread_and_a_key_holder_still_connects_at_once(make_server, capsys):
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limits[1] != resource.RLIM_INFINITY and limits[1] < 4500:
        pytest.skip(f"2000 connections in one process need 4500 descriptors; the hard limit is {limits[1]}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(8192, limits[1]) if limits[1] != resource.RLIM_INFINITY
                                                else 8192, limits[1]))
    flood: list[socket.socket] = []
    try:   # caps above the flood: the gate holds every one of them in set-up, on its one thread
        srv, _ = make_server(handshakes=4096, handshakes_per_source=4096, handshake_timeout=120)
        before = _key_holder_call(srv)
        threads, fds, rss = threading.active_count(), _fds(), _rss()
        flood = [_idle(srv) for _ in range(2000)]
        _until(lambda: _counts(srv)["accepted"] == 2001, "accept of the 2000 idle connections", 30)
        held = (threading.active_count() - threads, _fds() - fds, (_rss() - rss) / 2**20)
        latency = _key_holder_call(srv)
        assert held[0] <= 10, f"{held[0]} threads more under 2000 idle connections"
        assert latency < AT_ONCE, f"a key holder's call took {latency:.3f} s under the flood"
        assert srv.stats.saturated is False and _counts(srv)["refused_cap"] == 0
        with capsys.disabled():
            print(f"\n2000 idle connections in set-up: +{held[0]} threads, +{held[1]} fds, +{held[2]:.1f} MiB RSS; "
                  f"a key holder's first call {before * 1000:.1f} ms before, {latency * 1000:.1f} ms during")
    finally:
        for s in flood:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_a_flood_from_one_source_is_refused_at_once_past_its_cap(make_server):
    srv, lines = make_server(handshakes_per_source=32, handshake_timeout=60)
    flood = [_idle(srv) for _ in range(500)]
    try:
        _until(lambda: _counts(srv)["refused_source"] == 468, "refusal of the 468 past the per-source cap")
        assert sum(_closed_within(s, 0.01) for s in flood[32:]) == 468       # closed at once: nothing to read
        assert not any(_closed_within(s, 0.01) for s in flood[:32])           # the first 32 are in set-up
        assert _key_holder_call(srv) < AT_ONCE                               # another source is not capped
        assert sum("data_handshakes_per_source" in line for line in lines) == 1   # one line per interval
    finally:
        for s in flood:
            s.close()


def test_the_per_source_and_total_caps_refuse_the_excess_at_once(make_server):
    srv, lines = make_server(handshakes=4, handshakes_per_source=2, handshake_timeout=60)
    held = [_idle(srv, "127.0.0.3"), _idle(srv, "127.0.0.3")]
    third = _idle(srv, "127.0.0.3")
    assert _closed_within(third, 1.0) and _counts(srv)["refused_source"] == 1
    held += [_idle(srv, "127.0.0.4"), _idle(srv, "127.0.0.5")]
    _until(lambda: srv.stats.saturated, "saturation with 4 connections in set-up")
    fifth = _idle(srv, "127.0.0.6")
    assert _closed_within(fifth, 1.0) and _counts(srv)["refused_cap"] == 1
    assert srv.stats.figures()["saturated"] == 1
    assert not any(_closed_within(s, 0.05) for s in held)
    held.pop().close()
    _until(lambda: not srv.stats.saturated, "a free set-up slot")
    assert _key_holder_call(srv) < AT_ONCE
    assert any("data_handshakes allows" in line for line in lines)
    for s in held + [third, fifth]:
        s.close()


def test_authenticated_connections_beyond_the_cap_are_refused_with_a_line(make_server):
    srv, lines = make_server(connections=1)
    first = SecureCalls(ROOT, {0: srv.address})
    second = SecureCalls(ROOT, {0: srv.address})
    try:
        assert first.call_sync(0, "echo", (1,), 10) == (1,)
        with pytest.raises(ConnectionError):
            second.call_sync(0, "echo", (2,), 10)
        assert _counts(srv)["refused_connections"] == 1
        assert any("1 authenticated connections are open, the most data_connections allows" in line
                   for line in lines)
        first.close()
        _until(lambda: not srv._conns, "the first connection's end on the listener")
        assert second.call_sync(0, "echo", (3,), 10) == (3,)
    finally:
        first.close()
        second.close()


# ---- slow set-ups ------------------------------------------------------------------------------------------

def _drip(sock, data: bytes, every: float, until: float) -> float:
    """Send ``data`` a byte per ``every`` seconds until the server closes ``sock``: seconds it took."""
    t0 = time.monotonic()
    for byte in data:
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - t0
        if select.select([sock], [], [], every)[0] and _closed_within(sock, 0.01):
            return time.monotonic() - t0
        if time.monotonic() - t0 > until:
            break
    raise AssertionError(f"a slow sender was still connected after {time.monotonic() - t0:.1f} s")


@pytest.mark.parametrize("mode", ["clear", "tls-hello", "tls-handshake"])
def test_a_slow_drip_is_dropped_at_the_absolute_deadline(make_server, pki, mode):
    tls = None if mode == "clear" else TlsServer(str(pki.server_cert), str(pki.server_key))
    deadline = 1.5
    srv, lines = make_server(tls=tls, handshake_timeout=deadline)
    raw = socket.create_connection((srv.host, srv.port), timeout=5)
    hello = MAGIC + bytes([VERSION]) + bytes(72)
    if mode == "tls-hello":   # TLS set up at once, the hello inside it dripped: a record per byte
        raw = client_tls(verify=False).wrap_socket(raw)
        took = _drip(raw, hello, 0.2, deadline + 5)
    elif mode == "tls-handshake":   # the TLS ClientHello itself dripped
        took = _drip(raw, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200), 0.2, deadline + 5)
    else:
        took = _drip(raw, hello, 0.2, deadline + 5)
    assert deadline - 0.1 <= took <= deadline + SLACK, f"dropped after {took:.2f} s (deadline {deadline} s)"
    _until(lambda: _counts(srv)["handshake_timeout"] == 1, "the timeout's count")
    assert any(f"no group handshake within {deadline:g} s" in line for line in lines)
    raw.close()
    ctx = None if tls is None else client_tls(verify=False)
    assert _key_holder_call(srv, ctx) < AT_ONCE


# ---- exhaustion --------------------------------------------------------------------------------------------

def test_out_of_file_descriptors_the_listener_backs_off_and_accepts_again(make_server):
    srv, lines = make_server()
    with _NoFiles() as nofiles:
        nofiles.free(1)
        queued = _idle(srv, "127.0.0.1")   # the last descriptor: the listener's accept fails (EMFILE)
        _until(lambda: _counts(srv)["accept_error"] >= 2, "accept errors (EMFILE) while no descriptor is free")
    t0 = time.monotonic()   # descriptors free again: the queued connection and a key holder are accepted
    latency = _key_holder_call(srv)
    assert time.monotonic() - t0 < BACKOFF_MAX + AT_ONCE
    assert _counts(srv)["accepted"] >= 2 and not _closed_within(queued, 0.05)
    assert sum("cannot accept a connection" in line for line in lines) == 1, lines   # one line per interval
    assert latency < BACKOFF_MAX + AT_ONCE
    queued.close()


def test_threads_that_do_not_start_cost_their_connection_not_the_listener(make_server, monkeypatch):
    srv, lines = make_server()
    real, failures = threading.Thread.start, [3]

    def start(thread):
        if thread.name.startswith("lst-") and failures[0] > 0:
            failures[0] -= 1
            raise RuntimeError("can't start new thread")
        return real(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    for _ in range(3):
        with pytest.raises(ConnectionError):
            _key_holder_call(srv)
    _until(lambda: _counts(srv)["thread_error"] == 3, "3 thread errors counted")
    assert failures == [0]
    assert _key_holder_call(srv) < BACKOFF_MAX + AT_ONCE
    assert any("cannot take the connection" in line and "can't start new thread" in line for line in lines)


# ---- frames of key holders ---------------------------------------------------------------------------------

def test_oversized_frames_are_refused_from_their_prefix_within_a_small_memory_bound(make_server):
    srv, lines = make_server(call_bytes=1 << 20)
    rss = _rss()
    socks = []
    for _ in range(20):   # each announces a 16 MiB header (the old limit) and sends 1 MiB of it
        sock, _conn = _authenticated(srv)
        sock.sendall(PREFIX.pack(16 << 20, 0))
        try:
            sock.sendall(os.urandom(1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass
        socks.append(sock)
    big_body, _conn = _authenticated(srv)
    big_body.sendall(PREFIX.pack(100, (1 << 20) + 1))
    assert all(_closed_within(s, 5.0) for s in socks + [big_body])
    _until(lambda: _counts(srv)["frame_refused"] == 21, "21 refused frames")
    assert (_rss() - rss) < 64 << 20, f"{(_rss() - rss) / 2**20:.0f} MiB more resident"
    assert any(f"exceeds this end's limits ({CALL_HEADER} + {1 << 20})" in line for line in lines)
    assert _key_holder_call(srv) < AT_ONCE
    for s in socks + [big_body]:
        s.close()


def test_an_undecodable_frame_ends_only_its_connection(make_server):
    srv, lines = make_server()
    for header in (b"[" * 60_000, b'{"k": "ok", "id": 1}', b"\xff\xfe"):   # too deep, not a call, not UTF-8
        sock, conn = _authenticated(srv)
        conn._send_sealed(PREFIX.pack(len(header), 0), header, [])
        assert _closed_within(sock, 5.0)
        sock.close()
    _until(lambda: _counts(srv)["frame_refused"] == 3, "3 refused frames")
    assert sum("a frame that does not decode" in line for line in lines) == 3
    assert _key_holder_call(srv) < AT_ONCE


# ---- metrics -----------------------------------------------------------------------------------------------

def test_the_listener_counts_reach_the_daemons_metrics(make_server):
    srv, _ = make_server(handshakes=1, handshakes_per_source=1, handshake_timeout=60)
    _key_holder_call(srv)
    idle = _idle(srv)
    _until(lambda: srv.stats.saturated, "saturation")
    extra = _idle(srv, "127.0.0.4")
    assert _closed_within(extra, 1.0)
    figures = srv.stats.figures()
    assert set(figures["counts"]) == set(LISTENER_KINDS)
    total = m.merge_figures(m.empty_figures(), {"listener": figures["counts"], "listener_saturated": 1})
    m.merge_figures(total, {"listener": figures["counts"], "listener_saturated": 0})   # a second worker
    m.merge_figures(total, {"listener": figures["counts"], "listener_saturated": 1}, gauges=False)   # a stopped one
    collector = m.ServerCollector.__new__(m.ServerCollector)
    families = {f.name: f for f in collector._listener(total)}
    counter = {s.labels["kind"]: s.value for s in families["graphfeed_data_path_listener"].samples}
    assert set(counter) == set(LISTENER_KINDS)
    assert counter["accepted"] == 3 * 3 and counter["authenticated"] == 3 and counter["refused_cap"] == 3
    assert families["graphfeed_data_path_saturated"].samples[0].value == 1
    assert {"graphfeed_data_path_listener_total", "graphfeed_data_path_saturated"} <= set(m.METRIC_NAMES)
    idle.close()
    extra.close()
