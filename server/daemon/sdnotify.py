"""systemd's readiness protocol (``Type=notify``), in plain socket code.

systemd gives a service the datagram socket ``$NOTIFY_SOCKET`` (a path, or an abstract
name starting with ``@``).  The daemon sends ``READY=1`` once it serves (so ``systemctl
start`` returns only then), ``STOPPING=1`` when it starts draining, and, when the unit sets
``WatchdogSec=`` (systemd then exports ``WATCHDOG_USEC`` and ``WATCHDOG_PID``),
``WATCHDOG=1`` every half interval from its event loop: a stuck loop gets the service
restarted.  Without ``$NOTIFY_SOCKET`` every call does nothing.
"""
from __future__ import annotations

import os
import socket

NOTIFY_ENV = "NOTIFY_SOCKET"


def _address(raw: str) -> str:
    return "\0" + raw[1:] if raw.startswith("@") else raw


def notify(state: str) -> bool:
    """Send ``state`` (``KEY=VALUE`` lines) to systemd; ``False`` when not run under systemd's notify.

    Raises ``OSError`` only when ``$NOTIFY_SOCKET`` is set but cannot be reached (a broken set-up).
    """
    raw = os.environ.get(NOTIFY_ENV, "")
    if not raw:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(_address(raw))
        sock.sendall(state.encode())
    return True


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or ``None`` when no watchdog is
    asked of this process (unset, zero, malformed, or meant for another PID)."""
    usec = os.environ.get("WATCHDOG_USEC", "").strip()
    pid = os.environ.get("WATCHDOG_PID", "").strip()
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6
