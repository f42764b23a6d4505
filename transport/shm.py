"""The same-host batch channel: batches travel through a ring of shared-memory slots the trainer maps.

Set-up (:meth:`ShmChannel.open`, once per trainer group): for every part, the trainer creates
``slots`` segments of ``slot_bytes`` in ``/dev/shm`` (named ``graphfeed-shm-<trainer pid>-<group>-
p<part>-s<slot>``), writes a random token into each and asks that part's worker (torch RPC,
``attach``) to map them.  The worker answers with the tokens it read: equal tokens prove both
processes see the same ``/dev/shm``, i.e. share the host.  The trainer then unlinks every name at
once -- the mappings stay valid in both processes -- so from then on nothing is left in
``/dev/shm`` whichever process exits or is killed.  Only a trainer killed during the set-up
can leave names behind; :func:`sweep_stale` (run before every set-up) unlinks the segments of
trainers that are no longer alive.  A part whose worker cannot map the segments (another host,
other permissions, no room) is pulled over torch RPC; one log line says so.

A pull (``pull_into``) names a free slot; the worker copies the batch's tensors into it and
answers with their layout only (key, dtype, shape, offset), so the batch's bytes do not cross a
socket and the trainer allocates nothing per batch: the batch's tensors are views of the slot.
The slot is free again when the last of those tensors is freed (a finalizer on the buffer their
storage holds).  When every slot is taken, requests wait in order (backpressure); a request that
waited ``slot_wait`` seconds -- the trainer still holds every slot's batch -- is pulled over torch
RPC instead, so holding batches never hangs the loader.  A batch larger than a slot is answered
over torch RPC as well; the worker says how many bytes it needed.

Slots that grow (``max_slot_bytes``, what ``connect(shm_slot_mb=None)`` asks for): after such an
answer the channel's own thread makes a new generation of slots for that part, of the needed size
x 1.25 rounded up to a MiB (at most ``max_slot_bytes``), has the worker ``attach`` them beside the
old ones and swaps them in: new requests take new slots.  Slot ids are never reused, so a pull in
flight on an old slot cannot be confused with a new one.  An old slot is retired once it is free
(at once, or when the batch that holds it is freed): the trainer drops its map and the worker is
told to ``detach`` it, so the old generation's memory goes away on both sides.  A growth that fails
(no room in ``/dev/shm``, the worker cannot map) leaves the part on its old slots, with one log line.

Room: a segment's pages are reserved when it is made (``posix_fallocate``), so a full ``/dev/shm``
is an OSError at set-up or growth -- torch RPC, one log line -- and never a SIGBUS in the worker that
writes into a sparse segment past the tmpfs limit.
"""
from __future__ import annotations

import functools
import logging
import mmap
import os
import re
import secrets
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import torch

from graphfeed.transport import wire
from graphfeed.transport.calls import SYNC_SLACK, DataCalls
from graphfeed.transport.channel import BatchChannel, CallsChannel
from graphfeed.transport.path import PullChannel
from graphfeed.transport.pending import Pending
from graphfeed.transport.registry import SHM
from graphfeed.transport.shm_segments import PREFIX, SHM_DIR, create_segment, open_segment, sweep_stale, unlink_segment

log = logging.getLogger(__name__)

TOKEN_BYTES = 16
HEADER = 64          # bytes before a slot's payload (the token lives here)
ALIGN = 64           # every tensor starts at a multiple of this offset
WATCH_INTERVAL = 0.2  # seconds between checks for requests that waited too long for a slot (and growths)
OPEN_SLOTS = 2        # slots a ring opens with; the channel's thread adds the others at once (a group forms sooner)
STOP_POLL = 0.1       # seconds between checks whether the channel closed while its thread waits for a worker
MIB = 1 << 20
GROWTH = 1.25        # a grown slot holds the batch that asked for it x this, rounded up to a MiB


