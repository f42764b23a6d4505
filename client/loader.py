"""The remote neighbor loader: batches sampled by the servers, pulled over the data-path group.

A loader is one session on every server.  Each ``iter()`` is an epoch: the client plans it
from the servers' input counts (:mod:`graphfeed.core.epoch`, the same plan the workers
compute), starts it on every server, and pulls its rank's batches in order from the server
that owns each batch's seeds, keeping ``prefetch`` pulls in flight per server.  Batches
equal :class:`graphfeed.server.loader.local.LocalNeighborLoader`'s for the same arguments.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Generator, Iterator

from graphfeed.client.embedding import attach_tables
from graphfeed.client.errors import NotFound, ServerError
from graphfeed.client.feature_cache import check_budget, load_feature_cache
from graphfeed.client.sessions import SessionSet
from graphfeed.core.agreement import check_ranks_agree, inputs_fingerprint, settings_fingerprint
from graphfeed.core.compat import BatchTransforms
from graphfeed.core.delivery import Delivery
from graphfeed.core.embedding import check_tables, hand_out_rows
from graphfeed.core.epoch import EpochPlan
from graphfeed.core.loader_stats import LoaderStats
from graphfeed.core.progress import EpochProgress, PygLoaderFace, check_cursor
from graphfeed.core.spec import LoaderSpec
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto.convert import open_session_request
from graphfeed.transport.errors import PeerLost
from graphfeed.transport.path import first_line
from graphfeed.transport.pending import Pending

if TYPE_CHECKING:
    from graphfeed.client.view import ClientView

WAIT_SLACK = 30.0  # seconds beyond the channel's own bounds that a wait for a pull may last
DRAIN_BOUND = 10.0  # seconds an abandoned epoch's in-flight pulls are waited for (close, exit)
log = logging.getLogger("graphfeed.client")


class GroupFailure(Exception):
    """A pull abandoned because ``server`` is gone (``reason``) or the group was re-formed: pushed into the
    loader's pulls in flight by :meth:`RemoteNeighborLoader.fail_pulls`."""

    def __init__(self, server: str, reason: str):
        super().__init__(f"{server}: {reason}")
        self.server, self.reason = server, reason


class PullFailed(Exception):
    """A pull of the running epoch failed; ``where`` = (server name, message) for the error the
    client raises when it cannot resume."""

    def __init__(self, where: tuple[str, str]):
        super().__init__(f"{where[0]}: {where[1]}")
        self.where = where


