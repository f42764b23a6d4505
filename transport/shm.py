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
over torch RPC as well (one log line names the setting to raise).
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

from graphfeed.core.process import pid_alive
from graphfeed.transport import rpc_group
from graphfeed.transport.channel import BatchChannel
from graphfeed.transport.pending import Pending
from graphfeed.transport.torch_rpc import TorchRpcChannel, settle

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "graphfeed-shm-"
NAME_RE = re.compile(r"^graphfeed-shm-(\d+)-[0-9a-f]+-p\d+-s\d+$")
TOKEN_BYTES = 16
HEADER = 64          # bytes before a slot's payload (the token lives here)
ALIGN = 64           # every tensor starts at a multiple of this offset
WATCH_INTERVAL = 0.2  # seconds between checks for requests that waited too long for a slot


class ShmUnavailable(RuntimeError):
    """The ring could not be set up with any part (the caller falls back to torch RPC)."""


# ---- segments --------------------------------------------------------------------------------------

def segment_path(name: str) -> str:
    """The file of segment ``name``; ValueError unless ``name`` is a graphfeed segment name."""
    if not NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a graphfeed shared-memory segment name")
    return os.path.join(SHM_DIR, name)


def create_segment(name: str, size: int) -> mmap.mmap:
    """A new segment of ``size`` bytes (mode 0600), mapped; FileExistsError/OSError as the OS raises."""
    fd = os.open(segment_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except BaseException:
        os.unlink(segment_path(name))
        raise
    finally:
        os.close(fd)


def open_segment(name: str, size: int) -> mmap.mmap:
    """Map the existing segment ``name``; OSError (FileNotFoundError on another host) if it cannot."""
    fd = os.open(segment_path(name), os.O_RDWR)
    try:
        if os.fstat(fd).st_size != size:
            raise OSError(f"segment {name} has {os.fstat(fd).st_size} bytes, expected {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unlink_segment(name: str) -> None:
    """Remove ``name`` from ``/dev/shm`` (mappings stay valid); a name already gone is fine."""
    try:
        os.unlink(segment_path(name))
    except FileNotFoundError:
        pass


def list_segments() -> list[str]:
    """Names of graphfeed segments in ``/dev/shm`` now."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if NAME_RE.match(n))
    except FileNotFoundError:
        return []


def sweep_stale() -> list[str]:
    """Unlink the segments of trainers that are no longer alive (killed during a ring set-up); returns them."""
    removed = []
    for name in list_segments():
        match = NAME_RE.match(name)
        if match and not pid_alive(int(match.group(1))):
            unlink_segment(name)
            removed.append(name)
    return removed


# ---- the layout of a batch in a slot ---------------------------------------------------------------

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
    dtype = getattr(torch, p.dtype)
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
    """A worker's mappings of its trainer's slots (``slot -> mmap``), filled by ``attach``."""

    def __init__(self) -> None:
        self.slots: dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()

    def attach(self, names: Sequence[str], size: int) -> list[bytes]:
        """Map ``names`` as slots ``0..`` and unlink them; returns each slot's token (its first bytes).
        OSError if any cannot be mapped (e.g. FileNotFoundError: the trainer is on another host)."""
        maps = [open_segment(name, int(size)) for name in names]
        for name in names:   # mapped: the names are no longer needed, whichever side dies first
            unlink_segment(name)
        with self._lock:
            self.slots = dict(enumerate(maps))
        return [bytes(m[:TOKEN_BYTES]) for m in maps]

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
        return "shm", layout


# ---- the trainer's half ----------------------------------------------------------------------------

@dataclass
class _Ask:
    args: tuple      # (session_id, secret, epoch, seq)
    pending: Pending
    since: float


class _Ring:
    """One part's slots on the trainer: which are free, and the requests waiting for one."""

    def __init__(self, channel: ShmChannel, part: int, maps: list[mmap.mmap]):
        self.channel, self.part, self.maps = channel, part, maps
        self.free: deque[int] = deque(range(len(maps)))
        self.waiting: deque[_Ask] = deque()
        self.lock = threading.Lock()

    def submit(self, ask: _Ask) -> None:
        with self.lock:
            self.waiting.append(ask)
        self.pump()

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
            self.free.append(slot)
        if not self.channel.closed:
            self.pump()

    def overdue(self, limit: float) -> list[_Ask]:
        """Remove and return the requests that waited longer than ``limit`` seconds for a slot."""
        now = time.monotonic()
        with self.lock:
            late = [a for a in self.waiting if now - a.since > limit]
            for a in late:
                self.waiting.remove(a)
        return late


class ShmChannel(BatchChannel):
    """Pulls through shared-memory rings for the parts whose workers share this host, torch RPC for the rest.

    ``slots`` slots of ``slot_bytes`` each per part; ``slot_wait`` seconds a request waits for a
    free slot before it is pulled over torch RPC instead.  Counters in :attr:`counts`:
    ``shm`` (batches through a slot), ``rpc`` (parts without a ring), ``too_big``, ``slot_wait``.
    """

    kind = "shm"

    def __init__(self, rpc_timeout: float, slot_wait: float):
        super().__init__()
        self.rpc = TorchRpcChannel(rpc_timeout=rpc_timeout)
        self.rpc_timeout, self.slot_wait = float(rpc_timeout), float(slot_wait)
        self.rings: dict[int, _Ring] = {}
        self.counts = {"shm": 0, "rpc": 0, "too_big": 0, "slot_wait": 0}
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._told: set[str] = set()

    @classmethod
    def open(cls, parts: Sequence[int], *, rpc_timeout: float, slots: int = 8, slot_bytes: int = 64 << 20,
             slot_wait: float = 10.0, group: str = "") -> ShmChannel:
        """Set up a ring with every part's worker that can map it; :class:`ShmUnavailable` if none can."""
        if slots < 1 or slot_bytes <= HEADER:
            raise ValueError(f"a ring needs at least 1 slot of more than {HEADER} bytes, got {slots} x {slot_bytes}")
        sweep_stale()
        channel = cls(rpc_timeout, slot_wait)
        tag = (re.sub(r"[^0-9a-f]", "", group.lower()) or secrets.token_hex(4))[-12:]
        problems = {}
        for part in parts:
            try:
                channel.rings[part] = _Ring(channel, part, _attach(part, tag, slots, slot_bytes, rpc_timeout))
            except Exception as exc:  # noqa: BLE001 -- any failure: this part is pulled over torch RPC
                problems[part] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if not channel.rings:
            raise ShmUnavailable("; ".join(f"part {p}: {why}" for p, why in problems.items()))
        if problems:
            log.info("batch channel: shared memory with parts %s, torch RPC with parts %s (%s)",
                     sorted(channel.rings), sorted(problems), "; ".join(problems.values()))
        channel._watch = threading.Thread(target=channel._watch_waits, name="graphfeed-shm-watch", daemon=True)
        channel._watch.start()
        return channel

    def request(self, part: int, session_id: str, secret: bytes, epoch: int, seq: int) -> Pending:
        self._check_open()
        ring = self.rings.get(part)
        if ring is None:
            self.counts["rpc"] += 1
            return self.rpc.request(part, session_id, secret, epoch, seq)
        pending = Pending()
        ring.submit(_Ask((session_id, secret, epoch, seq), pending, time.monotonic()))
        return pending

    def dispatch(self, ring: _Ring, slot: int, ask: _Ask) -> None:
        """Send ``pull_into`` for ``ask`` naming ``slot``; its answer settles ``ask.pending``."""
        session_id, secret, epoch, seq = ask.args
        try:
            fut = torch.distributed.rpc.rpc_async(rpc_group.worker_name(ring.part), rpc_group.PULL_INTO,
                                                  args=(session_id, epoch, seq, secret, slot),
                                                  timeout=self.rpc_timeout)
        except Exception as exc:  # noqa: BLE001 -- e.g. the group is shut down: the pull fails, the slot is free
            ring.release(slot)
            ask.pending.set_exception(exc)
            return
        fut.add_done_callback(lambda f: self._settle(ring, slot, ask.pending, f))

    def _settle(self, ring: _Ring, slot: int, pending: Pending, fut) -> None:
        inner = Pending()
        settle(inner, fut)
        try:
            answer = inner.result()
        except Exception as exc:  # noqa: BLE001 -- the pull's error goes to the loader, which names the server
            ring.release(slot)
            pending.set_exception(exc)
            return
        if answer[0] == "shm":
            self.counts["shm"] += 1
            pending.set_result(read_batch(ring.maps[slot], answer[1], lambda: ring.release(slot)))
            return
        ring.release(slot)
        self.counts["too_big"] += 1
        self._tell("too_big", f"a batch of {answer[2] / 2**20:.1f} MiB does not fit a shared-memory slot of "
                              f"{len(ring.maps[slot]) / 2**20:.1f} MiB and came over torch RPC: raise "
                              f"shm_slot_mb in connect() to keep such batches in shared memory")
        pending.set_result(answer[1])

    def _watch_waits(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            for ring in self.rings.values():
                for ask in ring.overdue(self.slot_wait):
                    self.counts["slot_wait"] += 1
                    self._tell("slot_wait", f"every shared-memory slot of part {ring.part} is held by a batch the "
                                            f"trainer still references after {self.slot_wait:g} s; pulling over "
                                            f"torch RPC meanwhile (drop batches sooner or raise shm_slots)")
                    pulled = self.rpc.request(ring.part, *ask.args)
                    pulled.add_done_callback(functools.partial(_forward, dst=ask.pending))

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
        # the maps stay alive as long as a batch still holds a view of them (the views keep their buffers)


def _attach(part: int, tag: str, slots: int, slot_bytes: int, timeout: float) -> list[mmap.mmap]:
    """Create ``slots`` segments, have part ``part``'s worker map them, check the tokens, unlink the names."""
    names = [f"{PREFIX}{os.getpid()}-{tag}-p{part}-s{k}" for k in range(slots)]
    maps: list[mmap.mmap] = []
    try:
        tokens = []
        for name in names:
            mm = create_segment(name, slot_bytes)
            maps.append(mm)
            tokens.append(secrets.token_bytes(TOKEN_BYTES))
            mm[:TOKEN_BYTES] = tokens[-1]
        got = torch.distributed.rpc.rpc_sync(rpc_group.worker_name(part), rpc_group.ATTACH,
                                              args=(names, slot_bytes), timeout=timeout)
        if list(got) != tokens:
            raise ShmUnavailable("the worker mapped different segments (it does not share this host's /dev/shm)")
        return maps
    finally:
        for name in names:
            unlink_segment(name)


def _forward(src: Pending, dst: Pending) -> None:
    try:
        dst.set_result(src.result())
    except Exception as exc:  # noqa: BLE001 -- the pull's error, as the torch RPC channel gives it
        dst.set_exception(exc)
