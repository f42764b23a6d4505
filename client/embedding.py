"""A learnable embedding table held by the servers, as the trainer sees it (``client.embedding(...)``).

Each server holds the rows of the nodes its part owns, in this trainer group's session worker
(:mod:`graphfeed.server.embedding`); the table here holds no rows, only where they are (each part's range
of global ids) and the rows it handed out since the last optimizer step.  Every call goes through the
group's :class:`~graphfeed.transport.calls.DataCalls` (either data path), to all servers at once.  The
consistency model and the optimizers are in :mod:`graphfeed.core.embedding`.

After the client re-forms its group (a server restarted: :meth:`Client.recover`), every worker is new and
the tables are made again on first use, from the last checkpoint this table saved or loaded (rows and
optimizer state as saved), else from their initial rows.  Every call waits for a lost server the one way
the client does (:meth:`Client.call_with_recovery <graphfeed.client.client.Client.call_with_recovery>`,
bounded by ``reconnect_timeout``); a step's pushes an owner did not acknowledge are sent again to the
re-formed group, never dropped.
"""
from __future__ import annotations

import logging
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any, Sequence

import torch

from graphfeed.core.embedding import EmbeddingSpec, HandOut, SparseUpdate, check_name
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.errors import PeerLost
from graphfeed.transport.pending import Pending

if TYPE_CHECKING:
    from graphfeed.client.sessions import SessionSet
    from graphfeed.client.view import ClientView

log = logging.getLogger("graphfeed.client")


