"""The same-host shared-memory batch channel (:mod:`graphfeed.transport.shm`): the slot layout, the
stale-segment sweep, and real daemons on loopback (2 parts, 3000 nodes): batches equal the torch RPC
channel's and the local loader's, a full ring is backpressure, slots grow to the batches and the old
ones are unmapped on both sides, a /dev/shm without room is torch RPC with one log line (at set-up or
growth), and no segment outlives a normal exit, a trainer killed with SIGKILL or a server killed with
SIGKILL."""
from __future__ import annotations

import errno
import gc
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.testing.cluster import running_cluster
from graphfeed.transport import shm, shm_segments
from graphfeed.transport.pending import Pending

FANOUTS = [5, 3]
KW = dict(batch_size=32, shuffle=True, seed=5)
BOUND = 30.0   # seconds: generous, the machine is shared


@pytest.fixture(scope="module")
def parts_dir(shared_parts):
    return shared_parts


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    return shared_cluster


def _segments_of(pid: int) -> list[str]:
    return [n for n in shm_segments.list_segments() if n.startswith(f"{shm_segments.PREFIX}{pid}-")]


def _mapped_segments(pid: int) -> list[str]:
    """graphfeed segments process ``pid`` maps now (unlinked ones show as ``(deleted)``)."""
    with open(f"/proc/{pid}/maps") as f:
        return [line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                for line in f if shm_segments.PREFIX in line]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


# ---- the slot layout and the segments ----------------------------------------------------------------

def test_batch_round_trips_through_a_slot_and_the_slot_frees_with_its_last_tensor():
    name = f"{shm_segments.PREFIX}{os.getpid()}-abc123-p0-s0"
    mm = shm_segments.create_segment(name, 1 << 16)
    try:
        batch = {"x@_N": torch.rand(7, 3).to(torch.bfloat16), "n_id@_N": torch.arange(7),
                 "e_id@_N__to___N": torch.empty(0, dtype=torch.int64), "meta": torch.tensor([1, 2, 3, 4, 0]),
                 "t": torch.arange(12).view(3, 4).t()}   # a non-contiguous source
        layout = shm.place(batch, len(mm))
        assert layout is not None and all(p.offset % shm.ALIGN == 0 and p.offset >= shm.HEADER for p in layout)
        shm.write_batch(mm, batch, layout)
        freed = []
        got = shm.read_batch(mm, layout, lambda: freed.append(1))
        assert_same_batch(got, batch)
        assert shm.place(batch, 256) is None, "a batch larger than the slot does not fit"
        keep = got["n_id@_N"][:2]   # a view keeps the slot
        del got
        gc.collect()
        assert freed == []
        del keep
        gc.collect()
        assert freed == [1]
    finally:
        shm_segments.unlink_segment(name)
        mm.close()
    assert not _segments_of(os.getpid())


def _no_room(fd, offset, size):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_segment_reserves_its_pages_and_no_room_is_an_oserror_with_the_name_unlinked(monkeypatch):
    name = f"{shm_segments.PREFIX}{os.getpid()}-abc123-p0-s0"
    mm = shm_segments.create_segment(name, 1 << 20)
    try:
        assert os.stat(shm_segments.segment_path(name)).st_blocks * 512 >= 1 << 20, \
            "posix_fallocate reserved the pages"
    finally:
        shm_segments.unlink_segment(name)
        mm.close()
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    with pytest.raises(OSError) as info:
        shm_segments.create_segment(name, 1 << 20)
    assert info.value.errno == errno.ENOSPC
    assert not _segments_of(os.getpid()), "a segment that could not be reserved is unlinked"


def test_a_worker_adds_slot_generations_and_detach_unmaps_them():
    writer = shm.RingWriter()
    names = [f"{shm_segments.PREFIX}{os.getpid()}-abc123-p0-s{k}" for k in range(5)]
    made = [shm_segments.create_segment(name, 1 << 16) for name in names]
    for mm in made:   # the trainer's maps: only the writer's stay
        mm.close()
    assert len(writer.attach(names[:2], 1 << 16)) == 2
    assert len(writer.attach(names[2:4], 1 << 16, ids=[7, 8])) == 2
    assert sorted(writer.slots) == [0, 1, 7, 8], "a new generation is added beside the old one"
    assert writer.answer(7, {"a": torch.arange(5)})[0] == "shm"
    with pytest.raises(ValueError, match="already attached"):
        writer.attach(names[4:], 1 << 16, ids=[7])
    gc.collect()
    assert not _segments_of(os.getpid()), "attach unlinks the names, mapped or not"
    assert sorted(map(os.path.basename, _mapped_segments(os.getpid()))) == names[:4]
    assert writer.detach([0, 1, 99]) == 2
    gc.collect()
    assert sorted(writer.slots) == [7, 8]
    assert sorted(map(os.path.basename, _mapped_segments(os.getpid()))) == names[2:4], "detached ones are unmapped"
    with pytest.raises(ValueError, match="not attached"):
        writer.answer(0, {"a": torch.arange(5)})
    writer.detach([7, 8])
    gc.collect()
    assert not _mapped_segments(os.getpid())