class ShmUnavailable(RuntimeError):
    """The ring could not be set up with any part (the caller falls back to torch RPC).

    ``no_room``: a part failed because this host could not reserve the segments (``/dev/shm`` full
    or too small), which an operator should hear about, rather than e.g. a server on another host."""

    def __init__(self, message: str, no_room: bool = False):
        super().__init__(message)
        self.no_room = no_room


class NoRoom(OSError):
    """The segments of a ring could not be reserved in ``/dev/shm`` (ENOSPC, ...)."""


# ---- the layout of a batch in a slot ---------------------------------------------------------------

@wire.register_record
@dataclass(frozen=True)
class Placed:
    """Where one tensor of a batch lies in a slot: byte ``offset`` from the slot's start, ``nbytes`` long."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def place(batch: dict[str, torch.Tensor], capacity: int) -> list[Placed] | None:
    """The layout of ``batch`` in a slot of ``capacity`` bytes, or None when it does not fit."""
    out, offset = [], HEADER
    for key, t in batch.items():
        n = t.numel() * t.element_size()
        out.append(Placed(key, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, n))
        offset += -(-n // ALIGN) * ALIGN
    return out if offset <= capacity else None


def _view(buf, p: Placed) -> torch.Tensor:
    dtype = wire.DTYPES.get(p.dtype)
    if dtype is None:
        raise ValueError(f"a shared-memory slot's tensor {p.key!r} has dtype {p.dtype!r}, not one of "
                         f"{', '.join(wire.DTYPES)}")
    if p.nbytes == 0:
        return torch.empty(p.shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=torch.uint8, count=p.nbytes, offset=p.offset).view(dtype).view(p.shape)


def write_batch(mm: mmap.mmap, batch: dict[str, torch.Tensor], layout: list[Placed]) -> None:
    """Copy ``batch``'s tensors into the slot ``mm`` as ``layout`` (:func:`place`) says."""
    for p in layout:
        if p.nbytes:
            _view(mm, p).copy_(batch[p.key])


def read_batch(mm: mmap.mmap, layout: list[Placed], on_free) -> dict[str, torch.Tensor]:
    """The batch in slot ``mm`` as views of it (no copy); ``on_free()`` runs once all of them are freed."""
    buf = memoryview(mm)
    weakref.finalize(buf, on_free)
    batch = {p.key: _view(buf, p) for p in layout}
    del buf          # the views' storages now hold the only references
    return batch


# ---- the worker's half ------------------------------------------------------------------------------

class RingWriter:
    """A worker's mappings of its trainer's slots (``slot id -> mmap``), added by ``attach``, dropped by ``detach``."""

    def __init__(self) -> None:
        self.slots: dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()

    def attach(self, names: Sequence[str], size: int, ids: Sequence[int] | None = None) -> list[bytes]:
        """Map ``names`` as slots ``ids`` (default ``0..``) beside those already attached, and unlink the
        names; returns each slot's token (its first bytes), or no token at all when a segment does not
        exist here: the trainer is on another host, an expected answer, not an error (no traceback in
        the server's log).  OSError if one exists but cannot be mapped; ValueError for an id already
        attached (slot ids are never reused: a pull in flight must not land in another generation's slot)."""
        ids = list(range(len(names))) if ids is None else [int(i) for i in ids]
        if len(ids) != len(names) or len(set(ids)) != len(ids):
            raise ValueError(f"attach needs one distinct slot id per segment, got {len(names)} names and ids {ids}")
        try:
            maps = [open_segment(name, int(size)) for name in names]
        except FileNotFoundError:
            return []
        finally:   # mapped or not, the names are no longer needed, whichever side dies first
            for name in names:
                unlink_segment(name)
        with self._lock:
            taken = sorted(set(ids) & set(self.slots))
            if taken:
                raise ValueError(f"slots {taken} are already attached: a new generation needs fresh slot ids")
            self.slots.update(zip(ids, maps))
        return [bytes(m[:TOKEN_BYTES]) for m in maps]

    def detach(self, ids: Sequence[int]) -> int:
        """Forget slots ``ids`` (retired by the trainer: neither in flight nor holding a batch); returns how
        many were attached.  The mapping goes with its last reference -- at once, as no copy into a
        retired slot runs -- so a copy still running could never write into unmapped memory."""
        with self._lock:
            return sum(self.slots.pop(int(i), None) is not None for i in ids)

    def answer(self, slot: int, batch: dict[str, torch.Tensor]):
        """What ``pull_into`` answers: ``("shm", layout)`` after copying ``batch`` into ``slot``, or
        ``("inline", batch, needed bytes)`` when it does not fit the slot."""
        mm = self.slots.get(int(slot))
        if mm is None:
            raise ValueError(f"slot {slot} is not attached on this worker: the trainer's ring was not set up here")
        layout = place(batch, len(mm))
        if layout is None:
            needed = place(batch, 1 << 62)
            return "inline", batch, (needed[-1].offset + needed[-1].nbytes) if needed else 0
        write_batch(mm, batch, layout)
        return SHM, layout