class RemoteEmbedding:
    """Table ``spec`` on the servers of ``client``; its rows appear in loader batches as ``field`` (made by
    :meth:`graphfeed.client.Client.embedding`)."""

    def __init__(self, client: ClientView, spec: EmbeddingSpec, field: str = "emb"):
        if not isinstance(field, str) or not field.isidentifier():
            raise ValueError(f"field must be an attribute name for the batch (e.g. 'emb' or 'x'), got {field!r}")
        self.client, self.spec, self.field = client, spec, field
        self.handed = HandOut(spec)
        self.checkpoint: str | None = None   # the tag last saved or loaded (what a re-formed group restores)
        self.closed = False
        self._lock = threading.Lock()
        self._generation = -1   # the client's generation whose workers hold the table (set once made)
        self._inflight: dict[int, _Push] = {}   # the last step's pushes, until every owner applied them
        # per owner: the number of its last push sent, in the owner's own sequence (the table's seq it reported
        # when made, restored or loaded, plus one per push since); a push sent again carries its number, so an
        # owner that applied it already (its answer lost with the group) does not apply it twice
        self._numbers: dict[int, int] = {}
        self.replica = uuid.uuid4().hex[:16]   # names this object's update logs on the owners
        self.bounds = torch.zeros(1, dtype=torch.int64)
        self.bounds = client.call_with_recovery(self._what("emb_create"), self._made)

    def __repr__(self) -> str:
        return (f"RemoteEmbedding({self.spec.name!r}, ntype={self.spec.ntype!r}, dim={self.spec.dim}, "
                f"dtype={self.spec.dtype}, rows={self.num_rows:,})")

    @property
    def num_rows(self) -> int:
        return int(self.bounds[-1])

    # ---- calls to every server ---------------------------------------------------------------------

    def _on_parts(self, name: str, args_of: dict[int, tuple]) -> dict[int, Any]:
        """Worker function ``name`` on each part of ``args_of`` at once; the answers by part (the first
        failure raised, naming the server)."""
        return self._wait(name, self._send(name, args_of))

    def _send(self, name: str, args_of: dict[int, tuple]) -> dict[int, Any]:
        calls, timeout = self.client.group.calls, self.client.rpc_timeout
        return {p: _sent(calls, p, name, args, timeout) for p, args in args_of.items()}

    def _what(self, call: str) -> str:
        return f"{call} of embedding table {self.spec.name!r}"

    def _wait(self, name: str, pending: dict[int, Any]) -> dict[int, Any]:
        timeout = self.client.rpc_timeout
        out, first = {}, None
        for p, pend in pending.items():
            try:
                out[p] = pend.result(timeout + 5.0)
            except Exception as exc:  # noqa: BLE001 -- wait for every part, then raise the first failure
                first = first or (p, exc)
        if first is not None:
            part, error = first
            if type(error) in (ValueError, LookupError, PermissionError, FileNotFoundError, RuntimeError):
                raise type(error)(f"embedding table {self.spec.name!r}: {name} on {self._server(part)}: "
                                  f"{remote_message(error)}") from error
            raise error
        return out

    def _server(self, part: int) -> str:
        return self.client.server_name(part)

    def _all(self) -> list[int]:
        return [s.part for s in self.client.servers]

    def _create(self) -> torch.Tensor:
        """Make the table on every part, all or nothing: when a part refuses (its ``embedding_bytes``, a clash of
        names), the parts that made it remove it again before the refusal is raised.  Each part keeps this
        object's update log (``replica``), which a restarted part replays."""
        pending = self._send("emb_create", {p: (self.spec, self.replica) for p in self._all()})
        try:
            ranges = self._wait("emb_create", pending)
        except Exception:
            self._undo_create(pending)
            raise
        self._numbers = {p: int(r[3]) for p, r in ranges.items()}
        bounds = [0]
        for p in sorted(ranges):
            start, stop = (int(v) for v in ranges[p][:2])
            if start != bounds[-1]:
                raise RuntimeError(f"embedding table {self.spec.name!r}: part {p} owns ids {start}..{stop - 1}, "
                                   f"expected them to start at {bounds[-1]}; are the servers of one partition?")
            bounds.append(stop)
        return torch.tensor(bounds, dtype=torch.int64)

    def _made(self) -> torch.Tensor:
        """:meth:`_create` on the client's current group, which then holds the table."""
        generation = self.client.generation
        bounds = self._create()
        self._generation = generation
        return bounds

    def _undo_create(self, pending: dict[int, Any]) -> None:
        """Remove the table from the parts whose ``emb_create`` made it (not from those that had it already)."""
        made = []
        for p, pend in pending.items():
            try:
                if bool(pend.result(0.0)[2]):
                    made.append(p)
            except Exception:  # noqa: BLE001 -- that part refused or is gone: nothing of it to remove
                continue
        try:
            self._on_parts("emb_close", {p: (self.spec.name,) for p in made})
        except Exception as exc:  # noqa: BLE001 -- the refusal is what the caller needs; this one is logged
            log.warning("embedding table %r: removing it from parts %s after a refusal failed: %s", self.spec.name,
                        made, exc)

    def ensure(self) -> None:
        """Make the table again when the client re-formed its group since (every worker is new): from the last
        checkpoint when there is one.  RuntimeError once the table is closed; PeerLost when a worker is lost
        meanwhile (the callers wait for it: :meth:`Client.call_with_recovery`).  A step in flight stays in
        flight: :meth:`flush` sends it again to the owners that had not applied it."""
        if self.closed:
            raise RuntimeError(f"embedding table {self.spec.name!r} was closed")
        with self._lock:
            if self._generation == self.client.generation:
                return
            generation = self.client.generation
            self._create()
            if self.checkpoint is not None:
                self._load_on_every_owner(self.checkpoint)
            log.warning("embedding table %r came back after the servers' group was re-formed: from %s and the "
                        "owners' update logs, at pushes %s", self.spec.name,
                        f"checkpoint {self.checkpoint!r}" if self.checkpoint is not None else "its initial rows",
                        dict(sorted(self._numbers.items())))
            self._generation = generation

    def _split(self, gids: torch.Tensor) -> dict[int, torch.Tensor]:
        """Positions of ``gids`` per owning part; ValueError for ids outside the type."""
        gids = self.spec.checked_ids(gids, self.num_rows)
        owner = torch.searchsorted(self.bounds, gids, right=True) - 1
        return {p: pos for p in range(len(self.bounds) - 1) if (pos := torch.nonzero(owner == p).view(-1)).numel()}

    # ---- rows and steps ----------------------------------------------------------------------------

    def rows(self, gids) -> torch.Tensor:
        """The current rows of global ids ``gids`` (a batch's ``emb_gid``), read from their owners: [n, dim]."""
        self.flush()
        gids = self.spec.checked_ids(gids, self.num_rows)
        return self.client.call_with_recovery(self._what("emb_rows"), lambda: self._rows(gids))

    def _rows(self, gids: torch.Tensor) -> torch.Tensor:
        self.ensure()
        where = self._split(gids)
        got = self._on_parts("emb_rows", {p: (self.spec.name, gids[pos]) for p, pos in where.items()})
        out = torch.empty(gids.numel(), self.spec.dim, dtype=self.spec.torch_dtype)
        for p, pos in where.items():
            out[pos] = got[p].to(out.dtype)
        return out

    def take_grads(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.handed.take()

    def push(self, gids: torch.Tensor, grads: torch.Tensor, update: SparseUpdate) -> None:
        """Send each owner its ids' gradient rows; it merges duplicates and applies ``update``.  Returns once the
        previous step was applied everywhere and this one is sent (one step in flight, so the owners apply it
        while the trainer computes the next batch); every read, checkpoint and close waits for it first.

        Each owner gets its ids in ascending order, with their rows gathered once into a tensor of their own
        (what the wire sends): an owner given distinct ascending ids applies them without sorting or
        merging (:func:`~graphfeed.core.embedding.coalesce`).

        A push an owner could not take (its server lost) is not dropped: :meth:`flush` waits for the owner
        within ``reconnect_timeout`` and sends it again (:meth:`Client.call_with_recovery`)."""
        sends = self._by_owner(gids, grads.to(torch.float32))
        self.flush()
        self.client.call_with_recovery(self._what("emb_create"), self.ensure)
        pushes = {p: _Push((self.spec.name, ids, rows, update)) for p, (ids, rows) in sends.items()}
        with self._lock:
            self._inflight = pushes
            self._send_pushes(pushes)

    def _send_pushes(self, pushes: dict[int, _Push]) -> None:
        """Send each push its current group's worker has not had yet.  A push sent before the group was re-formed
        is sent again only when its owner, restored from its update log, does not hold it (its number is past
        the owner's); one the owner holds leaves ``pushes`` as applied."""
        generation, calls = self.client.generation, self.client.group.calls
        for p, push in list(pushes.items()):
            if push.generation == generation:
                continue
            have = self._numbers.get(p, 0)
            if push.number and push.number <= have:   # sent to the old group, which applied (and logged) it
                del pushes[p]
                continue
            push.number = have + 1
            self._numbers[p] = push.number
            push.pending = _sent(calls, p, "emb_push", (*push.args, push.number), self.client.rpc_timeout)
            push.generation = generation

    def _by_owner(self, gids: torch.Tensor, grads: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per owning part: its ids ascending and their gradient rows; ValueError for ids outside the type."""
        ordered, order = torch.sort(self.spec.checked_ids(gids, self.num_rows))
        cuts = torch.searchsorted(ordered, self.bounds).tolist()   # where each part's ids begin
        return {p: (ordered[a:b].clone(), grads.index_select(0, order[a:b]))
                for p, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])) if b > a}

    def flush(self) -> None:
        """Wait until the step in flight is applied by every owner (its failure raised here, naming the server).
        An owner that was lost is waited for (``reconnect_timeout``), then sent the push again."""
        with self._lock:
            pushes, self._inflight = self._inflight, {}
        if pushes:
            self.client.call_with_recovery(self._what("emb_push"), lambda: self._deliver(pushes))

    def _deliver(self, pushes: dict[int, _Push]) -> None:
        """Wait for ``pushes``; each owner's that is applied leaves ``pushes``, so a retry after the group was
        re-formed (the table made again first) sends only those still owed."""
        self.ensure()
        with self._lock:
            self._send_pushes(pushes)
        try:
            self._wait("emb_push", {p: push.pending for p, push in pushes.items()})
        finally:
            for p, push in list(pushes.items()):
                if _applied(push.pending):
                    del pushes[p]
                elif _refused(push.pending) and self._numbers.get(p) == push.number:
                    self._numbers[p] = push.number - 1   # the owner refused it: its sequence did not move

    # ---- checkpoints -------------------------------------------------------------------------------

    def save(self, tag: str = "latest") -> None:
        """Every owner writes its rows and optimizer state as checkpoint ``tag`` under its ``embedding_dir``, in
        parallel (no trainer gathers the table).  Also what a re-formed group restores."""
        self._checkpoint("emb_save", tag)

    def load(self, tag: str = "latest") -> None:
        """Every owner replaces its rows and state with checkpoint ``tag`` of this job's namespace (saved by this
        run, or an earlier run with the same ``connect(job=...)``; another job's checkpoints are out of reach):
        FileNotFoundError naming the file a server lacks."""
        self._checkpoint("emb_load", tag)

    def _checkpoint(self, call: str, tag: str) -> None:
        """Every owner saves (``emb_save``) or loads (``emb_load``) checkpoint ``tag`` once the step in flight is
        applied; the tag is then what a re-formed group restores."""
        check_name(tag, "checkpoint tag")
        self.flush()
        self.client.call_with_recovery(self._what(call), lambda: self._on_every_owner(call, tag))
        self.checkpoint = tag

    def _on_every_owner(self, call: str, tag: str) -> None:
        self.ensure()
        if call == "emb_load":
            self._load_on_every_owner(tag)
        else:
            self._on_parts(call, {p: (self.spec.name, tag) for p in self._all()})

    def _load_on_every_owner(self, tag: str) -> None:
        """``emb_load`` of ``tag`` on every owner; each owner's push numbering continues from what it loaded."""
        loaded = self._on_parts("emb_load", {p: (self.spec.name, tag) for p in self._all()})
        self._numbers = {p: int(seq) for p, seq in loaded.items()}

    def state_dict(self, tag: str = "latest") -> dict:
        """Save checkpoint ``tag`` (:meth:`save`) and return what names it, for a training checkpoint."""
        self.save(tag)
        return {"table": self.spec.name, "ntype": self.spec.ntype, "dim": self.spec.dim, "tag": tag}

    def load_state_dict(self, state: dict) -> None:
        """Load the checkpoint a :meth:`state_dict` named; ValueError for another table's."""
        if state.get("table") != self.spec.name or state.get("dim") != self.spec.dim:
            raise ValueError(f"the state is of embedding table {state.get('table')!r} (dim {state.get('dim')}), "
                             f"not {self.spec.name!r} (dim {self.spec.dim})")
        self.load(str(state["tag"]))

    def close(self) -> None:
        """Free the rows on every server (saved checkpoints stay); the table is unusable afterwards."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self._generation == self.client.generation:
            try:
                self._on_parts("emb_close", {p: (self.spec.name,) for p in self._all()})
            except PeerLost as lost:   # its rows went with the worker; the group's re-forming frees the rest
                log.warning("embedding table %r: closing it on %s found the worker gone (%s)", self.spec.name,
                            self._server(lost.part), lost)


class _Push:
    """One owner's share of a step: its arguments, and the call of the group (``generation``) it was sent to."""

    __slots__ = ("args", "pending", "generation", "number")

    def __init__(self, args: tuple):
        self.args = args
        self.pending: Pending = Pending.failed(RuntimeError("not sent"))
        self.generation = -1   # not sent to any group yet
        self.number = 0        # its place in the owner's push sequence (0: not sent yet)


def _sent(calls: DataCalls, part: int, name: str, args: tuple, timeout: float) -> Pending:
    """``calls.call``; a group closed under the caller (re-formed meanwhile) is a failed Pending like any other."""
    try:
        return calls.call(part, name, args, timeout)
    except ConnectionError as exc:
        return Pending.failed(exc)


def _refused(pending: Pending) -> bool:
    """Whether ``pending`` failed with the owner's answer (not a lost owner, which may have applied it)."""
    if not pending.done():
        return False
    try:
        pending.result(0)
    except ConnectionError:
        return False
    except Exception:  # noqa: BLE001 -- the owner's refusal
        return True
    return False


def _applied(pending: Pending) -> bool:
    """Whether ``pending`` completed with a value (an owner applied its push)."""
    if not pending.done():
        return False
    try:
        pending.result(0)
    except Exception:  # noqa: BLE001 -- failed: still owed
        return False
    return True


def remote_message(exc: BaseException) -> str:
    """The worker's own one-line message inside a remote error (torch RPC wraps it as ``On w (...):\n
    ValueError("...")\nTraceback ...``; the secure path sends it as one line)."""
    text = str(exc)
    wrapped = re.search(r"^\w+\((['\"])(.*)\1\)$", text, re.M)
    if wrapped:
        return wrapped.group(2)
    return text.splitlines()[0] if text else type(exc).__name__


def attach_tables(session_set: SessionSet, tables: Sequence[RemoteEmbedding], parts: Sequence[int],
                  timeout: float) -> None:
    """Tell each part's session of ``session_set`` to put ``tables``' rows into its batches (before StartEpoch,
    again after a re-open: the sessions are new then)."""
    if not tables:
        return
    for t in tables:
        t.ensure()
    calls = tables[0].client.group.calls
    names = [t.spec.name for t in tables]
    pending = [calls.call(p, "emb_attach", (session_set.ids[p], session_set.secrets[p], names), timeout)
               for p in parts]
    for p in pending:
        p.result(timeout + 5.0)
