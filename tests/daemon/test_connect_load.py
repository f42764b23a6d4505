"""Connecting under load: an ``OpenGroup`` waits for its session worker's start up to the daemon's
``worker_start_seconds`` (trainers read it from ClusterInfo and give OpenGroup longer), and a caller that gives up
meanwhile leaves no worker behind -- the daemon logs it and stops the worker as soon as it is up.

Seen before: four trainers connecting at once on a busy 2-core host all failed ``OpenGroup
(DEADLINE_EXCEEDED)`` at the client's 30 s, the daemons logged nothing, and their four session workers were still
alive 20 s after the trainers exited."""
from __future__ import annotations

import datetime
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from helpers.graphs import synthetic_parts

from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.testing.cluster import running_cluster

TRAINERS = 4
BUSY_LOOPS = 2
REAP_WAIT = 60.0        # seconds an abandoned worker may take to come up and be stopped (a loaded host)
TRAINERS_WAIT = 540.0   # seconds for every trainer to connect and close (8 workers starting on 2 busy cores)
IN_TURN = 3             # trainers connecting at once to daemons that start one worker at a time
WARM_IMPORTS = 5.0       # seconds given a warm worker to import torch before the trainer comes
OVERLAP_SLACK = 0.1     # seconds two starts in turn may seem to overlap (ms log stamps, a release before the log)

TRAINER = textwrap.dedent("""
    import sys, time
    import graphfeed.client as gf
    started = time.monotonic()
    client = gf.connect(sys.argv[1].split(","))   # the default timeout: OpenGroup's deadline is derived
    connected = time.monotonic() - started
    client.close()
    print(f"connected {connected:.1f} closed {time.monotonic() - started:.1f}", flush=True)
""")
BUSY_LOOP = "while True: pass"


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("connect_load") / "parts", nodes=600, avg_degree=4, features=4,
                           classes=2, parts=2, name="connect-load-600")


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (its session workers)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as fh:
            out += [int(c) for c in fh.read().split()]
    return out


def stats(address: str) -> pb.ServerStats:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.ControlStub(channel).GetStats(pb.StatsRequest(), timeout=30)


def wait_no_workers(server, bound: float) -> float:
    """Seconds until ``server`` has no session worker and no group; AssertionError naming them past ``bound``."""
    started = time.monotonic()
    while True:
        left, groups = children(server.pid), stats(server.address).groups_open
        if not left and groups == 0:
            return time.monotonic() - started
        assert time.monotonic() - started < bound, \
            f"{server.name} still has worker pids {left} and {groups} groups {bound:g} s later"
        time.sleep(0.2)


def test_the_servers_bound_on_a_workers_start_reaches_the_client(parts_dir, tmp_path):
    with running_cluster(parts_dir, log_dir=tmp_path, env={"GRAPHFEED_WORKER_START_SECONDS": "75"}) as servers:
        with grpc.insecure_channel(servers[0].address) as channel:
            info = pb_grpc.ControlStub(channel).GetClusterInfo(pb.ClusterInfoRequest(), timeout=30)
    assert info.worker_start_seconds == 75.0