class _RecordingChannel:
    """What a :class:`shm._Ring` needs of its channel: ``dispatch`` (recorded here) and ``closed``."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[int] = []

    def dispatch(self, ring, slot: int, ask) -> None:
        self.sent.append(slot)


def _slots(ids, size: int) -> dict:
    maps = {}
    for k in ids:
        name = f"{shm_segments.PREFIX}{os.getpid()}-abc123-p0-s{k}"
        maps[k] = shm_segments.create_segment(name, size)
        shm_segments.unlink_segment(name)
    return maps


def test_a_ring_swaps_generations_and_unmaps_a_held_old_slot_when_its_batch_is_freed():
    def _mine():   # this test's segments among the process's mappings
        return [n for n in _mapped_segments(os.getpid()) if f"{os.getpid()}-abc123-" in n]

    channel = _RecordingChannel()
    ring = shm._Ring(channel, 0, _slots([0, 1], 4096), 4096)
    ring.submit(shm._Ask((), Pending(), time.monotonic()))
    assert channel.sent == [0]
    batch = {"n_id@_N": torch.arange(9)}
    layout = shm.place(batch, 4096)
    shm.write_batch(ring.maps[0], batch, layout)
    held = shm.read_batch(ring.maps[0], layout, lambda: ring.release(0))   # slot 0's batch, kept by the trainer
    assert ring.ask_growth(5000, 1 << 30) and ring.take_growth() == (shm.MIB, [2, 3]), "fresh ids, 1 MiB"
    assert ring.take_growth() == (0, []), "one growth per request"
    ring.swap(_slots([2, 3], shm.MIB), shm.MIB)
    assert list(ring.free) == [2, 3] and ring.retired == {0} and sorted(ring.maps) == [0, 2, 3]
    assert ring.take_unmapped() == [1], "the free old slot is unmapped at once"
    assert _slot_ids(_mine()) == [0, 2, 3]
    assert torch.equal(held["n_id@_N"], torch.arange(9)), "a held batch stays valid across the swap"
    del held
    gc.collect()
    assert ring.take_unmapped() == [0] and sorted(ring.maps) == [2, 3] and not ring.retired
    assert list(ring.free) == [2, 3], "a retired slot never becomes free again"
    assert _slot_ids(_mine()) == [2, 3]
    ring.retire_all()
    gc.collect()
    assert not ring.maps and not _mine()


def test_a_ring_opened_with_fewer_slots_takes_the_owed_ones_and_a_growth_makes_them_all():
    """A ring opens with OPEN_SLOTS and is owed the rest (added as free slots, a waiting request takes one);
    owed slots of a size the ring grew past are dropped; a growth makes every slot, owed ones included."""
    channel = _RecordingChannel()
    ring = shm._Ring(channel, 0, _slots([0], 4096), 4096)
    ring.owed = 2
    ring.submit(shm._Ask((), Pending(), time.monotonic()))
    ring.submit(shm._Ask((), Pending(), time.monotonic()))
    assert channel.sent == [0] and len(ring.waiting) == 1, "one slot: the second request waits"
    assert ring.take_owed() == (4096, [1, 2]) and ring.take_owed() == (0, []), "fresh ids, once"
    ring.add(_slots([1, 2], 4096), 4096)
    assert channel.sent == [0, 1] and list(ring.free) == [2] and ring.slots == 3, "the waiting request got one"
    ring.owed = 1
    assert ring.ask_growth(5000, 1 << 30) and ring.take_growth() == (shm.MIB, [3, 4, 5, 6]), "3 slots + 1 owed"
    assert ring.take_owed() == (0, []), "the growth made the owed slot"
    ring.swap(_slots([3, 4, 5, 6], shm.MIB), shm.MIB)
    ring.take_unmapped()
    ring.add(_slots([8], 4096), 4096)   # owed slots made at the old size, added after the growth
    assert 8 not in ring.maps and ring.take_unmapped() == [8], "dropped, the worker told to unmap it"
    ring.retire_all()


def test_a_starved_ring_sends_the_next_requests_past_it_until_a_slot_is_released():
    """A trainer that keeps every batch (``list(loader)``) holds every slot: once one request has waited out the
    slot wait, the next ones are not queued (the channel pulls them over its calls at once) until a release."""
    channel = _RecordingChannel()
    ring = shm._Ring(channel, 0, _slots([0], 4096), 4096)
    assert ring.submit(shm._Ask((), Pending(), time.monotonic())) and channel.sent == [0]   # slot 0 now held
    assert ring.submit(shm._Ask((), Pending(), time.monotonic() - 5.0)), "queued: nothing waited out yet"
    assert len(ring.overdue(2.0)) == 1 and not ring.waiting
    assert not ring.submit(shm._Ask((), Pending(), time.monotonic())), "starved: not queued again"
    assert not ring.waiting
    ring.release(0)
    assert ring.submit(shm._Ask((), Pending(), time.monotonic())) and channel.sent == [0, 0], "a release ends it"
    ring.retire_all()


def test_grown_size_is_a_quarter_more_rounded_up_to_a_mib():
    assert shm.grown_size(1) == shm.MIB
    assert shm.grown_size(129 * shm.MIB) == 162 * shm.MIB   # 161.25 MiB, rounded up


def test_segment_names_are_checked():
    for bad in ("../etc/passwd", "graphfeed-shm-1-zz-p0-s0", "other-1-ab-p0-s0"):
        with pytest.raises(ValueError, match="not a graphfeed shared-memory segment name"):
            shm_segments.segment_path(bad)


def test_sweep_unlinks_only_segments_of_dead_trainers():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    assert dead.wait(30) == 0
    stale, live = f"{shm_segments.PREFIX}{dead.pid}-ab-p0-s0", f"{shm_segments.PREFIX}{os.getpid()}-ab-p0-s1"
    for name in (stale, live):
        shm_segments.create_segment(name, 4096).close()
    try:
        assert stale in shm_segments.sweep_stale()
        assert stale not in shm_segments.list_segments() and live in shm_segments.list_segments()
    finally:
        shm_segments.unlink_segment(stale)
        shm_segments.unlink_segment(live)


# ---- through the servers -----------------------------------------------------------------------------

def _wait_all_slots(channel, slots: int = 8) -> None:
    """Until every ring holds ``slots`` slots (it opens with shm.OPEN_SLOTS and is given the rest at once)."""
    _wait(lambda: all(r.slots == slots for r in channel.rings.values()), BOUND, f"every ring's {slots} slots")


def test_ring_batches_equal_torch_rpc_batches_and_the_local_loader(cluster, parts_dir):
    addresses = [s.address for s in cluster]
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, feature_dtype="bf16", **KW))
    with gf.connect(addresses, timeout=60, channel="rpc") as client:
        assert client.group.channel.kind == client.group.calls.kind   # torch-rpc, or secure
        over_rpc = list(client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype="bf16", **KW))
    with gf.connect(addresses, timeout=60) as client:
        channel = client.group.channel
        assert channel.kind == "shm" and sorted(channel.rings) == [0, 1], "loopback servers share this host"
        _wait_all_slots(channel)
        assert not _segments_of(os.getpid()), "names are unlinked once both sides mapped them"
        assert len(_mapped_segments(os.getpid())) == 2 * 8, "the trainer maps 8 slots per server"
        over_shm = list(client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype="bf16", **KW))
        assert channel.counts["shm"] == len(over_shm) and channel.counts["slot_wait"] == 0
    assert len(over_shm) == len(over_rpc) == len(local) > 2
    for a, b, c in zip(over_shm, over_rpc, local):
        assert_same_batch(a, b)
        assert_same_batch(a, c)
    assert not _segments_of(os.getpid())


def test_full_ring_is_backpressure_and_held_batches_fall_back_to_rpc(cluster, parts_dir):
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, **KW))
    with gf.connect([s.address for s in cluster], timeout=60, shm_slots=1) as client:
        channel = client.group.channel
        channel.slot_wait = 60.0   # the first epoch's pulls wait for the slot in turn, however loaded the host
        loader = client.neighbor_loader("train", FANOUTS, prefetch=4, **KW)
        it = iter(loader)
        for want in local:     # one slot per server, four pulls asked each time: they wait for the slot in turn
            got = next(it)
            assert_same_batch(got, want)
            del got            # (a for loop over zip() would keep the previous batch, and its slot, alive)
        assert next(it, None) is None
        assert channel.counts["shm"] == len(local) and channel.counts["slot_wait"] == 0, channel.counts
        channel.slot_wait = 0.5
        held = list(loader)    # every batch kept: the ring stays full, later pulls wait, then go over RPC
        assert channel.counts["slot_wait"] > 0 and channel.counts["shm"] < 2 * len(local), channel.counts
        assert len(held) == len(local)


def test_batch_larger_than_a_slot_comes_over_rpc(cluster, parts_dir):
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, **KW))
    with gf.connect([s.address for s in cluster], timeout=60, shm_slot_mb=1 / 1024) as client:   # 1 KiB slots
        got = list(client.neighbor_loader("train", FANOUTS, **KW))
        assert client.group.channel.counts["too_big"] == len(local)
    for a, b in zip(got, local, strict=True):
        assert_same_batch(a, b)


def _epoch(loader, local_loader) -> int:
    """One epoch of ``loader``, each batch checked against ``local_loader``'s and dropped at once."""
    n = 0
    for got, want in zip(loader, local_loader, strict=True):
        assert_same_batch(got, want)
        del got
        n += 1
    return n


