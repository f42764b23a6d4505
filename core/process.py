"""Facts about local processes that the trainer and the servers both check."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while a process with id ``pid`` exists on this host (also when it belongs to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