class RemoteNeighborLoader(PygLoaderFace):
    """Iterate PyG ``Data`` mini-batches sampled by the cluster's servers.

    Made by :meth:`graphfeed.client.Client.neighbor_loader` (arguments as PyG's
    ``NeighborLoader``) or :meth:`graphfeed.client.Client.open_loader` (a :class:`LoaderSpec`),
    kept as ``self.spec``.  Batches, ``input_id`` and ``state_dict`` equal the local loader's for the
    same arguments (input "every node" included).  ``ordered=True`` delivers the seeds in input
    order (batches may then span partitions, see :mod:`graphfeed.core.epoch`).  A typed graph gives
    ``HeteroData``.
    ``prefetch``: pulls in flight per server.  ``pin_memory`` / ``device`` (PyG's): batches in pinned memory /
    moved to that device one batch ahead, so the copy overlaps the training step
    (:class:`~graphfeed.core.delivery.Delivery`).  ``feature_cache_mb`` (None/0 = off): this loader keeps the
    feature rows of the label type's highest in-degree nodes within that many MiB
    (:mod:`graphfeed.client.feature_cache`); the servers leave those rows out of every batch and the
    loader fills them in, so batches are the same.  Each ``iter()`` is one epoch (0, 1, ...;
    :meth:`set_epoch` overrides); one iterator at a time (a second live one is a RuntimeError
    at ``iter()``).  :meth:`state_dict` / :meth:`load_state_dict` checkpoint the position.
    Under DDP, creating a loader and starting an epoch are collective: every rank must pass
    the same arguments (only ``rank`` differs), else every rank raises ValueError.  Raises
    :class:`ServerError` naming the server when a server fails or dies mid-epoch (within
    ``rpc_timeout``, usually at once).
    """

    def __init__(self, client: ClientView, spec: LoaderSpec, *, prefetch: int = 4,
                 feature_cache_mb: float | None = None, pin_memory: bool = False, device=None,
                 transforms: BatchTransforms | None = None, embeddings=None):
        if not isinstance(spec, LoaderSpec):
            raise TypeError(f"spec must be a LoaderSpec, got {type(spec).__name__}; "
                            f"use Client.neighbor_loader(...) for PyG-style arguments")
        if not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be a positive integer (pulls in flight per server), got {prefetch!r}")
        budget = check_budget(feature_cache_mb)
        self.delivery = Delivery(pin_memory, device)   # pinned / on the trainer's GPU, one batch ahead
        self.client = client
        self.embeddings = check_tables(embeddings, client.node_types)   # rows in every batch (core.embedding)
        self.spec = spec.ordered_input(client.num_nodes_of(spec.input.node_type))
        self.feature_cache = load_feature_cache(client, budget, self.spec.feature_dtype)
        if self.feature_cache is not None:
            self.spec = dataclasses.replace(self.spec, feature_cache=self.feature_cache.cached)
        self._cache_filled = 0   # rows the feature cache filled in this epoch
        self._cache_lock = threading.Lock()
        self.prefetch = prefetch
        self.transforms = transforms or BatchTransforms()
        self._progress = EpochProgress()
        self._closed = False
        self._stats = LoaderStats(self.spec.kind, len(client.servers))
        self._inflight: set[Pending] = set()   # this loader's pulls in flight (failed at once by group failures)
        spec = self.spec   # the request must not reference the loader (its finalizer runs when it is dropped)
        self.session_set = SessionSet(client, lambda: open_session_request(spec, client.group.group_id))
        self.counts: list[int] = []
        try:
            self.session_set.open()
            self.counts = list(self.session_set.counts)
            check_ranks_agree(self.spec, self.counts)
        except BaseException:
            self.close()
            raise
        # dropped without close() (garbage-collected, or with an abandoned iterator): its sessions are handed
        # to the client, which closes them (Client._close_orphans); the list is updated in place on a re-open
        self._finalizer = weakref.finalize(self, client._orphans.extend, _orphaned(self.session_set.live_ids))
        self._len_cache: tuple[int, int] | None = None

    @property
    def sessions(self) -> list[str]:
        """This loader's session id on every server (part order)."""
        return list(self.session_set.ids)

    def _session_request(self) -> pb.OpenSessionRequest:
        return open_session_request(self.spec, self.client.group.group_id)

    # ---- epochs ---------------------------------------------------------------------------------

    def _plan(self, epoch: int) -> EpochPlan:
        return EpochPlan(self.spec, self.counts, epoch)

    def __len__(self) -> int:
        epoch = self._progress.next_epoch
        if self._len_cache is None or self._len_cache[0] != epoch:
            self._len_cache = (epoch, len(self._plan(epoch)))
        return self._len_cache[1]

    def __iter__(self) -> Iterator:
        """The next epoch's batches (a loaded state's epoch from its cursor).  RuntimeError while an
        earlier iterator of this loader is still live (see :mod:`graphfeed.core.progress`); collective
        under DDP (checks that every rank starts the same epoch with the same loader)."""
        if self._closed:
            raise RuntimeError("this loader was closed")
        self.client._check_usable()
        epoch, start = self._progress.begin()
        plan = self._plan(epoch)
        check_cursor(epoch, start, len(plan))
        check_ranks_agree(self.spec, self.counts, epoch=epoch)
        self._stats.start_epoch(epoch)
        self._cache_filled = 0
        generation = self._start_epoch(plan, start, self.client.generation)
        batches = self._batches(plan, generation)
        self._progress.attach(batches, epoch, start, len(plan))
        return batches

    def _start_epoch(self, plan: EpochPlan, start: int, generation: int) -> int:
        """:meth:`_start_on_servers`, re-forming the client's group when a server is gone (see
        :meth:`Client.recover`); returns the client's generation it started under."""
        reopened = False
        while True:
            try:
                self._start_on_servers(plan, start)
                return generation
            except (ServerError, NotFound, PeerLost) as exc:   # PeerLost: the tables' attach lost its worker
                if not reopened and _session_expired(exc):   # idle too long (session_idle_seconds): open again
                    self.session_set.reopen(close_old=True)
                    reopened = True
                    continue
                server = self.client.server_name(exc.part) if isinstance(exc, PeerLost) else \
                    getattr(exc, "server", "cluster")
                where = (server, f"StartEpoch of epoch {plan.epoch} failed: {exc}")
                generation = self.client.recover(where, exc, generation)

    def _start_on_servers(self, plan: EpochPlan, start: int) -> None:
        """StartEpoch on every server at once: each produces its batches at positions ``>= start``."""
        attach_tables(self.session_set, self.embeddings, [s.part for s in self.client.servers],
                      self.client.rpc_timeout)
        planned = self.session_set.start_epoch(plan.epoch, start)
        for s, num_batches in zip(self.client.servers, planned):
            expected = sum(1 for seq, _ in plan.owned_by(s.part) if seq >= start)
            if num_batches != expected:
                raise ServerError(s.name, f"plans {num_batches} batches for epoch {plan.epoch} from batch {start}, "
                                          f"the client expects {expected}: client and server disagree on the "
                                          f"epoch contract (is the server an older graphfeed?)")

    def _batches(self, plan: EpochPlan, generation: int) -> Iterator:
        """Deliver ``plan``'s batches from the cursor on (started under client ``generation``); keeps
        :attr:`_progress` up to date.

        When a pull fails, the client re-forms its group once the dead server is back
        (:meth:`Client.recover`, bounded by ``reconnect_timeout``) and the epoch continues at
        the first batch the trainer has not received; otherwise the ServerError propagates.
        """
        progress = self._progress
        with progress.running():
            while progress.delivered < len(plan):
                try:
                    with contextlib.closing(self._stream(plan.epoch, plan.entries, progress.delivered,
                                                         generation)) as stream:
                        for data in self.delivery(stream):
                            progress.delivered += 1   # before the yield: the trainer holds it from here on
                            yield hand_out_rows(data, self.embeddings) if self.embeddings else data
                            del data   # not kept while the next batch is pulled (it may hold a shm slot)
                except PullFailed as failure:
                    if _session_expired(failure.__cause__) and self.client.generation == generation:
                        self.session_set.reopen(close_old=True)   # the servers expired an idle session
                    else:
                        generation = self.client.recover(failure.where, failure.__cause__, generation)
                    log.warning("graphfeed loader %s: resuming epoch %d at batch %d of %d", self.spec.kind,
                                plan.epoch, progress.delivered, len(plan))
                    self._stats.resumed()
                    generation = self._start_epoch(plan, progress.delivered, generation)
        self._stats.end_epoch()

    def _stream(self, epoch: int, entries, start: int, generation: int) -> Generator:
        """Batches ``start..`` of ``entries`` in order, ``prefetch`` pulls in flight per server;
        :class:`PullFailed` when a pull fails or the client's group was re-formed meanwhile."""
        inflight = [0] * len(self.client.servers)
        window: deque = deque()
        try:
            yield from self._stream_window(epoch, entries, start, generation, inflight, window)
        except GeneratorExit:   # an abandoned epoch (break, close, exit): its pulls land before the channel closes
            deadline = time.monotonic() + DRAIN_BOUND
            for _, _, pending in window:
                pending.wait_done(max(0.0, deadline - time.monotonic()))
            raise

    def _stream_window(self, epoch: int, entries, start: int, generation: int, inflight: list[int],
                       window: deque) -> Iterator:
        issued = start
        for _ in range(start, len(entries)):
            while issued < len(entries) and inflight[entries[issued].part] < self.prefetch:
                p = entries[issued].part
                window.append((issued, p, self._pull(p, epoch, issued)))
                inflight[p] += 1
                issued += 1
            got_seq, p, pending = window.popleft()
            data = self.transforms.to_pyg(self._wait(pending, p, epoch, got_seq, generation))
            del pending   # it holds the batch: a shared-memory slot is free once the trainer drops the batch
            inflight[p] -= 1
            self._stats.delivered(p)
            yield data
            del data
            self._stats.asked()

    def _filled(self, pending: Pending) -> Pending:
        """``pending``'s batch with the rows the servers left out for the feature cache filled in, as soon as
        it arrives (in the thread that completes it), so the copy overlaps the trainer's step."""
        cache = self.feature_cache
        if cache is None:
            return pending
        out = Pending()

        def fill(p: Pending) -> None:
            try:
                batch = p.result()
                filled = cache.fill(batch)
            except Exception as exc:  # noqa: BLE001 -- the pull's error or a bad batch, to the waiting trainer
                out.set_exception(exc)
                return
            with self._cache_lock:
                self._cache_filled += filled
            out.set_result(batch)

        pending.add_done_callback(fill)
        return out

    # ---- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this loader is (torchdata ``StatefulDataLoader`` convention): epoch, cursor (batches
        the trainer received of it), seed and fingerprints.  See :mod:`graphfeed.core.progress`."""
        return self._progress.state_dict(self.spec.seed, *self._fingerprints())

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` continue ``state``'s epoch at its cursor; ValueError when the
        state came from a loader with other settings or inputs."""
        self._progress.load_state_dict(state, self.spec.seed, *self._fingerprints())

    def _fingerprints(self) -> tuple[int, int]:
        return settings_fingerprint(self.spec), inputs_fingerprint(self.spec, self.counts)

    def stats(self) -> dict:
        """The trainer's view of the current (or last) epoch: wait vs wall time, data-stall ratio,
        batches/s, batches per server, and totals (see :mod:`graphfeed.client.metrics`); ``feature_cache``:
        the cache's rows and bytes, and the x rows (bytes) of this epoch it filled, which no server sent."""
        stats = self._stats.snapshot()
        cache = self.feature_cache
        stats["feature_cache"] = {
            "rows": 0 if cache is None else cache.num_rows, "bytes": 0 if cache is None else cache.nbytes,
            "rows_filled": self._cache_filled,   # x rows of this epoch the servers did not send
            "bytes_filled": 0 if cache is None else self._cache_filled * cache.row_bytes}
        return stats

    def _pull(self, part: int, epoch: int, seq: int) -> Pending:
        """Request batch ``seq`` of ``epoch`` from part ``part``'s worker over the group's batch channel
        (:class:`PullFailed` when even sending it fails, e.g. the peer is gone)."""
        sessions = self.session_set
        try:
            return self._watched(self._filled(self.client.group.channel.request(
                part, sessions.ids[part], sessions.secrets[part], epoch, seq)))
        except Exception as exc:  # noqa: BLE001 -- any failure to send is a failed pull, named like one
            where = self._failure_text(part, epoch, seq, f"could not be sent: {first_line(exc)}", {})
            raise PullFailed(where) from exc

    def _watched(self, pending: Pending) -> Pending:
        """``pending`` as a pull the client's failures reach: the returned Pending completes with the batch,
        or at once with :class:`GroupFailure` when a server's heartbeat fails or the group is re-formed
        (:meth:`fail_pulls`), whichever comes first."""
        out = Pending()
        self._inflight.add(out)

        def forward(p: Pending) -> None:
            try:
                out.try_set_result(p.result())
            except Exception as exc:  # noqa: BLE001 -- the pull's error, to the waiting trainer
                out.try_set_exception(exc)

        pending.add_done_callback(forward)
        out.add_done_callback(self._inflight.discard)
        failures = dict(self.client.group.failures)
        if failures:   # a heartbeat failed before this pull was sent: it fails as the others did
            server = next(iter(failures))
            out.try_set_exception(GroupFailure(server, failures[server]))
        return out

    def fail_pulls(self, server: str, reason: str) -> None:
        """Complete every pull of this loader still in flight with :class:`GroupFailure` (``server`` is gone
        for ``reason``): the client calls it when a heartbeat fails or the group is re-formed, so a waiting
        trainer learns of it at once."""
        for pending in list(self._inflight):
            pending.try_set_exception(GroupFailure(server, reason))

    def _wait(self, pending: Pending, part: int, epoch: int, seq: int, generation: int) -> dict:
        """The batch of ``pending``.  :class:`PullFailed` naming the server when a server went away (pushed
        by :meth:`fail_pulls`), the pull failed, the group was re-formed since the pull was sent, or no
        answer came within the channel's bounds (``rpc_timeout``, plus the slot wait and slack)."""
        client = self.client
        bound = 2 * client.rpc_timeout + WAIT_SLACK
        if not pending.wait_done(bound):
            raise PullFailed(self._failure_text(part, epoch, seq, f"had no answer within {bound:g} s", {}))
        try:
            return pending.result()
        except GroupFailure as gone:
            if client.generation != generation:
                raise PullFailed((client.servers[part].name, "the group was re-formed")) from gone
            raise PullFailed(self._failure_text(part, epoch, seq, "is still pending", {gone.server: gone.reason})) \
                from gone
        except Exception as exc:  # noqa: BLE001 -- a failed pull: the worker's error, a timeout, a lost peer
            if client.generation != generation:
                raise PullFailed((client.servers[part].name, "the group was re-formed")) from exc
            dead = client.group.probe()
            raise PullFailed(self._failure_text(part, epoch, seq, f"failed: {first_line(exc)}", dead)) from exc


    def _failure_text(self, part: int, epoch: int, seq: int, what: str, dead: dict) -> tuple[str, str]:
        source = self.client.servers[part].name
        pull = f"batch {seq} of epoch {epoch} from {source} {what}"
        if dead:
            name = next(iter(dead))
            return name, f"is gone: {dead[name]}; {pull}"
        return source, f"{pull}"

    def close(self) -> None:
        """Stop a live epoch (its in-flight pulls are waited for, at most DRAIN_BOUND s) and close the
        loader's sessions on the servers."""
        if self._closed:
            return
        self._closed = True
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()
        live = self._progress._gen() if self._progress._gen is not None else None
        if live is not None:
            with contextlib.suppress(Exception):   # only stops it; its errors belonged to the epoch
                live.close()
        self.session_set.close()
        self.client.remove_loader(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _session_expired(exc: BaseException | None) -> bool:
    """Whether a failed StartEpoch or pull means a server closed the session for being idle (the group lives)."""
    while exc is not None:
        text = str(exc)
        if "unknown session" in text or "expired: no StartEpoch" in text:
            return True
        exc = exc.__cause__
    return False


class _orphaned:
    """The ``(part, session id)`` pairs of a loader's sessions, read when the loader is collected."""

    def __init__(self, sessions: list[str]):
        self.sessions = sessions

    def __iter__(self):
        return iter(list(enumerate(self.sessions)))