def _slot_ids(names: list[str]) -> list[int]:
    return sorted(int(n.rsplit("-s", 1)[1]) for n in names)


def test_slots_grow_to_the_batches_and_the_old_slots_are_unmapped_on_both_sides(cluster, parts_dir, monkeypatch,
                                                                               caplog):
    monkeypatch.setattr(shm, "SHM_START_MB", 4 / 1024)   # 4 KiB slots: every batch is too big at first
    local = LocalNeighborLoader(parts_dir, FANOUTS, **KW)
    with caplog.at_level(logging.INFO, logger="graphfeed.transport.shm"), \
            gf.connect([s.address for s in cluster], timeout=60) as client:
        channel = client.group.channel
        assert channel.kind == "shm" and channel.max_slot_bytes == 1024 * shm.MIB
        workers = [s.extra["worker_pid"] for s in client.servers]
        loader = client.neighbor_loader("train", FANOUTS, prefetch=2, **KW)
        first = _epoch(loader, local)
        _wait(lambda: channel.counts["grown"] == 2, BOUND, "both rings to grow")
        assert channel.counts["too_big"] > 0 and channel.counts["grow_failed"] == 0, channel.counts
        assert all(r.slot_bytes == shm.MIB for r in channel.rings.values()), "1.25 x a ~50 KiB batch: 1 MiB"
        before = dict(channel.counts)
        assert _epoch(loader, local) == first
        assert channel.counts["shm"] - before["shm"] == first and channel.counts["too_big"] == before["too_big"]
        gc.collect()
        ours = f"-{channel.tag}-"   # this client's segments (not an earlier test's)
        assert _slot_ids([n for n in _mapped_segments(os.getpid()) if ours in n]) == sorted(list(range(8, 16)) * 2), \
            "the trainer maps only the new generation (new slot ids), 8 slots per part"
        for w in workers:
            _wait(lambda w=w: _slot_ids(_mapped_segments(w)) == list(range(8, 16)), BOUND,
                  f"worker {w} to unmap its retired slots")
    assert not [n for n in _mapped_segments(os.getpid()) if ours in n], "closing the client unmaps the free slots"
    grew = [r.getMessage() for r in caplog.records if "grew" in r.getMessage()]
    assert len(grew) == 2 and all("0 -> 1 MiB" in m for m in grew), grew
    assert not _segments_of(os.getpid())


