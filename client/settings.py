"""How a trainer connects, besides the servers and the transport: one record, :class:`ConnectSettings`.

``connect(cluster, transport=..., settings=None, **options)`` fills it from its keywords (``timeout=30``,
``token=...``, ...), which are its field names; a record passed as ``settings`` is the base they replace.
It is checked once, when it is made.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DEFAULT_RECONNECT_TIMEOUT = 180.0   # seconds a running epoch waits for a restarted server


@dataclass(frozen=True)
class ConnectSettings:
    """A trainer's connection settings (seconds, MiB)."""

    timeout: float = 30.0                  # each control call, and the data-path group's formation
    rpc_timeout: float = 60.0              # each batch pull and data-path call
    advertise_host: str | None = None      # where the servers reach this process (None: the route's address)
    lease_seconds: float | None = None     # servers keep this trainer's workers without a heartbeat (None: theirs)
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT   # a running epoch waits for a restarted server (0: fail)
    token: str | None = field(default=None, repr=False)   # bearer token on every control call (never shown)
    tls_ca: Any = None                     # CA bundle: TLS on (PEM path or bytes)
    tls_cert: Any = None                   # client certificate (mTLS) ...
    tls_key: Any = None                    # ... and its key
    shm_slots: int = 8                     # shared-memory slots per same-host server (0: no shared memory)
    shm_slot_mb: float | None = None       # MiB per slot (None: from 64 MiB, grown to the batches)
    shm_max_slot_mb: float = 1024.0        # the largest a growing slot gets (MiB)
    job: str = ""                          # the job's name: its embedding checkpoints' namespace ("" = "default")

    def __post_init__(self) -> None:
        if not self.reconnect_timeout >= 0:
            raise ValueError(f"reconnect_timeout must be >= 0 seconds (0 = fail at once), "
                             f"got {self.reconnect_timeout!r}")
        if self.shm_slots < 0 or (self.shm_slot_mb is not None and not self.shm_slot_mb > 0):
            raise ValueError(f"shm_slots must be >= 0 (0: every pull over the data path) and shm_slot_mb > 0 "
                             f"(or None: slots grow to the batches), "
                             f"got {self.shm_slots} and {self.shm_slot_mb}")
        if not self.shm_max_slot_mb > 0:
            raise ValueError(f"shm_max_slot_mb must be > 0 (MiB: the largest a growing slot gets), "
                             f"got {self.shm_max_slot_mb}")

    @classmethod
    def of(cls, settings: ConnectSettings | None, options: dict[str, Any], caller: str) -> ConnectSettings:
        """``settings`` (default: the defaults) with ``options`` -- keywords named as the fields -- replacing
        theirs; TypeError naming an unknown keyword, as a function's signature would."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in options:
            if key not in names:
                raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}")
        return dataclasses.replace(settings if settings is not None else cls(), **options)

    def pull_options(self) -> dict[str, Any]:
        """A pull channel's options (the shared-memory one's: :class:`graphfeed.transport.shm.ShmPulls`)."""
        return {"shm_slots": int(self.shm_slots), "shm_slot_mb": self.shm_slot_mb,
                "shm_max_slot_mb": float(self.shm_max_slot_mb)}
