"""Groups (one session worker per trainer), their sessions, leases and the reaper.

Runs entirely on the daemon's event loop (no locks): every mutation happens between
awaits.  A group lives while its trainer renews the lease (Heartbeat) and its worker
is alive; otherwise the reaper removes it, stops the worker in the background
(SIGKILL after a grace) and logs one line.  Removing a group never affects others.
"""
from __future__ import annotations

import asyncio
import collections
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine

import grpc

from graphfeed.server.daemon.logs import EventLogger

REAP_INTERVAL = 0.25      # seconds between reaper scans (a dict scan + waitpid per group)
WORKER_STOP_GRACE = 5.0   # seconds a stopping worker gets before SIGKILL
GONE_KEPT = 1024          # reaped groups whose cause a late call is still told
STALL_SECONDS = 1.0       # a reaper scan this much later than due means the daemon itself did not run


def worker_exit_cause(handle) -> str:
    """How a session worker ended, for the log and the trainer: its signal's name or its exit code."""
    code = handle.exitcode()
    pid = getattr(handle, "pid", None)
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"session worker pid {pid} was killed by {name} (the server itself is alive)"
    return f"session worker pid {pid} exited with code {code} (the server itself is alive)"


class RequestError(Exception):
    """A request the daemon refuses: becomes the gRPC status ``code`` with ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Session:
    session_id: str
    group_id: str
    kind: str
    local_input_nodes: int
    epoch: int = -1


OPEN_KEYS_KEPT = 64    # OpenSession keys a group remembers (a trainer's retries of an open come within seconds)


@dataclass
class Group:
    group_id: str
    handle: Any
    peer: str
    lease_seconds: float
    deadline: float                  # monotonic time the lease lapses
    worker_name: str
    sessions: dict[str, Session] = field(default_factory=dict)
    secret_root: bytes = field(default=b"", repr=False)   # keys.group_root: the group's session secrets derive from it
    capability: bytes = field(default=b"", repr=False)   # every later call on the group carries it (never logged)
    # OpenSession by the trainer's open_key: a future of the reply (None: that delivery failed, open anew), so a
    # repeat the trainer sent after a timeout gets the session the first delivery opened (the last OPEN_KEYS_KEPT)
    opens: collections.OrderedDict[str, asyncio.Future] = field(default_factory=collections.OrderedDict, repr=False)

    def renew(self, now: float) -> None:
        self.deadline = now + self.lease_seconds

    def begin_open(self, key: str) -> asyncio.Future:
        """The future a repeat of OpenSession ``key`` waits on (resolve it with :meth:`end_open`)."""
        opening = asyncio.get_running_loop().create_future()
        self.opens[key] = opening
        self.opens.move_to_end(key)
        while len(self.opens) > OPEN_KEYS_KEPT:
            self.opens.popitem(last=False)
        return opening

    def end_open(self, key: str, opening: asyncio.Future, reply: Any) -> None:
        """The open of ``key`` ended: ``reply`` (None when it failed: a repeat opens anew)."""
        if reply is None and self.opens.get(key) is opening:
            del self.opens[key]
        if not opening.done():
            opening.set_result(reply)


class Registry:
    """Open groups and sessions, with limits and the counters GetStats reports."""

    def __init__(self, *, max_groups: int, max_sessions_per_group: int, log: EventLogger,
                 clock: Callable[[], float] = time.monotonic, stop_grace: float = WORKER_STOP_GRACE):
        self.max_groups = max_groups
        self.max_sessions_per_group = max_sessions_per_group
        self.log = log
        self.clock = clock
        self.stop_grace = stop_grace
        self.groups: dict[str, Group] = {}
        self.sessions: dict[str, Session] = {}
        self._pending_groups: set[str] = set()
        self._pending_sessions: dict[str, int] = {}
        self._stopping: set[asyncio.Task] = set()
        self._stopping_handles: list[Any] = []
        self._empty = asyncio.Event()
        self._empty.set()
        # Awaited before a group's worker is stopped (the metrics keep its last figures); must not raise.
        self.before_stop: Callable[[Group], Awaitable[None]] | None = None
        self.groups_opened_total = 0
        self.groups_reaped_total = 0
        self.sessions_opened_total = 0
        self.sessions_closed_total = 0
        self.sessions_reaped_total = 0
        self.sessions_expired_total = 0
        # reaped group / expired session -> why (a late call naming it is told)
        self.gone: collections.OrderedDict[str, str] = collections.OrderedDict()

    # ---- groups ----------------------------------------------------------------------------------

    def reserve_group(self, group_id: str) -> None:
        """Claim ``group_id`` before its worker starts (so concurrent opens cannot race)."""
        if group_id in self.groups or group_id in self._pending_groups:
            raise RequestError(grpc.StatusCode.ALREADY_EXISTS,
                               f"group {group_id!r} is already open on this server; use a new group_id "
                               f"or CloseGroup it first")
        if len(self.groups) + len(self._pending_groups) >= self.max_groups:
            # who holds them is other jobs' business: the operator sees them in the log and `graphfeed status`
            raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"this server already runs max_groups={self.max_groups} trainer groups; close "
                               f"clients you no longer use, or raise max_groups in the server config")
        self._pending_groups.add(group_id)
        self._empty.clear()

    def release_group(self, group_id: str) -> None:
        self._pending_groups.discard(group_id)
        self._update_empty()

    def add_group(self, group: Group) -> None:
        self._pending_groups.discard(group.group_id)
        self.groups[group.group_id] = group
        self.groups_opened_total += 1
        self._update_empty()

    def group(self, group_id: str) -> Group:
        """The open group ``group_id``; NOT_FOUND (saying why, when this server closed it) otherwise.  A group
        whose worker died is reaped here, at once, so its trainer learns of it on its next call."""
        group = self.groups.get(group_id)
        if group is not None and not group.handle.alive():
            self.remove_group(group_id, event="group_reap", cause=worker_exit_cause(group.handle))
            group = None
        if group is None:
            why = self.gone.get(group_id)
            raise RequestError(grpc.StatusCode.NOT_FOUND,
                               f"group {group_id!r} is not open on this server ("
                               f"{f'reaped: {why}' if why else 'closed, or reaped after its lease lapsed'}); "
                               f"open a new group")
        return group

    def remove_group(self, group_id: str, *, event: str, cause: str = "", grace: float | None = None) -> Group | None:
        """Forget the group and its sessions, stop its worker in the background, log ``event``."""
        group = self.groups.pop(group_id, None)
        if group is None:
            return None
        for sid in group.sessions:
            self.sessions.pop(sid, None)
        reaped = event == "group_reap"
        if reaped:
            self._remember(group_id, cause)
            self.groups_reaped_total += 1
            self.sessions_reaped_total += len(group.sessions)
        else:
            self.sessions_closed_total += len(group.sessions)
        fields = dict(group=group_id, peer=group.peer, worker_pid=getattr(group.handle, "pid", None),
                      sessions=len(group.sessions))
        if cause:
            fields["cause"] = cause
        (self.log.warning if reaped else self.log.info)(event, **fields)
        self._stop_worker(group, self.stop_grace if grace is None else grace)
        self._update_empty()
        return group

    def _stop_worker(self, group: Group, grace: float) -> None:
        self._track_stop(self._stop(group, grace))

    def stop_worker(self, group_id: str, handle: Any) -> None:
        """Stop, in the background, a worker no group holds: one whose OpenGroup's caller gave up before the
        worker was up.  Tracked like a reaped group's (a drain waits for it, a forced exit kills it)."""
        self._track_stop(self._stop_handle(group_id, handle, self.stop_grace))

    def _track_stop(self, stop: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(stop)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop(self, group: Group, grace: float) -> None:
        await self._before_stop(group)
        await self._stop_handle(group.group_id, group.handle, grace)

    async def _stop_handle(self, group_id: str, handle: Any, grace: float) -> None:
        self._stopping_handles.append(handle)
        try:
            code = await asyncio.to_thread(handle.stop, grace)
            self.log.debug("worker_stop", group=group_id, worker_pid=getattr(handle, "pid", None), exitcode=code)
        except Exception as exc:  # noqa: BLE001 -- never let a failed stop escape into the loop
            self.log.error("worker_stop_failed", group=group_id, cause=repr(exc))
        finally:
            self._stopping_handles.remove(handle)

    async def _before_stop(self, group: Group) -> None:
        if self.before_stop is None:
            return
        try:
            await self.before_stop(group)
        except Exception as exc:  # noqa: BLE001 -- the worker must be stopped regardless
            self.log.error("before_stop_failed", group=group.group_id, cause=repr(exc))

    def _update_empty(self) -> None:
        if not self.groups and not self._pending_groups:
            self._empty.set()
        else:
            self._empty.clear()

    # ---- sessions --------------------------------------------------------------------------------

    def reserve_session(self, group: Group) -> None:
        pending = self._pending_sessions.get(group.group_id, 0)
        if len(group.sessions) + pending >= self.max_sessions_per_group:
            kinds = collections.Counter(s.kind or "?" for s in group.sessions.values())
            held = ", ".join(f"{kind} x{n}" for kind, n in kinds.most_common(5))
            raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"group {group.group_id!r} of {group.peer} already has {len(group.sessions) + pending} "
                               f"of max_sessions_per_group={self.max_sessions_per_group} sessions open (loaders by "
                               f"kind: {held or 'opening'}); close() loaders you no longer use (or use `with`), "
                               f"or raise max_sessions_per_group in the server config")
        self._pending_sessions[group.group_id] = pending + 1

    def release_session(self, group: Group) -> None:
        left = self._pending_sessions.get(group.group_id, 1) - 1
        if left > 0:
            self._pending_sessions[group.group_id] = left
        else:
            self._pending_sessions.pop(group.group_id, None)

    def add_session(self, session: Session) -> None:
        group = self.group(session.group_id)
        group.sessions[session.session_id] = session
        self.sessions[session.session_id] = session
        self.sessions_opened_total += 1

    def session(self, session_id: str) -> tuple[Session, Group]:
        session = self.sessions.get(session_id)
        if session is None:
            why = self.gone.get(session_id) or "closed, or its group was reaped"
            raise RequestError(grpc.StatusCode.NOT_FOUND,
                               f"session {session_id!r} is not open on this server ({why}); open a new session")
        return session, self.group(session.group_id)

    def expire_session(self, session_id: str, cause: str) -> Session | None:
        """Forget an idle session; a later call naming it is told ``cause``."""
        session = self.remove_session(session_id)
        if session is not None:
            self.sessions_expired_total += 1
            self._remember(session_id, cause)
        return session

    def _remember(self, key: str, cause: str) -> None:
        self.gone[key] = cause
        while len(self.gone) > GONE_KEPT:
            self.gone.popitem(last=False)

    def remove_session(self, session_id: str) -> Session | None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            group = self.groups.get(session.group_id)
            if group is not None:
                group.sessions.pop(session_id, None)
            self.sessions_closed_total += 1
        return session

    # ---- leases and the reaper -------------------------------------------------------------------

    def expired(self) -> list[tuple[str, str]]:
        """``(group_id, cause)`` of every group whose worker died or whose lease lapsed."""
        now = self.clock()
        out = []
        for group in self.groups.values():
            if not group.handle.alive():
                out.append((group.group_id, worker_exit_cause(group.handle)))
            elif now > group.deadline:
                out.append((group.group_id, f"lease expired: no Heartbeat for {group.lease_seconds:g} s"))
        return out

    def reap_expired(self) -> int:
        found = self.expired()
        for group_id, cause in found:
            self.remove_group(group_id, event="group_reap", cause=cause)
        return len(found)

    def forgive_stall(self, stalled: float) -> None:
        """The daemon did not run for ``stalled`` seconds (SIGSTOP, a frozen VM, a blocked loop): it could not
        hear heartbeats meanwhile, so that time does not count against any lease -- a lease lapses only
        after ``lease_seconds`` of the daemon running without hearing the trainer."""
        for group in self.groups.values():
            group.deadline += stalled
        self.log.warning("daemon_stalled", seconds=round(stalled, 3), groups=len(self.groups),
                         cause="the daemon was paused or blocked; leases extended by the pause")

    async def run_reaper(self, interval: float = REAP_INTERVAL) -> None:
        last = self.clock()
        while True:
            now = self.clock()
            stalled = now - last - interval
            if stalled > STALL_SECONDS:
                self.forgive_stall(stalled)
            last = now
            try:
                self.reap_expired()
            except Exception as exc:  # noqa: BLE001 -- a broken handle must not stop the reaper
                self.log.error("reaper_error", cause=repr(exc))
            await asyncio.sleep(interval)

    # ---- drain -----------------------------------------------------------------------------------

    async def wait_empty(self, timeout: float) -> bool:
        """Wait until no group is open; False when ``timeout`` seconds passed first."""
        try:
            await asyncio.wait_for(self._empty.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def close_all(self, *, cause: str, grace: float | None = None) -> int:
        ids = list(self.groups)
        for group_id in ids:
            self.remove_group(group_id, event="group_close", cause=cause, grace=grace)
        return len(ids)

    async def wait_stopped(self, timeout: float) -> bool:
        """Wait for the background worker stops; False if some are still running after ``timeout``."""
        tasks = set(self._stopping)
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        return not pending

    def kill_all(self) -> None:
        """Forced exit: SIGKILL every worker now (open and stopping), synchronously."""
        import os

        for handle in [g.handle for g in self.groups.values()] + list(self._stopping_handles):
            pid = getattr(handle, "pid", None)
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
