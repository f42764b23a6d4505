"""The tests' environment for ``graphfeed serve`` daemons; the launcher is :mod:`graphfeed.testing.cluster`.

    from graphfeed.testing.cluster import running_cluster

    with running_cluster(partition_dir, log_dir=tmp_path) as servers:   # one daemon per part, port 0
        addresses = [s.address for s in servers]                        # "127.0.0.1:PORT"
    # on exit: SIGTERM each, bounded wait, ClusterError (with the log tail) unless each exited 0

Hermetic tests: the daemon settings of the calling environment (``GRAPHFEED_<KEY>`` for
every config key, ``GRAPHFEED_CONFIG``) are removed for the whole test session
(``tests/conftest.py``), so daemons the launcher starts see only what a test gives them;
:func:`hermetic_env` builds the same environment for a ``subprocess.run`` of the CLI.
"""
from __future__ import annotations

import os
import signal

from graphfeed.server.daemon.config import KEYS, env_name

# re-exported for test modules that import the launcher from here
from graphfeed.testing.cluster import SERVE_COMMAND, running_cluster  # noqa: F401 -- re-exported

CONFIG_ENV_KEYS = ("GRAPHFEED_CONFIG",)


def daemon_setting_names() -> set[str]:
    """The environment variables a daemon reads its settings from."""
    return {env_name(k) for k in KEYS} | set(CONFIG_ENV_KEYS)


def hermetic_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without daemon settings, plus ``extra``."""
    drop = daemon_setting_names()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return env


def kill_server(server) -> None:
    """``kill -9`` of a test's daemon and its session workers (its process group); waits for the exit and marks
    the exit as expected (the cluster's teardown then checks nothing of it)."""
    server.expect_exit = -signal.SIGKILL
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(30)
    server.checked = True