def test_no_room_for_the_ring_is_torch_rpc_with_one_log_line(cluster, parts_dir, monkeypatch, caplog):
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    gc.collect()
    mapped = _mapped_segments(os.getpid())
    with caplog.at_level(logging.INFO, logger="graphfeed"), \
            gf.connect([s.address for s in cluster], timeout=60) as client:
        assert client.group.channel.kind == client.group.calls.kind   # torch-rpc, or secure
        assert _epoch(client.neighbor_loader("train", FANOUTS, **KW), LocalNeighborLoader(parts_dir, FANOUTS, **KW))
    lines = [r for r in caplog.records if "shared" in r.getMessage() or "shm" in r.name]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, [r.getMessage() for r in lines]
    assert "No space left on device" in lines[0].getMessage() and client.group.calls.label in lines[0].getMessage()
    assert not _segments_of(os.getpid()) and _mapped_segments(os.getpid()) == mapped


def test_no_room_to_grow_keeps_the_old_slots_and_the_batches_come_over_rpc(cluster, parts_dir, monkeypatch, caplog):
    monkeypatch.setattr(shm, "SHM_START_MB", 4 / 1024)
    local = LocalNeighborLoader(parts_dir, FANOUTS, **KW)
    with caplog.at_level(logging.INFO, logger="graphfeed.transport.shm"), \
            gf.connect([s.address for s in cluster], timeout=60) as client:
        channel = client.group.channel
        _wait_all_slots(channel)
        monkeypatch.setattr(os, "posix_fallocate", _no_room)   # set up, then /dev/shm is full
        loader = client.neighbor_loader("train", FANOUTS, prefetch=2, **KW)
        first = _epoch(loader, local)
        _wait(lambda: channel.counts["grow_failed"] == 2, BOUND, "both growths to fail")
        assert _epoch(loader, local) == first
        assert channel.counts["grown"] == 0 and channel.counts["shm"] == 0
        assert channel.counts["too_big"] == 2 * first, "every batch came over torch RPC"
        assert all(r.slot_bytes == 4096 and sorted(r.maps) == list(range(8)) for r in channel.rings.values())
        assert _slot_ids([n for n in _mapped_segments(os.getpid()) if f"-{channel.tag}-" in n]) == \
            sorted(list(range(8)) * 2)
    failed = [r for r in caplog.records if "could not grow" in r.getMessage()]
    assert len(failed) == 2 and all(r.levelno == logging.WARNING for r in failed)
    assert "No space left on device" in failed[0].getMessage()
    assert not [r for r in caplog.records if "grew" in r.getMessage()]
    assert not _segments_of(os.getpid())


