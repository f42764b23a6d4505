"""Shared test code: graph and partition writers (:mod:`helpers.graphs`), batch assertions, the daemon
environment (:mod:`helpers.cluster`), session-wide partitions and clusters (:mod:`helpers.shared`), a
certificate authority (:mod:`helpers.pki`), a stand-in session worker (:mod:`helpers.fake_worker`) and
a small GNN (:mod:`helpers.gnn`).  ``tests/`` is on ``sys.path`` through ``tests/conftest.py``."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent   # the repository root
