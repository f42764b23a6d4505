"""Session workers: one process per (trainer, server) that joins the trainer's torch RPC group.

- :mod:`.commands` -- the typed daemon->worker commands and their replies (one handler each).
- :mod:`.handle` -- what the daemon holds: start a worker, send it commands, stop it.
- :mod:`.process` -- the worker's main: partition, RPC group, command loop.
- :mod:`.session` -- one loader's epochs: plan, producers, buffer.
- :mod:`.buffer` -- finished batches waiting for the trainer's pulls (bounded in batches and bytes).
- :mod:`.peers` -- sampling over the group (local part + peer workers as remote sources).
- :mod:`.telemetry` -- the worker's counters and histograms, read by the daemon's metrics.
- :mod:`.rpc_api` -- the allow-list of functions callable over torch RPC.
"""
