"""The daemon settings a session worker reads, each declared once: :class:`WorkerSettings`.

The daemon's :class:`~graphfeed.server.daemon.config.ServerConfig` is a ``WorkerSettings`` plus the
settings only the daemon reads, and a worker's :class:`~.commands.GroupSpec` is one plus what the daemon
sets per trainer group; both inherit these fields, so a setting keeps one name, one default and one doc
from the config file (``buffer_bytes: 256MiB``) to the worker that reads it (``spec.buffer_bytes``).

A setting is declared with :func:`setting`: its default and the one line that documents it, kept in the
field's metadata (``DOC``) for the reference and the checks of the example config.  A new setting the
worker reads is one field here, its parser in ``server/daemon/config.py`` (``PARSERS``), its reader in
``server/worker/`` and its line in ``deploy/config/server.yaml`` (``tests/deploy`` checks it is there).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from graphfeed.transport.path import ListenerLimits

DOC = "doc"   # the field-metadata key of a setting's one-line description


def setting(default: Any, doc: str, *, secret: bool = False) -> Any:
    """A config setting's one declaration: its default and its one-line ``doc`` (field metadata); a ``secret``
    is left out of the record's repr."""
    return field(default=default, repr=not secret, metadata={DOC: doc})


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """The daemon settings a session worker reads (units in the names: seconds, bytes).

    Keyword-only, so the records that inherit them keep their own required fields positional."""

    num_producers: int = setting(2, "batches produced concurrently per session worker")
    buffer_batches: int = setting(8, "per session: produced-but-not-pulled batches")
    buffer_bytes: int = setting(256 << 20, "per session: produced-but-not-pulled bytes")
    rpc_timeout: float = setting(60.0, "seconds per data-path call (torch RPC or secure)")
    peer_timeout: float = setting(0.0, "seconds per call of a worker to a peer worker (0 = rpc_timeout / 2: "
                                       "below a pull's bound)")
    join_timeout: float = setting(60.0, "seconds a worker waits for its trainer's data-path group to form")
    colocated_reads: bool = setting(True, "read peer parts whose files this host shares directly, not over "
                                          "the data path")
    peer_cache_bytes: int = setting(0, "per session worker: other parts' hottest feature rows kept here "
                                       "(0 = none)")
    device: str = setting("cpu", 'where session workers sample: "cpu" or "cuda[:N]" (a GPU of this host)')
    gpu_cache_bytes: int = setting(1 << 30, "device: cuda -- GPU memory for the hottest feature rows")
    gpu_topology: str = setting("auto", 'device: cuda -- the topology in "gpu" memory, in pinned host memory '
                                        '("uva"), or "auto" (the daemon resolves it before a worker starts)')
    embedding_dir: str = setting("", 'where learnable embedding tables saved by name live ("" = saving '
                                     'refused)')
    embedding_bytes: int = setting(0, "what one trainer group's embedding tables may hold on this server, "
                                      "rows and optimizer state (0 = 1/4 of the memory limit)")
    data_handshake_timeout: float = setting(10.0, "secure data path: seconds from accept to a client's proof of its "
                                                  "key, one deadline however slowly its bytes arrive")
    data_handshakes: int = setting(256, "secure data path: connections in set-up at once per session worker "
                                        "(more are closed at once)")
    data_handshakes_per_source: int = setting(32, "secure data path: of those, from one IP address")
    data_connections: int = setting(256, "secure data path: authenticated connections at once per session worker "
                                         "(the trainer and the peers; more are refused)")
    data_call_bytes: int = setting(1 << 30, "secure data path: the largest body of one call a session worker "
                                            "reads (a longer one ends its connection unread)")
    embedding_log: bool = setting(True, "with embedding_dir: every embedding push is written to its table's update "
                                        "log (one fsync per push) before it is acknowledged, so a restarted "
                                        "server loses none")

    @property
    def peer_bound(self) -> float:
        """Seconds one call to a peer worker may take: shorter than a pull's bound (the trainer's rpc_timeout,
        60 s by default, as the daemon's), so a batch whose peer does not answer fails with the error naming
        that peer before the trainer's pull gives up on the batch."""
        return self.peer_timeout or self.rpc_timeout / 2

    @classmethod
    def settings_of(cls, config: WorkerSettings) -> dict[str, Any]:
        """The worker settings of ``config`` (the daemon's ``ServerConfig``) by name: what a worker is started
        with, never the daemon's own settings (its token, its TLS files)."""
        return {f.name: getattr(config, f.name) for f in fields(WorkerSettings)}

    @property
    def listener_limits(self) -> ListenerLimits:
        """The ``data_*`` settings as the bounds of a worker's data listener."""
        return ListenerLimits(handshake_timeout=self.data_handshake_timeout, handshakes=self.data_handshakes,
                              handshakes_per_source=self.data_handshakes_per_source,
                              connections=self.data_connections, call_bytes=self.data_call_bytes)
