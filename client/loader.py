"""The remote neighbor loader: batches sampled by the servers, pulled over the data-path group.

A loader is one session on every server.  Each ``iter()`` is an epoch: the client plans it
from the servers' input counts (:mod:`graphfeed.core.epoch`, the same plan the workers
compute), starts it on every server, and pulls its rank's batches in order from the server
that owns each batch's seeds, keeping ``prefetch`` pulls in flight per server.  Batches
equal :class:`graphfeed.server.loader.local.LocalNeighborLoader`'s for the same arguments.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from typing import TYPE_CHECKING, Iterator

import torch

from graphfeed.client.errors import ServerError
from graphfeed.client.metrics import LoaderStats
from graphfeed.core import batch as batch_codec
from graphfeed.core.epoch import EpochPlan
from graphfeed.core.spec import LoaderSpec, NodeInput
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto.convert import open_session_request
from graphfeed.transport.pending import Pending

if TYPE_CHECKING:
    from graphfeed.client.client import Client

WAIT_SLICE = 0.5   # seconds between liveness checks while waiting for a batch


class RemoteNeighborLoader:
    """Iterate PyG ``Data`` mini-batches sampled by the cluster's servers.

    Made by :meth:`graphfeed.client.Client.neighbor_loader` (arguments as PyG's
    ``NeighborLoader``) or :meth:`graphfeed.client.Client.open_loader` (a :class:`LoaderSpec`),
    kept as ``self.spec``.  Input "every node" (``input_nodes=None`` or ``(node_type, None)``)
    travels as the ids ``0..num_nodes-1`` of that type, so batches then equal the local
    loader's with ``input_nodes=torch.arange(num_nodes)``.  A typed graph gives ``HeteroData``.
    ``prefetch``: pulls in flight per server.  Each ``iter()`` is one epoch (0, 1, ...;
    :meth:`set_epoch` overrides).  Raises :class:`ServerError` naming the server when a server
    fails or dies mid-epoch (within ``rpc_timeout``, usually at once).
    """

    def __init__(self, client: Client, spec: LoaderSpec, *, prefetch: int = 4):
        if not isinstance(spec, LoaderSpec):
            raise TypeError(f"spec must be a LoaderSpec, got {type(spec).__name__}; "
                            f"use Client.neighbor_loader(...) for PyG-style arguments")
        if not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be a positive integer (pulls in flight per server), got {prefetch!r}")
        self.client = client
        self.spec = every_node_as_ids(spec, client.num_nodes_of(spec.input.node_type))
        self.prefetch = prefetch
        self._epoch = 0
        self._closed = False
        req = self._session_request()
        self._stats = LoaderStats(self.spec.kind, len(client.servers))
        self.sessions: list[str] = []
        self._secrets: list[bytes] = []   # per server: the session secret every pull carries
        self.counts: list[int] = []
        try:
            for s in client.servers:
                reply = s.call("OpenSession", req, timeout=client.timeout)
                self.sessions.append(reply.session_id)
                self._secrets.append(bytes(reply.session_secret))
                self.counts.append(int(reply.local_input_nodes))
        except BaseException:
            self.close()
            raise
        self._len_cache: tuple[int, int] | None = None

    def _session_request(self) -> pb.OpenSessionRequest:
        return open_session_request(self.spec, self.client.group.group_id)

    # ---- epochs ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def _plan(self, epoch: int) -> EpochPlan:
        return EpochPlan(self.spec, self.counts, epoch)

    def __len__(self) -> int:
        if self._len_cache is None or self._len_cache[0] != self._epoch:
            self._len_cache = (self._epoch, len(self._plan(self._epoch)))
        return self._len_cache[1]

    def __iter__(self) -> Iterator:
        if self._closed:
            raise RuntimeError("this loader was closed")
        self.client._check_usable()
        epoch = self._epoch
        self._epoch += 1
        plan = self._plan(epoch)
        self._stats.start_epoch(epoch)
        self._start_epoch(plan)
        return self._batches(epoch, plan.entries)

    def _start_epoch(self, plan: EpochPlan) -> None:
        epoch = plan.epoch
        for s, session_id in zip(self.client.servers, self.sessions):
            req = pb.StartEpochRequest(session_id=session_id, epoch=epoch, part_input_counts=self.counts)
            reply = s.call("StartEpoch", req, timeout=self.client.timeout)
            expected = len(plan.owned_by(s.part))
            if reply.num_batches != expected:
                raise ServerError(s.name, f"plans {reply.num_batches} batches for epoch {epoch}, the client "
                                          f"expects {expected}: client and server disagree on the epoch contract")

    def _batches(self, epoch: int, entries) -> Iterator:
        servers = self.client.servers
        inflight = [0] * len(servers)
        window: deque = deque()
        issued = 0
        for _ in range(len(entries)):
            while issued < len(entries) and inflight[entries[issued].part] < self.prefetch:
                p = entries[issued].part
                window.append((issued, p, self._pull(p, epoch, issued)))
                inflight[p] += 1
                issued += 1
            got_seq, p, pending = window.popleft()
            batch = self._wait(pending, p, epoch, got_seq)
            inflight[p] -= 1
            data = batch_codec.to_pyg(batch)
            self._stats.delivered(p)
            yield data
            self._stats.asked()
        self._stats.end_epoch()

    def stats(self) -> dict:
        """The trainer's view of the current (or last) epoch: wait vs wall time, data-stall ratio,
        batches/s, batches per server, and totals (see :mod:`graphfeed.client.metrics`)."""
        return self._stats.snapshot()

    def _pull(self, part: int, epoch: int, seq: int) -> Pending:
        """Request batch ``seq`` of ``epoch`` from part ``part``'s worker over the group's batch channel."""
        return self.client.group.channel.request(part, self.sessions[part], self._secrets[part], epoch, seq)

    def _wait(self, pending: Pending, part: int, epoch: int, seq: int) -> dict:
        """The batch of ``pending``; checks the group's heartbeats every WAIT_SLICE s while waiting, and
        fails the client naming the server when a server went away or the pull failed."""
        group = self.client.group
        while not pending.wait_done(WAIT_SLICE):
            if group.failures:  # a heartbeat failed meanwhile: do not wait for the channel's timeout
                self.client._fail(self._failure_text(part, epoch, seq, "is still pending", group.failures))
        try:
            return pending.result()
        except Exception as exc:  # noqa: BLE001 -- a failed pull: the worker's error, a timeout, a lost peer
            dead = group.probe()
            self.client._fail(self._failure_text(part, epoch, seq, f"failed: {_first_line(exc)}", dead), exc)

    def _failure_text(self, part: int, epoch: int, seq: int, what: str, dead: dict) -> tuple[str, str]:
        source = self.client.servers[part].name
        pull = f"batch {seq} of epoch {epoch} from {source} {what}"
        if dead:
            name = next(iter(dead))
            return name, f"is gone: {dead[name]}; {pull}"
        return source, f"{pull}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for s, session_id in zip(self.client.servers, self.sessions):
            try:
                s.call("CloseSession", pb.CloseSessionRequest(session_id=session_id), timeout=5.0)
            except Exception:  # noqa: BLE001 -- the server may be gone; its reaper cleans up
                pass
        self.client._forget(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def every_node_as_ids(spec: LoaderSpec, num_nodes: int) -> LoaderSpec:
    """``spec`` with input "every node" spelled out as the ids ``0..num_nodes-1``, which is how it
    travels to the servers (see :func:`graphfeed.proto.convert.open_session_request`)."""
    if spec.input.split is not None or spec.input.ids is not None:
        return spec
    return dataclasses.replace(spec, input=NodeInput(ids=torch.arange(num_nodes), node_type=spec.input.node_type))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