# ---- the trainer's half ----------------------------------------------------------------------------

@dataclass
class _Ask:
    args: tuple      # (session_id, secret, epoch, seq)
    pending: Pending
    since: float


def grown_size(needed: int) -> int:
    """The slot size for a batch of ``needed`` bytes: ``needed`` x :data:`GROWTH`, rounded up to a MiB."""
    return -(-int(needed * GROWTH) // MIB) * MIB


class _Ring:
    """One part's slots on the trainer: which are free, the requests waiting for one, and retired slots.

    ``maps`` holds the slots of the current generation and the retired ones still in flight or held
    by a batch; a retired slot leaves it (and goes to ``unmapped``, for the worker to detach) when it
    is released instead of becoming free.  The lock is re-entrant: a release may run in a finalizer,
    in whatever thread drops a batch's last tensor."""

    def __init__(self, channel: ShmChannel, part: int, maps: dict[int, mmap.mmap], slot_bytes: int):
        self.channel, self.part, self.maps, self.slot_bytes = channel, part, maps, slot_bytes
        self.slots = len(maps)
        self.next_id = max(maps) + 1
        self.free: deque[int] = deque(maps)
        self.waiting: deque[_Ask] = deque()
        self.retired: set[int] = set()
        self.unmapped: list[int] = []   # retired and released: the worker may drop them
        self.wanted = 0                 # slot bytes a too-big batch asked for (0: no growth asked)
        self.can_grow = True            # False once a growth failed: the part stays on its slots
        self.starved = False            # a request waited out the slot wait since the last release
        self.owed = 0                   # slots still to add (a ring opens with OPEN_SLOTS; the rest come after)
        self.lock = threading.RLock()

    def submit(self, ask: _Ask) -> bool:
        """Queue ``ask`` for a slot.  False (not queued) while the ring is starved: every slot is held and a
        request has already waited out the slot wait since the last release, so the caller pulls this one
        over the channel's calls at once (a trainer that keeps every batch, ``list(loader)``, would otherwise
        wait the slot wait again for every batch)."""
        with self.lock:
            if self.starved and not self.free:
                return False
            self.waiting.append(ask)
        self.pump()
        return True

    def pump(self) -> None:
        """Dispatch waiting requests while there are free slots (in request order)."""
        while True:
            with self.lock:
                if not self.waiting or not self.free:
                    return
                ask, slot = self.waiting.popleft(), self.free.popleft()
            self.channel.dispatch(self, slot, ask)

    def release(self, slot: int) -> None:
        with self.lock:
            if slot in self.retired:    # an old generation's slot: unmap it instead of reusing it
                self.retired.discard(slot)
                del self.maps[slot]     # the mapping goes with this last reference
                self.unmapped.append(slot)
                return
            self.free.append(slot)
            self.starved = False
        if not self.channel.closed:
            self.pump()

    def overdue(self, limit: float) -> list[_Ask]:
        """Remove and return the requests that waited longer than ``limit`` seconds for a slot."""
        now = time.monotonic()
        with self.lock:
            late = [a for a in self.waiting if now - a.since > limit]
            for a in late:
                self.waiting.remove(a)
            if late:
                self.starved = True
        return late

    def ask_growth(self, needed: int, cap: int) -> bool:
        """Note that a batch of ``needed`` bytes did not fit; False when slots of ``cap`` bytes would not hold it."""
        target = min(cap, grown_size(needed))
        with self.lock:
            if self.can_grow and target > max(self.slot_bytes, self.wanted):
                self.wanted = target
        return target >= needed

    def take_growth(self) -> tuple[int, list[int]]:
        """``(slot bytes, fresh slot ids)`` of the growth asked for, or ``(0, [])`` when none is due.  A growth
        makes every slot the ring is to have, those still owed included."""
        with self.lock:
            size, self.wanted = self.wanted, 0
            if not self.can_grow or size <= self.slot_bytes:
                return 0, []
            self.slots, self.owed = self.slots + self.owed, 0
            ids = list(range(self.next_id, self.next_id + self.slots))
            self.next_id += self.slots
        return size, ids

    def take_owed(self) -> tuple[int, list[int]]:
        """``(slot bytes, fresh slot ids)`` of the slots still owed, or ``(0, [])``."""
        with self.lock:
            if not self.owed:
                return 0, []
            ids = list(range(self.next_id, self.next_id + self.owed))
            self.next_id, self.owed = self.next_id + self.owed, 0
            return self.slot_bytes, ids

    def add(self, maps: dict[int, mmap.mmap], slot_bytes: int) -> None:
        """Add the owed slots ``maps`` (of ``slot_bytes``) as free ones; slots of a size the ring grew past
        meanwhile are dropped instead (the worker is told to unmap them)."""
        with self.lock:
            if slot_bytes != self.slot_bytes:
                self.unmapped += list(maps)
                return
            self.maps.update(maps)
            self.free.extend(maps)
            self.slots += len(maps)
        self.pump()

    def swap(self, maps: dict[int, mmap.mmap], slot_bytes: int) -> None:
        """Make ``maps`` the ring's slots: the old free ones are unmapped now, the others once released."""
        with self.lock:
            old_free = list(self.free)
            self.retired |= set(self.maps) - set(old_free)
            for slot in old_free:
                del self.maps[slot]
            self.unmapped += old_free
            self.maps.update(maps)
            self.free = deque(maps)
            self.slot_bytes = slot_bytes
        self.pump()

    def retire_all(self) -> None:
        """Unmap the free slots now and the others once released (the channel closed)."""
        with self.lock:
            for slot in self.free:
                del self.maps[slot]
            self.retired |= set(self.maps)
            self.free = deque()

    def take_unmapped(self) -> list[int]:
        with self.lock:
            ids, self.unmapped = self.unmapped, []
        return ids


class ShmChannel(BatchChannel):
    """Pulls through shared-memory rings for the parts whose workers share this host, torch RPC for the rest.

    ``slots`` slots of ``slot_bytes`` each per part, grown up to ``max_slot_bytes`` when a batch does
    not fit (None: fixed size); ``slot_wait`` seconds a request waits for a free slot before it is
    pulled over torch RPC instead.  Counters in :attr:`counts`: ``shm`` (batches through a slot),
    ``rpc`` (parts without a ring), ``too_big`` (batches larger than their slot, over torch RPC),
    ``slot_wait``, ``grown`` (rings that moved to larger slots), ``grow_failed``.
    """

    kind = SHM

    def __init__(self, rpc_timeout: float, slot_wait: float, max_slot_bytes: int | None = None, tag: str = "",
                 calls: DataCalls | None = None):
        super().__init__()
        if calls is None:
            from graphfeed.transport.torch_rpc import TorchRpcCalls

            calls = TorchRpcCalls()
        self.calls = calls
        self.rpc = CallsChannel(self.calls, rpc_timeout)   # parts without a ring, batches too big for a slot
        self.rpc_timeout, self.slot_wait = float(rpc_timeout), float(slot_wait)
        self.max_slot_bytes, self.tag = max_slot_bytes, tag
        self.rings: dict[int, _Ring] = {}
        self.counts = {SHM: 0, "rpc": 0, "too_big": 0, "slot_wait": 0, "grown": 0, "grow_failed": 0}
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._told: set[str] = set()

    @classmethod
    def open(cls, parts: Sequence[int], *, rpc_timeout: float, slots: int = 8, slot_bytes: int = 64 << 20,
             max_slot_bytes: int | None = None, slot_wait: float = 10.0, group: str = "",
             calls: DataCalls | None = None) -> ShmChannel:
        """Set up a ring with every part's worker that can map it; :class:`ShmUnavailable` if none can.
        ``calls``: how the workers are reached (default torch RPC); parts without a ring are pulled through it."""
        if slots < 1 or slot_bytes <= HEADER:
            raise ValueError(f"a ring needs at least 1 slot of more than {HEADER} bytes, got {slots} x {slot_bytes}")
        if max_slot_bytes is not None and max_slot_bytes < slot_bytes:
            raise ValueError(f"max_slot_bytes ({max_slot_bytes}) must be at least slot_bytes ({slot_bytes})")
        sweep_stale()
        tag = (re.sub(r"[^0-9a-f]", "", group.lower()) or secrets.token_hex(4))[-12:]
        channel = cls(rpc_timeout, slot_wait, max_slot_bytes, tag, calls)
        problems, no_room = {}, False
        first = min(slots, OPEN_SLOTS)   # reserving every slot's pages up front costs ~0.2 s per 64 MiB slot
        for part in parts:
            try:
                maps = _attach(channel.calls, part, tag, list(range(first)), slot_bytes, rpc_timeout)
                channel.rings[part] = _Ring(channel, part, maps, slot_bytes)
                channel.rings[part].owed = slots - first   # added by the channel's thread right after
            except Exception as exc:  # noqa: BLE001 -- any failure: this part is pulled over torch RPC
                problems[part] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                no_room = no_room or isinstance(exc, NoRoom)
        if not channel.rings:
            raise ShmUnavailable("; ".join(f"part {p}: {why}" for p, why in problems.items()), no_room)
        if problems:
            log.log(logging.WARNING if no_room else logging.INFO,
                    "batch channel: shared memory with parts %s, %s with parts %s (%s)",
                    sorted(channel.rings), channel.calls.label, sorted(problems), "; ".join(problems.values()))
        channel._watch = threading.Thread(target=channel._watch_rings, name="graphfeed-shm-watch", daemon=True)
        channel._watch.start()
        return channel

    def request(self, part: int, session_id: str, secret: bytes, epoch: int, seq: int) -> Pending:
        self._check_open()
        ring = self.rings.get(part)
        if ring is None:
            self.counts["rpc"] += 1
            return self.rpc.request(part, session_id, secret, epoch, seq)
        pending = Pending()
        if not ring.submit(_Ask((session_id, secret, epoch, seq), pending, time.monotonic())):
            self.counts["slot_wait"] += 1   # every slot is still held: not another slot wait for this one
            return self.rpc.request(part, session_id, secret, epoch, seq)
        return pending

    def sample(self, part: int, session_id: str, secret: bytes, node_ids, seed: int) -> Pending:
        """Online samples are small and rare: over the group's data-path calls, not a slot."""
        self._check_open()
        return self.rpc.sample(part, session_id, secret, node_ids, seed)

    def hot_rows(self, part: int, ntype: str, start: int, count: int, dtype: str | None) -> Pending:
        """Feature-cache chunks (once per loader): over the group's data-path calls, not a slot."""
        self._check_open()
        return self.rpc.hot_rows(part, ntype, start, count, dtype)

    def dispatch(self, ring: _Ring, slot: int, ask: _Ask) -> None:
        """Send ``pull_into`` for ``ask`` naming ``slot``; its answer settles ``ask.pending``."""
        session_id, secret, epoch, seq = ask.args
        try:
            answer = self.calls.call(ring.part, "pull_into", (session_id, epoch, seq, secret, slot), self.rpc_timeout)
        except Exception as exc:  # noqa: BLE001 -- e.g. the group is shut down: the pull fails, the slot is free
            ring.release(slot)
            ask.pending.set_exception(exc)
            return
        answer.add_done_callback(lambda p: self._settle(ring, slot, ask.pending, p))

    def _settle(self, ring: _Ring, slot: int, pending: Pending, inner: Pending) -> None:
        try:
            answer = inner.result()
        except Exception as exc:  # noqa: BLE001 -- the pull's error goes to the loader, which names the server
            ring.release(slot)
            pending.set_exception(exc)
            return
        if answer[0] == SHM:
            self.counts[SHM] += 1
            pending.set_result(read_batch(ring.maps[slot], answer[1], lambda: ring.release(slot)))
            return
        size = len(ring.maps[slot])
        ring.release(slot)
        self.counts["too_big"] += 1
        self._too_big(ring, size, int(answer[2]))
        pending.set_result(answer[1])

    def _too_big(self, ring: _Ring, size: int, needed: int) -> None:
        """A batch of ``needed`` bytes came over torch RPC as slot of ``size`` bytes could not hold it: ask the
        ring to grow (it grows on this channel's thread, never in a torch RPC callback), or say what to raise."""
        what = f"a batch of {needed / MIB:.1f} MiB does not fit a shared-memory slot of {size / MIB:.1f} MiB"
        if self.max_slot_bytes is None:
            self._tell("too_big", f"{what} and came over {self.calls.label}: raise shm_slot_mb in connect() (or "
                                  f"leave it unset: slots then grow to the batches) to keep such batches in shared "
                                  f"memory")
        elif not ring.ask_growth(needed, self.max_slot_bytes):
            self._tell("too_big", f"{what} nor the largest slot allowed ({self.max_slot_bytes / MIB:.0f} MiB) and "
                                  f"came over {self.calls.label}: raise shm_max_slot_mb in connect() to keep such "
                                  f"batches in shared memory")

    def _watch_rings(self) -> None:
        """The channel's thread: requests that waited too long for a slot, growths, and retired slots."""
        while not self._stop.wait(WATCH_INTERVAL):
            for ring in list(self.rings.values()):
                try:
                    self._pull_overdue(ring)
                    self._add_owed(ring)
                    self._grow(ring)
                    self._detach_unmapped(ring)
                except Exception:  # noqa: BLE001 -- this thread must outlive any one failure: it bounds the waits
                    log.exception("shared-memory channel: checking part %d's ring failed", ring.part)

    def _pull_overdue(self, ring: _Ring) -> None:
        for ask in ring.overdue(self.slot_wait):
            self.counts["slot_wait"] += 1
            self._tell("slot_wait", f"every shared-memory slot of part {ring.part} is held by a batch the "
                                    f"trainer still references after {self.slot_wait:g} s; pulling over "
                                    f"{self.calls.label} meanwhile (drop batches sooner or raise shm_slots)")
            pulled = self.rpc.request(ring.part, *ask.args)
            pulled.add_done_callback(functools.partial(_forward, dst=ask.pending))

    def _add_owed(self, ring: _Ring) -> None:
        """Give ``ring`` the slots it opened without; on failure it keeps the slots it has (one log line)."""
        size, ids = ring.take_owed()
        if not ids or self._stop.is_set():
            return
        try:
            maps = _attach(self.calls, ring.part, self.tag, ids, size, self.rpc_timeout, stop=self._stop)
        except Exception as exc:  # noqa: BLE001 -- any failure: the part works on the slots it has
            with ring.lock:
                ring.unmapped += ids   # in case the worker mapped some of them before the failure
            if not self._stop.is_set():
                log.warning("shared-memory ring of part %d keeps %d slots: adding %d more failed (%s)", ring.part,
                            ring.slots, len(ids), f"{type(exc).__name__}: {exc}".splitlines()[0])
            return
        if self._stop.is_set():   # closed meanwhile: these slots are retired at once
            with ring.lock:
                ring.unmapped += ids
            return
        ring.add(maps, size)

    def _grow(self, ring: _Ring) -> None:
        """Give ``ring`` the larger slots a too-big batch asked for; on failure it keeps its slots for good."""
        size, ids = ring.take_growth()
        if not ids or self._stop.is_set():
            return
        old = ring.slot_bytes
        try:
            maps = _attach(self.calls, ring.part, self.tag, ids, size, self.rpc_timeout, stop=self._stop)
        except Exception as exc:  # noqa: BLE001 -- any failure: the part stays on its slots, batches too big use RPC
            with ring.lock:
                ring.can_grow = False
                ring.unmapped += ids   # in case the worker mapped some of them before the failure
            if self._stop.is_set():
                return
            self.counts["grow_failed"] += 1
            log.warning("shared-memory ring of part %d: could not grow its slots from %.0f to %.0f MiB (%s); batches "
                        "over %.0f MiB keep coming over %s", ring.part, old / MIB, size / MIB,
                        f"{type(exc).__name__}: {exc}".splitlines()[0], old / MIB, self.calls.label)
            return
        ring.swap(maps, size)
        self.counts["grown"] += 1
        log.info("shared-memory ring of part %d grew: %d slots of %.0f -> %.0f MiB", ring.part, len(ids),
                 old / MIB, size / MIB)

    def _detach_unmapped(self, ring: _Ring) -> None:
        """Tell the worker to drop the retired slots the trainer has unmapped (fire and forget: a worker
        that is gone has dropped them already)."""
        ids = ring.take_unmapped()
        if not ids:
            return
        try:
            answer = self.calls.call(ring.part, "detach", (ids,), self.rpc_timeout)
        except Exception as exc:  # noqa: BLE001 -- the group is gone: so are the worker's maps
            log.debug("detach of part %d's slots %s not sent: %s", ring.part, ids, exc)
            return
        answer.add_done_callback(lambda p: _ignore_error(p, ring.part))

    def _tell(self, what: str, message: str) -> None:
        if what not in self._told:
            self._told.add(what)
            log.warning("%s", message)

    def close(self) -> None:
        super().close()
        self.rpc.close()
        self._stop.set()
        for ring in self.rings.values():
            with ring.lock:
                waiting, ring.waiting = list(ring.waiting), deque()
            for ask in waiting:
                ask.pending.set_exception(RuntimeError("the shared-memory batch channel was closed"))
        if self._watch is not None:
            self._watch.join(timeout=5.0)
        for ring in self.rings.values():
            # free slots are unmapped now; a slot a batch still holds stays mapped until the batch is freed
            ring.retire_all()


def _attach(calls: DataCalls, part: int, tag: str, ids: list[int], slot_bytes: int,
            timeout: float, stop: threading.Event | None = None) -> dict[int, mmap.mmap]:
    """Create one segment per slot id (:class:`NoRoom` when they cannot be reserved), have part ``part``'s
    worker map them, check the tokens, unlink the names; ``{slot id: map}``.  ``stop`` set (the channel closes)
    ends the wait for the worker at once: a frozen worker must not hold up the channel's close."""
    names = [f"{PREFIX}{os.getpid()}-{tag}-p{part}-s{k}" for k in ids]
    maps: list[mmap.mmap] = []
    try:
        tokens = []
        for name in names:
            try:
                mm = create_segment(name, slot_bytes)
            except OSError as exc:
                raise NoRoom(exc.errno, f"cannot reserve {len(names)} x {slot_bytes / MIB:.1f} MiB in {SHM_DIR}: "
                                        f"{exc.strerror or exc}") from exc
            maps.append(mm)
            tokens.append(secrets.token_bytes(TOKEN_BYTES))
            mm[:TOKEN_BYTES] = tokens[-1]
        got = _answer(calls.call(part, "attach", (names, slot_bytes, ids), timeout), timeout + SYNC_SLACK, stop)
        if not got:
            raise ShmUnavailable("its worker is on another host (no such segment in its /dev/shm)")
        if list(got) != tokens:
            raise ShmUnavailable("the worker mapped different segments (it does not share this host's /dev/shm)")
        return dict(zip(ids, maps))
    finally:
        for name in names:
            unlink_segment(name)


def _answer(answer: Pending, timeout: float, stop: threading.Event | None):
    """``answer``'s result within ``timeout`` s (TimeoutError after), or ShmUnavailable once ``stop`` is set."""
    deadline = time.monotonic() + timeout
    while not answer.wait_done(STOP_POLL if stop is not None else timeout):
        if stop is not None and stop.is_set():
            raise ShmUnavailable("the channel closed while its worker had not answered")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the worker did not answer within {timeout:g} s")
    return answer.result()


def _forward(src: Pending, dst: Pending) -> None:
    try:
        dst.set_result(src.result())
    except Exception as exc:  # noqa: BLE001 -- the pull's error, as the torch RPC channel gives it
        dst.set_exception(exc)


def _ignore_error(answer: Pending, part: int) -> None:
    try:
        answer.result()
    except Exception as exc:  # noqa: BLE001 -- the worker (and its maps) may be gone
        log.debug("detach on part %d failed: %s", part, exc)


# seconds a pull waits for a free shared-memory slot before it goes over the data path.  A loop that drops
# each batch never waits (slots > prefetch + 1); one that keeps every batch (``list(loader)``) can
# never free a slot, so each of its pulls would wait this long: keep it short.
SHM_SLOT_WAIT = 2.0
# MiB of a shared-memory slot before it grows to the batches (``shm_slot_mb=None``, the default)
SHM_START_MB = 64.0


class ShmPulls(PullChannel):
    """Pulls through shared-memory rings with the servers on this host, over the data path for the others."""

    def open(self, parts: Sequence[int], calls: DataCalls, *, group: str, rpc_timeout: float,
             **options) -> BatchChannel:
        """``options``: ``shm_slots`` slots per server of ``shm_slot_mb`` MiB (None: from :data:`SHM_START_MB`,
        grown to the batches up to ``shm_max_slot_mb``).  Pulls through ``calls`` for all when no ring can be set up
        (one log line)."""
        slot_mb, max_slot_mb = options["shm_slot_mb"], options["shm_max_slot_mb"]
        max_bytes: int | None = None
        if slot_mb is None:   # slots grow to the batches, from SHM_START_MB up to max_slot_mb
            max_bytes = int(max_slot_mb * 2**20)
            slot_bytes = min(int(SHM_START_MB * 2**20), max_bytes)
        else:
            slot_bytes = int(slot_mb * 2**20)
        try:
            return ShmChannel.open(parts, rpc_timeout=rpc_timeout, slots=options["shm_slots"], slot_bytes=slot_bytes,
                                   max_slot_bytes=max_bytes, slot_wait=min(SHM_SLOT_WAIT, rpc_timeout / 2),
                                   group=group, calls=calls)
        except ShmUnavailable as exc:
            log.log(logging.WARNING if exc.no_room else logging.INFO,
                    "batch channel: %s (no shared-memory ring: %s)", calls.label, exc)
        except OSError as exc:   # the trainer's own segments could not be made (no /dev/shm, no room)
            log.warning("batch channel: %s (shared-memory ring could not be allocated: %s)", calls.label, exc)
        return CallsChannel(calls, rpc_timeout)


CHANNEL = ShmPulls()
