"""A part's replicas: every daemon of the cluster that serves it, the one a trainer uses, and failover.

Any number of daemons may serve one part (the same partition files: one fingerprint).  At connect the client
reaches the listed servers, groups them by part (``ClusterInfo.part_id``) and uses one per part, picked at
random among the reachable ones so that a fleet of trainers spreads over a part's replicas (every replica
produces the same batches: each random choice of a batch is a function of its seed).  When the one in use is
lost -- its port refuses, it restarted, it drains for an upgrade, or it stays silent past ``reconnect_timeout``
-- the client re-forms its group on a live replica of that part at once instead of waiting for the lost one
(:meth:`Replicas.replace`), and the running epochs continue at the first batch the trainer has not received.

A server listed but not reachable at connect is kept as a candidate when the reachable ones cover every part
(its part is learnt when it answers), so a trainer that starts while one replica restarts still connects.
"""
from __future__ import annotations

import collections
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Sequence

import grpc

from graphfeed.client.cluster import (
    RECONNECT_POLL,
    ServerConn,
    check_cluster,
    error_line,
    missing_parts,
    probe_tcp,
    reach,
    unreached,
)
from graphfeed.client.errors import ClusterError, ServerError
from graphfeed.proto import control_pb2 as pb

log = logging.getLogger("graphfeed.client")
CHECK_TIMEOUT = 2.0   # seconds one candidate may take to answer whether it serves the part
# part -> times it moved to another replica in this process (graphfeed_client_failovers_total)
FAILOVERS: collections.Counter[int] = collections.Counter()


def open_replicas(addresses: Sequence[str], timeout: float, security=None) -> Replicas:
    """Reach every server of ``addresses`` at once (each within ``timeout`` s) and group them by part.

    ClusterError when the servers reached hold more than one partitioning, or do not cover every part (then the
    first unreachable server's error when there is one: it may be the missing part).  Servers not reached while
    the others cover every part are kept as candidates for failover, with a warning."""
    def attempt(address: str) -> ServerConn | ClusterError:
        try:
            return reach(address, timeout, security)
        except ClusterError as exc:
            return exc

    with ThreadPoolExecutor(max(1, min(16, len(addresses)))) as pool:
        results = list(pool.map(attempt, addresses))
    reached = [r for r in results if isinstance(r, ServerConn)]
    failed = {a: r for a, r in zip(addresses, results) if isinstance(r, ClusterError)}
    try:
        if failed and (not reached or missing_parts(reached)):
            raise next(iter(failed.values()))
        check_cluster(reached)
    except BaseException:
        for s in reached:
            s.close()
        raise
    for exc in failed.values():
        log.warning("graphfeed: %s; the other servers serve every part, so it is kept as a replica to fail over "
                    "to once it answers", exc)
    return Replicas(sorted(reached, key=lambda s: s.part), [unreached(a, security) for a in failed])


