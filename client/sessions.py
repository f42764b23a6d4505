"""A loader's sessions on every server, opened, started, re-opened and closed in parallel.

A remote loader (and each option set of online sampling) is one session per server.  A
:class:`SessionSet` holds them (ids, secrets and the servers' input counts, in part order) and
makes every control call to all servers at once on the client's bounded control pool
(:func:`on_all`), so opening or starting an epoch costs one round trip, not one per server.
After the client re-forms its data-path group (a server restarted), :meth:`Client.recover
<graphfeed.client.client.Client.recover>` re-opens every tracked set (:meth:`SessionSet.reopen`);
the servers must then report the same input counts (same partition, same inputs).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, TypeVar

from graphfeed.client.errors import ServerError
from graphfeed.proto import control_pb2 as pb

if TYPE_CHECKING:
    from graphfeed.client.cluster import ServerConn
    from graphfeed.client.view import ClientView

T = TypeVar("T")
CLOSE_TIMEOUT = 5.0     # seconds for one CloseSession (a gone server's reaper cleans up after it)
CONTROL_THREADS = 16    # at most this many control calls in flight per client


def on_all(pool: Executor, servers: Sequence[ServerConn], call: Callable[[ServerConn], T]) -> list[T]:
    """``call(server)`` for every server at once on ``pool``; the answers in server order.  Waits for
    every call (each is bounded by its own timeout), then raises the first server's error, in server
    order, if any failed."""
    futures = [pool.submit(call, s) for s in servers]
    errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [f.result() for f in futures]


class SessionSet:
    """One session per server of the request ``request()`` builds (an ``OpenSessionRequest``; called
    again for each (re-)open, so it names the client's current group).  ``track=False``: the client does
    not re-open the set after re-forming its group (online sampling opens a new set at its next use).

    ``ids``, ``secrets`` and ``counts`` (each server's ``local_input_nodes``) are in part order once
    :meth:`open` returned.  The set is tracked by the client while open, which re-opens it after
    re-forming the group; :meth:`close` closes every session and stops the tracking.
    """

    def __init__(self, client: ClientView, request: Callable[[], pb.OpenSessionRequest], *, track: bool = True):
        self.client = client
        self._request = request
        self._track = track
        self.ids: tuple[str, ...] = ()
        self.live_ids: list[str] = []   # ids, updated in place (a dropped loader's finalizer reads them)
        self.secrets: tuple[bytes, ...] = ()
        self.counts: tuple[int, ...] = ()
        self.generation = -1        # the client's group generation the sessions belong to
        self.closed = False

    def open(self) -> SessionSet:
        """Open a session on every server at once; on any failure close those that opened and raise the
        first server's error (:class:`ServerError`, or the control plane's class for a refused spec)."""
        generation, replies = self._open_all()
        self._set_ids(tuple(r.session_id for r in replies))
        self.secrets = self._secrets(replies)
        self.counts = tuple(int(r.local_input_nodes) for r in replies)
        self.generation = generation
        if self._track:
            self.client.track(self)
        return self

    def _secrets(self, replies: list[pb.OpenSessionReply]) -> tuple[bytes, ...]:
        """Each session's secret, in part order: derived from the group's key as the daemons derive them (a server
        that still sends one in its reply: that one)."""
        group = self.client.group
        return tuple(bytes(r.session_secret) or group.session_secret(s.part, r.session_id)
                     for s, r in zip(self.client.servers, replies))

    def _open_all(self) -> tuple[int, list[pb.OpenSessionReply]]:
        client = self.client
        generation, req = client.generation, self._request()
        req.open_key = uuid.uuid4().hex   # a repeat of this open (no answer in time) gets the first's session
        opened: dict[int, str] = {}

        def open_one(s: ServerConn) -> pb.OpenSessionReply:
            reply = s.call("OpenSession", req, timeout=client.timeout)
            opened[s.part] = reply.session_id
            return reply

        try:
            return generation, on_all(client.control_pool, client.servers, open_one)
        except BaseException:
            self._close_ids({part: sid for part, sid in opened.items()})
            raise

    def start_epoch(self, epoch: int, start: int) -> list[int]:
        """StartEpoch on every server at once (each produces its batches at positions ``>= start``, planned
        from :attr:`counts`); the number of batches each server plans, in part order."""
        def start_one(s: ServerConn) -> int:
            req = pb.StartEpochRequest(session_id=self.ids[s.part], epoch=epoch, part_input_counts=self.counts,
                                       start_seq=start)
            return int(s.call("StartEpoch", req, timeout=self.client.timeout).num_batches)

        return on_all(self.client.control_pool, self.client.servers, start_one)

    def _set_ids(self, ids: tuple[str, ...]) -> None:
        self.ids = ids
        self.live_ids[:] = ids

    def reopen(self, close_old: bool = False) -> None:
        """Open the sessions again on the client's (re-formed) group.  ServerError naming the servers when
        they now report other input counts (the partition changed: the running epoch cannot resume).
        ``close_old``: the group is the same (a server expired one of the sessions for being idle): close the
        others first, so none is left behind."""
        if self.closed:
            return
        if close_old:
            self._close_ids(dict(enumerate(self.ids)))
        before = self.counts
        generation, replies = self._open_all()
        counts = tuple(int(r.local_input_nodes) for r in replies)
        if before and counts != before:
            self._close_ids({p: r.session_id for p, r in enumerate(replies)})
            raise ServerError(", ".join(s.name for s in self.client.servers),
                              f"after the restart the servers report input counts {list(counts)}, before "
                              f"{list(before)}: the partition changed; cannot resume")
        self._set_ids(tuple(r.session_id for r in replies))
        self.secrets = self._secrets(replies)
        self.counts, self.generation = counts, generation

    def close(self) -> None:
        """Close every session (servers that are gone reap them) and stop the client's tracking; idempotent.
        Sessions of an earlier group generation went with its workers: nothing to close."""
        if self.closed:
            return
        self.closed = True
        self.client.untrack(self)
        self.live_ids.clear()
        if self.generation == self.client.generation:
            self._close_ids(dict(enumerate(self.ids)))

    def _close_ids(self, ids: dict[int, str]) -> None:
        """CloseSession of ``ids`` (part -> session id) at once; failures are ignored."""
        def close_one(s: ServerConn) -> None:
            if s.part in ids:
                try:
                    s.call("CloseSession", pb.CloseSessionRequest(session_id=ids[s.part]), timeout=CLOSE_TIMEOUT)
                except Exception:  # noqa: BLE001 -- the server may be gone; its reaper cleans up
                    pass

        if ids:
            on_all(self.client.control_pool, self.client.servers, close_one)
