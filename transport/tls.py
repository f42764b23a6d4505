"""TLS over a blocking socket through memory BIOs: large socket reads and writes instead of one syscall per record.

:class:`ssl.SSLSocket` reads one TLS record (at most 16 KiB of data) per ``recv_into`` call, and
OpenSSL reads each record with two ``read`` syscalls (its 5-byte header, then its body); it
writes one ``write`` syscall per record.  A data-path frame of megabytes is thousands of records,
so the syscalls and the TCP work per call cost about as much CPU as AES-GCM itself.

:class:`TlsStream` drives an :class:`ssl.SSLObject` with a pair of :class:`ssl.MemoryBIO`:

* receive: one ``recv_into`` of up to :data:`READ_CHUNK` bytes into a reused buffer feeds the
  incoming BIO, then ``SSLObject.read`` decrypts record after record straight into the caller's
  buffer (the destination tensor) until the BIO runs dry;
* send: plaintext goes to ``SSLObject.write`` in slices of :data:`WRITE_CHUNK` bytes (small pieces
  of one call -- a frame's prefix, header and small buffers -- are first joined, so they share
  records), and each slice's records leave in one ``sendall``.

The TLS protocol on the wire is unchanged (the peer may use an :class:`ssl.SSLSocket`).  The
record layer's keys, sequence numbers and MACs are OpenSSL's; this module only moves bytes.

Threads: one reader (:meth:`recv_into`) and any number of senders (:meth:`sendall`, serialised by
a lock).  Every call into the SSL object holds ``_tls_lock`` and never blocks in it (memory BIOs
do not block), so the reader and a sender never wait on each other's network I/O.
"""
from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Iterable

READ_CHUNK = 256 << 10  # bytes per socket read (16 records; a partial one waits in the BIO): this buffer and the
                        # BIO's copy of it stay in a core's L2 cache (1 MiB) while OpenSSL decrypts out of them
WRITE_CHUNK = 64 << 10  # plaintext bytes per SSLObject.write: 4 records, one sendall; its encrypted copy stays
                        # below glibc's mmap threshold (128 KiB), so it reuses heap memory instead of fresh pages


class TlsStream:
    """A TLS connection over the blocking socket ``sock`` (handshake done by the constructor, bounded by
    ``timeout`` seconds in all: :class:`socket.timeout` past it, :class:`ssl.SSLError` for a failed one).

    Offers what :class:`~graphfeed.transport.secure.Connection` needs of a socket: ``recv_into``,
    ``sendall`` (and :meth:`sendall_pieces`), ``shutdown``, ``close``, ``settimeout``, ``cipher`` and
    ``getpeercert``.  End of stream (a close, with or without TLS's close_notify) reads as 0 bytes.
    """

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, *, server_side: bool, timeout: float | None):
        self.sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=server_side)
        self._rbuf = memoryview(bytearray(READ_CHUNK))
        self._tls_lock = threading.Lock()     # every SSLObject / BIO call
        self._send_lock = threading.Lock()    # socket writes, in the order their bytes left the SSL object
        self._eof = False
        self._handshake(timeout)

    # ---- set-up ----------------------------------------------------------------------------------------

    def _handshake(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise socket.timeout("TLS handshake timed out") from None
                    self.sock.settimeout(left)
                if not self._fill():
                    raise ssl.SSLEOFError("the peer closed the connection during the TLS handshake") from None
        self._flush()   # the last flight (a client's Finished; a server's tickets, if any)
        self.sock.settimeout(timeout)

    # ---- receive ---------------------------------------------------------------------------------------

    def _fill(self) -> bool:
        """One socket read into the incoming BIO; False at the end of the stream."""
        k = self.sock.recv_into(self._rbuf, READ_CHUNK)
        with self._tls_lock:
            if k == 0:
                self._in.write_eof()
            else:
                self._in.write(self._rbuf[:k])
        return k > 0

    def recv_into(self, view, nbytes: int = 0, flags: int = 0) -> int:
        """Decrypted bytes into ``view`` (at most ``nbytes``, default its length): at least one -- as many as the
        bytes already received hold -- or 0 at the end of the stream.  ``flags`` must be 0."""
        if flags:
            raise ValueError("TlsStream.recv_into takes no flags")
        view = memoryview(view).cast("B")
        n = nbytes or len(view)
        while True:
            got = self._drain(view, n)
            if got or self._eof:
                return got
            if not self._fill():
                self._eof = True   # the next drain says how it ended (close_notify or not): 0 bytes either way

    def _drain(self, view: memoryview, n: int) -> int:
        """Decrypt the whole records the incoming BIO holds into ``view[:n]``, holding the lock once for all."""
        got = 0
        read = self._obj.read
        with self._tls_lock:
            try:
                while got < n:
                    k: int = read(n - got, view[got:n])   # type: ignore[assignment]  # into a buffer: a count
                    if not k:
                        break
                    got += k
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True
            answer = self._out.pending
        if answer:   # the reads made TLS answer (a key update): send it unless a sender will
            self._flush_if_free()
        return got

    # ---- send ------------------------------------------------------------------------------------------

    def sendall(self, data) -> None:
        self.sendall_pieces((data,))

    def sendall_pieces(self, pieces: Iterable) -> None:
        """Send the pieces' bytes in order: small pieces joined, large ones in :data:`WRITE_CHUNK` slices."""
        with self._send_lock:
            staged = bytearray()
            for piece in pieces:
                view = memoryview(piece).cast("B")
                if len(staged) + len(view) <= WRITE_CHUNK:
                    staged += view
                    continue
                if staged:
                    self._write(staged)
                    staged = bytearray()
                for start in range(0, len(view), WRITE_CHUNK):
                    part = view[start:start + WRITE_CHUNK]
                    if len(part) < WRITE_CHUNK:
                        staged += part
                    else:
                        self._write(part)
            if staged:
                self._write(staged)

    def _write(self, data) -> None:
        with self._tls_lock:
            self._obj.write(data)
            out = self._out.read()
        self.sock.sendall(out)

    def _flush(self) -> None:
        with self._tls_lock:
            out = self._out.read() if self._out.pending else b""
        if out:
            self.sock.sendall(out)

    def _flush_if_free(self) -> None:
        # A sender holding the lock flushes these bytes with its own (after them, in the BIO's order).
        if self._send_lock.acquire(blocking=False):
            try:
                self._flush()
            finally:
                self._send_lock.release()

    # ---- the socket's other calls ------------------------------------------------------------------------

    def cipher(self):
        return self._obj.cipher()

    def getpeercert(self, binary_form: bool = False):
        return self._obj.getpeercert(binary_form)

    def settimeout(self, value: float | None) -> None:
        self.sock.settimeout(value)

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()