class Replicas:
    """Every server of a cluster by part (``servers`` reached at connect, ``unreached`` not), and the one
    :meth:`active` picked per part.  ``rng`` picks among a part's replicas (default: random)."""

    def __init__(self, servers: Sequence[ServerConn], unreached: Sequence[ServerConn] = (),
                 rng: random.Random | None = None):
        self.by_part: dict[int, list[ServerConn]] = {}
        for s in servers:
            self.by_part.setdefault(s.part, []).append(s)
        self.unreached = list(unreached)
        self._rng = rng or random.Random()
        self.failovers = 0   # times a lost server's part moved to another replica

    def all(self) -> list[ServerConn]:
        """Every server, reached or not."""
        return [s for part in sorted(self.by_part) for s in self.by_part[part]] + self.unreached

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.all()]

    def counts(self) -> dict[int, int]:
        """Part -> how many replicas serve it (those reached)."""
        return {part: len(found) for part, found in sorted(self.by_part.items())}

    def active(self) -> list[ServerConn]:
        """One replica per part, in part order (random among a part's replicas)."""
        return [self._rng.choice(self.by_part[part]) for part in sorted(self.by_part)]

    def has_other(self, server: ServerConn) -> bool:
        """Whether another server may serve ``server``'s part: another replica of it, or one not reached yet."""
        return bool(self.unreached) or any(s is not server for s in self.by_part.get(server.part, ()))

    def replace(self, lost: ServerConn, deadline: float, budget: float, wait_for_lost: bool = True) -> ServerConn:
        """A live server of ``lost``'s part: ``lost`` itself when it serves again (a restart, a worker that died
        under a living daemon), else another replica that serves the part now; else wait until ``deadline``
        (``time.monotonic()``; ``budget`` is the wait in seconds, for the message) for any of them.
        ``wait_for_lost=False`` (``lost`` was silent past its patience: frozen, or cut off) takes the first
        candidate that serves instead of waiting for ``lost``'s answer first.

        A candidate serves the part when its port accepts, its ClusterInfo names the same graph and part, and its
        health says SERVING (a draining one says NOT_SERVING).  ServerError naming the part, its candidates and why
        each was not taken when the deadline passes, or when ``lost`` came back with another partition and no
        replica serves the part."""
        if not self.has_other(lost):   # one server of the part: wait for it, as for any restart
            lost.wait_back(deadline, budget)
            return lost
        want = lost.cluster_info
        reasons: dict[str, str] = {}
        while True:
            candidates = [lost] + [s for s in self.by_part.get(lost.part, ()) if s is not lost] + self.unreached
            chosen = _first_serving(candidates, want, reasons, in_order=wait_for_lost)
            if chosen is not None:
                return self._take(lost, chosen)
            if time.monotonic() >= deadline:
                raise ServerError(lost.name, f"no server of part {want.part_id} serves it within reconnect_timeout="
                                             f"{budget:g} s (waited for any of {len(candidates)}: "
                                             + "; ".join(f"{a}: {why}" for a, why in reasons.items()) + ")")
            time.sleep(min(RECONNECT_POLL, max(0.0, deadline - time.monotonic())))

    def _take(self, lost: ServerConn, chosen: ServerConn) -> ServerConn:
        if chosen in self.unreached:   # a server not reached at connect answered: it is a replica of the part now
            self.unreached.remove(chosen)
            self.by_part.setdefault(chosen.part, []).append(chosen)
        if chosen is not lost:
            self.failovers += 1
            FAILOVERS[chosen.part] += 1
            log.warning("graphfeed: part %d moves from %s to its replica %s", chosen.part, lost.address,
                        chosen.address)
        return chosen


def _first_serving(candidates: list[ServerConn], want: pb.ClusterInfo, reasons: dict[str, str],
                   in_order: bool) -> ServerConn | None:
    """The first of ``candidates`` that serves ``want``'s part (:func:`_serves`, asked of all at once): first in
    list order (``in_order``: each earlier one's answer is waited for), else the first to answer that it does.
    Why each other one was not taken goes into ``reasons``; None when none serves."""
    pool = ThreadPoolExecutor(len(candidates))
    try:
        futures = {pool.submit(_serves, s, want): s for s in candidates}
        done = list(futures) if in_order else as_completed(futures)
        for f in done:
            why = f.result()
            if why is None:
                return futures[f]
            reasons[futures[f].address] = why
        return None
    finally:
        pool.shutdown(wait=False)   # a candidate still being asked answers within CHECK_TIMEOUT, to nobody


def _serves(s: ServerConn, want: pb.ClusterInfo) -> str | None:
    """None when ``s`` serves ``want``'s graph and part now (its info is then refreshed); else why not."""
    try:
        probe_tcp(s.address, timeout=min(1.0, CHECK_TIMEOUT))
        s.reopen()   # a fresh channel: no reconnect back-off after a restart
        info = s.stub.GetClusterInfo(pb.ClusterInfoRequest(), timeout=CHECK_TIMEOUT)
    except (ClusterError, grpc.RpcError) as exc:
        return error_line(exc)
    if (info.fingerprint, info.part_id, info.num_parts) != (want.fingerprint, want.part_id, want.num_parts):
        return (f"serves another partition or part (fingerprint {info.fingerprint[:12]}, part {info.part_id} of "
                f"{info.num_parts})")
    if s.serving(CHECK_TIMEOUT) is not True:
        return "not SERVING (draining, or its files are unreadable)"
    s.info = info
    return None
