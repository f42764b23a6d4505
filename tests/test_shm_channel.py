"""The same-host shared-memory batch channel (:mod:`graphfeed.transport.shm`): the slot layout, the
stale-segment sweep, and real daemons on loopback (2 parts, 3000 nodes): batches equal the torch RPC
channel's and the local loader's, a full ring is backpressure, and no segment outlives a normal exit,
a trainer killed with SIGKILL or a server killed with SIGKILL."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import graphfeed.client as gf
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition import builder, synth
from graphfeed.testing.cluster import running_cluster
from graphfeed.transport import shm

FANOUTS = [5, 3]
KW = dict(batch_size=32, shuffle=True, seed=5)
BOUND = 30.0   # seconds: generous, the machine is shared


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    ei, x, y, splits = synth.generate(3000, 8, 16, 4)
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=4, fingerprint="shm-3000")
    out = tmp_path_factory.mktemp("shm") / "parts"
    builder.partition_graph(g, 2, out, method="metis")
    return out


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


def _assert_same_batch(a, b) -> None:
    assert set(a.keys()) == set(b.keys())
    for key in b.keys():
        va, vb = a[key], b[key]
        if torch.is_tensor(vb):
            assert va.dtype == vb.dtype and torch.equal(va, vb), key
        else:
            assert va == vb, key


def _segments_of(pid: int) -> list[str]:
    return [n for n in shm.list_segments() if n.startswith(f"{shm.PREFIX}{pid}-")]


def _mapped_segments(pid: int) -> list[str]:
    """graphfeed segments process ``pid`` maps now (unlinked ones show as ``(deleted)``)."""
    with open(f"/proc/{pid}/maps") as f:
        return [line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                for line in f if shm.PREFIX in line]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


# ---- the slot layout and the segments ----------------------------------------------------------------

def test_batch_round_trips_through_a_slot_and_the_slot_frees_with_its_last_tensor():
    name = f"{shm.PREFIX}{os.getpid()}-abc123-p0-s0"
    mm = shm.create_segment(name, 1 << 16)
    try:
        batch = {"x@_N": torch.rand(7, 3).to(torch.bfloat16), "n_id@_N": torch.arange(7),
                 "e_id@_N__to___N": torch.empty(0, dtype=torch.int64), "meta": torch.tensor([1, 2, 3, 4, 0]),
                 "t": torch.arange(12).view(3, 4).t()}   # a non-contiguous source
        layout = shm.place(batch, len(mm))
        assert layout is not None and all(p.offset % shm.ALIGN == 0 and p.offset >= shm.HEADER for p in layout)
        shm.write_batch(mm, batch, layout)
        freed = []
        got = shm.read_batch(mm, layout, lambda: freed.append(1))
        _assert_same_batch(got, batch)
        assert shm.place(batch, 256) is None, "a batch larger than the slot does not fit"
        keep = got["n_id@_N"][:2]   # a view keeps the slot
        del got
        gc.collect()
        assert freed == []
        del keep
        gc.collect()
        assert freed == [1]
    finally:
        shm.unlink_segment(name)
        mm.close()
    assert not _segments_of(os.getpid())


def test_segment_names_are_checked():
    for bad in ("../etc/passwd", "graphfeed-shm-1-zz-p0-s0", "other-1-ab-p0-s0"):
        with pytest.raises(ValueError, match="not a graphfeed shared-memory segment name"):
            shm.segment_path(bad)


def test_sweep_unlinks_only_segments_of_dead_trainers():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    assert dead.wait(30) == 0
    stale, live = f"{shm.PREFIX}{dead.pid}-ab-p0-s0", f"{shm.PREFIX}{os.getpid()}-ab-p0-s1"
    for name in (stale, live):
        shm.create_segment(name, 4096).close()
    try:
        assert stale in shm.sweep_stale()
        assert stale not in shm.list_segments() and live in shm.list_segments()
    finally:
        shm.unlink_segment(stale)
        shm.unlink_segment(live)


# ---- through the servers -----------------------------------------------------------------------------

def test_ring_batches_equal_torch_rpc_batches_and_the_local_loader(cluster, parts_dir):
    addresses = [s.address for s in cluster]
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, feature_dtype="bf16", **KW))
    with gf.connect(addresses, timeout=60, channel="rpc") as client:
        assert client.group.channel.kind == "torch-rpc"
        over_rpc = list(client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype="bf16", **KW))
    with gf.connect(addresses, timeout=60) as client:
        channel = client.group.channel
        assert channel.kind == "shm" and sorted(channel.rings) == [0, 1], "loopback servers share this host"
        assert not _segments_of(os.getpid()), "names are unlinked once both sides mapped them"
        assert len(_mapped_segments(os.getpid())) == 2 * 8, "the trainer maps 8 slots per server"
        over_shm = list(client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype="bf16", **KW))
        assert channel.counts["shm"] == len(over_shm) and channel.counts["slot_wait"] == 0
    assert len(over_shm) == len(over_rpc) == len(local) > 2
    for a, b, c in zip(over_shm, over_rpc, local):
        _assert_same_batch(a, b)
        _assert_same_batch(a, c)
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
            _assert_same_batch(got, want)
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
        _assert_same_batch(a, b)


TRAINER = textwrap.dedent("""
    import os, sys, time, graphfeed.client as gf
    client = gf.connect(sys.argv[1].split(","), timeout=60, lease_seconds=2)
    assert client.group.channel.kind == "shm", client.group.channel.kind
    loader = client.neighbor_loader("train", [5, 3], batch_size=8, prefetch=4)
    it = iter(loader)
    next(it)
    print(",".join(str(s.extra["worker_pid"]) for s in client.servers), flush=True)
    if sys.argv[2] == "exit":
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
                               stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in trainer.stdout.readline().split(",")]
        assert len(workers) == 2, "the trainer did not start (see its stderr)"
        assert all(len(_mapped_segments(w)) == 8 for w in workers), "each worker maps its 8 slots"
        if how == "kill":
            trainer.kill()
    finally:
        code = trainer.wait(BOUND * 4)
        trainer.stdout.close()
    assert code == (0 if how == "exit" else -signal.SIGKILL)
    assert not _segments_of(trainer.pid)
    _wait(lambda: not any(_alive(w) for w in workers), BOUND, "the trainer's workers to exit")
    assert not _segments_of(trainer.pid)


def test_server_sigkill_leaves_no_segment(parts_dir, tmp_path):
    with running_cluster(parts_dir, log_dir=tmp_path) as servers:
        victim = servers[0]
        with gf.connect([s.address for s in servers], timeout=60) as client:
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
    code = (f"import os, signal; from graphfeed.transport import shm; "
            f"shm.create_segment(f'{shm.PREFIX}{{os.getpid()}}-ab-p0-s0', 4096); os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.Popen([sys.executable, "-c", code])
    assert child.wait(BOUND) == -signal.SIGKILL
    assert _segments_of(child.pid), "the killed trainer left its segment"
    with gf.connect([s.address for s in cluster], timeout=60):
        assert not _segments_of(child.pid), "connect swept the dead trainer's segment"