TRAINER = textwrap.dedent("""
    import os, sys, time, graphfeed.client as gf
    client = gf.connect(sys.argv[1].split(","), timeout=60, lease_seconds=2)
    assert client.group.channel.kind == "shm", client.group.channel.kind
    loader = client.neighbor_loader("train", [5, 3], batch_size=8, prefetch=4)
    it = iter(loader)
    next(it)
    print(",".join(str(s.extra["worker_pid"]) for s in client.servers), flush=True)
    if sys.argv[2] == "exit":
        sys.stdin.readline()      # the test has looked at the workers' mappings
        for _ in it:
            pass
        client.close()
        sys.exit(0)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_trainer_exit_or_sigkill_leaves_no_segment(cluster, how):
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, ",".join(s.address for s in cluster), how],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in trainer.stdout.readline().split(",")]
        assert len(workers) == 2, "the trainer did not start (see its stderr)"
        assert all(len(_mapped_segments(w)) == 8 for w in workers), "each worker maps its 8 slots"
        if how == "kill":
            trainer.kill()
    finally:
        trainer.stdin.close()     # "exit": the trainer finishes its epoch and closes now
        code = trainer.wait(BOUND * 4)
        trainer.stdout.close()
    assert code == (0 if how == "exit" else -signal.SIGKILL)
    assert not _segments_of(trainer.pid)
    _wait(lambda: not any(_alive(w) for w in workers), BOUND, "the trainer's workers to exit")
    assert not _segments_of(trainer.pid)


def test_server_sigkill_leaves_no_segment(parts_dir, tmp_path):
    with running_cluster(parts_dir, log_dir=tmp_path) as servers:
        victim = servers[0]
        # reconnect_timeout=0: the loader fails at once instead of waiting for the server to come back
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=0) as client:
            assert client.group.channel.kind == "shm"
            worker = client.servers[0].extra["worker_pid"]
            it = iter(client.neighbor_loader("train", FANOUTS, batch_size=8, prefetch=2))
            next(it)
            victim.expect_exit = -signal.SIGKILL
            os.killpg(victim.pid, signal.SIGKILL)   # the daemon and its session worker
            with pytest.raises(gf.ServerError):
                for _ in it:
                    pass
            _wait(lambda: not _alive(worker), BOUND, "the killed server's worker to be gone")
        victim.wait(10)
        victim.checked = True
        assert not _segments_of(os.getpid())


def test_trainer_killed_during_set_up_is_swept_on_the_next_connect(cluster):
    code = (f"import os, signal; from graphfeed.transport import shm_segments; "
            f"shm_segments.create_segment(f'{shm_segments.PREFIX}{{os.getpid()}}-ab-p0-s0', 4096); "
            f"os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.Popen([sys.executable, "-c", code])
    assert child.wait(BOUND) == -signal.SIGKILL
    assert _segments_of(child.pid), "the killed trainer left its segment"
    with gf.connect([s.address for s in cluster], timeout=60):
        assert not _segments_of(child.pid), "connect swept the dead trainer's segment"
