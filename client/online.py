"""Online sampling: :meth:`graphfeed.client.Client.sample` -- one batch for arbitrary nodes, on demand.

Design: a request/response call on the existing data path, not a new gRPC method.  The batch is
made by the same producer the epochs use (:func:`graphfeed.server.sampling.producer.produce_online`)
inside the trainer's session worker on one server, which already reaches every other part's
worker for the remote hops and feature reads; the answer travels over the group's torch RPC like
a pulled batch (tensors, no protobuf copy).  A gRPC method would have to send the batch through
the daemon and its command pipe (two more copies) and re-implement the peer hops there.

Credentials and options: the first call with a set of sampling options opens one session per
server over the authenticated control plane (``OpenSession``, kind ``"online"``, a one-node
input): the daemon validates the options exactly as a loader's (INVALID_ARGUMENT for bad ones),
and the session's secret authorizes every later ``sample`` call.  Sessions are cached per option
set (the :data:`MAX_OPTION_SETS` most recent; older ones are closed) and re-opened after the
client re-forms its group.  A call that finds a server gone re-forms the group as a running loader
does (:meth:`Client.call_with_recovery`: waiting up to ``reconnect_timeout`` for the server to come back) and
is made once more.

Bad ids are checked on the client (:func:`graphfeed.core.spec.check_sample_ids`) and again by the
worker; a worker's refusal arrives as a torch RPC error and is raised as
:class:`~graphfeed.client.errors.InvalidRequest` (the INVALID_ARGUMENT class, a ValueError) naming
the server, the bad id and the valid range.  The worker and its server keep serving.
"""
from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

import torch

from graphfeed.client.errors import InvalidRequest, ServerError
from graphfeed.client.sessions import SessionSet
from graphfeed.core import batch as batch_codec
from graphfeed.core.spec import LoaderSpec, NodeInput, check_sample_ids
from graphfeed.proto.convert import open_session_request
from graphfeed.transport.errors import peer_lost

if TYPE_CHECKING:
    from graphfeed.client.view import ClientView

ONLINE_KIND = "online"   # the sessions' metrics label
MAX_OPTION_SETS = 4      # option sets whose sessions stay open (each holds one of max_sessions_per_group)
WAIT_SLACK = 30.0        # seconds beyond rpc_timeout a sample may take (the channel bounds it by rpc_timeout)


class OnlineSampler:
    """The client's online sampling (see the module doc); thread-safe."""

    def __init__(self, client: ClientView):
        self.client = client
        self._lock = threading.Lock()
        self._sessions: dict[tuple, SessionSet] = {}
        self._next = itertools.count()   # round robin over the servers that run the samples

    def sample(self, node_ids, spec: LoaderSpec, seed: int) -> dict[str, torch.Tensor]:
        """The wire batch for original ids ``node_ids`` (label type) sampled as ``spec.sampling``.

        When a server went away meanwhile, the client re-forms its group as a running loader does
        (:meth:`Client.call_with_recovery`, bounded by ``reconnect_timeout``) and the call is made again."""
        client = self.client
        what = "node" if len(client.node_types) == 1 else f"{client.label_type!r} node"
        ids = check_sample_ids(node_ids, client.num_nodes, what)
        return client.call_with_recovery(f"sample of {ids.numel()} node(s)", lambda: self._call(ids, spec, seed))

    def _call(self, ids: torch.Tensor, spec: LoaderSpec, seed: int, reopen: bool = True) -> dict[str, torch.Tensor]:
        client = self.client
        sessions = self._sessions_for(spec)
        part = next(self._next) % len(client.servers)
        server = client.servers[part].name
        try:
            pending = client.group.channel.sample(part, sessions.ids[part], sessions.secrets[part], ids, int(seed))
            value = pending.result(timeout=client.rpc_timeout + WAIT_SLACK)
        except ValueError as exc:      # the worker refused the ids: the server's INVALID_ARGUMENT
            raise InvalidRequest(f"{server}: sample: {_remote_message(exc)}") from None
        except Exception as exc:       # noqa: BLE001 -- a lost server, a timeout, a failed sample
            message = f"sample of {ids.numel()} node(s) failed: {_remote_message(exc)}"
            if reopen and "unknown session" in message:   # expired (the server's session_idle_seconds): once more
                with self._lock:
                    if self._sessions.get((spec.sampling, spec.feature_dtype)) is sessions:
                        del self._sessions[(spec.sampling, spec.feature_dtype)]
                return self._call(ids, spec, seed, reopen=False)
            if peer_lost(exc) is not None:
                raise   # the client waits for the server (call_with_recovery)
            raise ServerError(server, message) from exc
        return value

    def _sessions_for(self, spec: LoaderSpec) -> SessionSet:
        key = (spec.sampling, spec.feature_dtype)
        with self._lock:
            have = self._sessions.get(key)
            if have is not None and have.generation == self.client.generation:
                return have
            opened = self._open(spec)
            self._sessions.pop(key, None)
            self._sessions[key] = opened      # newest last
            while len(self._sessions) > MAX_OPTION_SETS:
                self._close(self._sessions.pop(next(iter(self._sessions))))
            return opened

    def _open(self, spec: LoaderSpec) -> SessionSet:
        """The option set's session on every server, opened at once (not tracked: a set of an earlier group
        is replaced by a new one at its next use)."""
        client = self.client
        return SessionSet(client, lambda: open_session_request(spec, client.group.group_id), track=False).open()

    def _close(self, sessions: SessionSet) -> None:
        """Close an evicted option set's sessions (those of an earlier group are gone with its workers)."""
        sessions.close()

    def close(self) -> None:
        """Close every option set's sessions (the client is closing)."""
        with self._lock:
            sets, self._sessions = list(self._sessions.values()), {}
        for sessions in sets:
            sessions.close()


def online_spec(num_neighbors, *, replace: bool, direction: str, weight_attr: str | None,
                feature_dtype) -> LoaderSpec:
    """The session record of an online option set: its sampling options and feature dtype, a one-node
    input (the sessions hold no epoch) and kind ``"online"``."""
    return LoaderSpec.of(NodeInput(ids=torch.tensor([0])), num_neighbors, batch_size=1, replace=replace,
                         direction=direction, rank=0, world_size=1, kind=ONLINE_KIND, weight_attr=weight_attr,
                         feature_dtype=feature_dtype, ordered=False)


def to_batch(wire: dict[str, torch.Tensor]):
    """The PyG ``Data``/``HeteroData`` of an online batch (the loaders' conversion)."""
    return batch_codec.to_pyg(wire)


def _remote_message(exc: BaseException) -> str:
    """The worker's message without torch's traceback lines (the first line that says something)."""
    for line in str(exc).strip().splitlines():
        line = line.strip()
        if line and not line.startswith("Traceback"):
            return line
    return type(exc).__name__