def test_a_caller_that_gives_up_leaves_no_worker_behind(parts_dir, tmp_path):
    """OpenGroup with a deadline far below a worker's start (it imports torch): the caller gets
    DEADLINE_EXCEEDED, the daemon logs the abandoned open and stops the worker once it is up."""
    with running_cluster(parts_dir, log_dir=tmp_path) as servers:
        server = servers[1]
        with grpc.insecure_channel(server.address) as channel:
            request = pb.OpenGroupRequest(group_id="gives-up", world_size=3, rank=2, group_key=secrets.token_bytes(32))
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.ControlStub(channel).OpenGroup(request, timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        took = wait_no_workers(server, REAP_WAIT)
        log = server.logs()
        assert "group_open_abandoned" in log and "gives-up" in log and "the caller gave up" in log
        assert "worker_pid=" in next(line for line in log.splitlines() if "group_open_abandoned" in line)
        print(f"abandoned worker gone {took:.1f} s after the caller gave up")


def opens(log: str) -> list[tuple[float, float, float]]:
    """(logged at, seconds queued, seconds starting) of every ``group_open`` line of a daemon's logfmt log."""
    found = []
    for line in log.splitlines():
        if "event=group_open " not in line:
            continue
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        stamp = datetime.datetime.strptime(fields["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
        found.append((stamp.timestamp(), float(fields["queued_seconds"]), float(fields["start_seconds"])))
    return sorted(found)


@pytest.mark.slow
def test_workers_start_in_turn(parts_dir, tmp_path):
    """worker_starts=1: three trainers connecting at once all connect, and each daemon started their workers
    one after another (no two starts overlap; the later opens waited their turn)."""
    with running_cluster(parts_dir, log_dir=tmp_path, env={"GRAPHFEED_WORKER_STARTS": "1"}) as servers:
        addresses = ",".join(s.address for s in servers)
        trainers = [subprocess.Popen([sys.executable, "-c", TRAINER, addresses], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True) for _ in range(IN_TURN)]
        outputs = [p.communicate(timeout=TRAINERS_WAIT)[0] for p in trainers]
        assert [p.returncode for p in trainers] == [0] * IN_TURN, "\n".join(o[-2000:] for o in outputs)
        for s in servers:
            found = opens(s.logs())
            assert len(found) == IN_TURN, s.logs()[-3000:]
            for (done, _, _), (later, queued, took) in zip(found, found[1:]):
                assert later - took >= done - OVERLAP_SLACK, f"{s.name}: two workers started at once: {found}"
                assert queued > 0, f"{s.name}: an open did not wait for its turn: {found}"
            print(f"{s.name}: (queued s, start s) {[(q, t) for _, q, t in found]}")


@pytest.mark.slow
def test_trainers_connect_at_once_to_a_busy_host_and_close(parts_dir, tmp_path):
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(BUSY_LOOPS)]
    try:
        with running_cluster(parts_dir, log_dir=tmp_path) as servers:
            addresses = ",".join(s.address for s in servers)
            started = time.monotonic()
            trainers = [subprocess.Popen([sys.executable, "-c", TRAINER, addresses], stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True) for _ in range(TRAINERS)]
            outputs = []
            for p in trainers:
                try:
                    outputs.append(p.communicate(timeout=max(1.0, TRAINERS_WAIT - (time.monotonic() - started)))[0])
                except subprocess.TimeoutExpired:
                    for q in trainers:
                        q.kill()
                    raise AssertionError(f"trainer pid {p.pid} did not connect and close within "
                                         f"{TRAINERS_WAIT:g} s") from None
            wall = time.monotonic() - started
            codes = [p.returncode for p in trainers]
            assert codes == [0] * TRAINERS, "\n".join(o[-2000:] for o in outputs)
            for s in servers:
                wait_no_workers(s, REAP_WAIT)
            print(f"{TRAINERS} trainers with {BUSY_LOOPS} busy loops: all connected and closed in {wall:.1f} s; "
                  + "; ".join(o.strip().splitlines()[-1] for o in outputs))
    finally:
        for p in busy:
            p.kill()
            p.wait(10)


def wait_children(server, count: int, bound: float) -> list[int]:
    """``server``'s child processes once there are ``count``; AssertionError naming them past ``bound`` s."""
    started = time.monotonic()
    while True:
        found = children(server.pid)
        if len(found) == count:
            return found
        assert time.monotonic() - started < bound, f"{server.name} has children {found}, not {count}, {bound:g} s on"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_warm_worker_is_taken_by_the_next_group_and_replaced(parts_dir, tmp_path):
    """warm_workers=1: a worker waits before any trainer comes, the next OpenGroup takes it (its pid is the
    group's worker) and a successor is started; the daemon drains and exits 0 with it."""
    import graphfeed.client as gf

    with running_cluster(parts_dir, log_dir=tmp_path, env={"GRAPHFEED_WARM_WORKERS": "1"}) as servers:
        warm = [wait_children(s, 1, REAP_WAIT)[0] for s in servers]
        time.sleep(WARM_IMPORTS)   # the warm workers finish their imports
        with gf.connect([s.address for s in servers], timeout=60) as client:
            assert [s.extra["worker_pid"] for s in client.servers] == warm
            successors = [set(wait_children(s, 2, REAP_WAIT)) - {w} for s, w in zip(servers, warm)]
            batch = next(iter(client.neighbor_loader("train", [2], batch_size=8)))
            assert batch.batch_size == 8
        for s, successor in zip(servers, successors):
            assert set(wait_children(s, 1, REAP_WAIT)) == successor   # the group's worker stopped, the warm stays
        starts = [opens(s.logs())[0][2] for s in servers]
        print(f"warm worker starts (s): {starts}")
