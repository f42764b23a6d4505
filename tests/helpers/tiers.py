"""Which tests are ``slow``: those that start real processes (daemons, session workers, CLI runs, trainers).

A test is slow when its function, a fixture it uses (directly or through other fixtures) or a
function of its module that one of those calls (two levels deep) starts a process: launches a
cluster or server, calls ``gf.connect`` (each forms a group with one session worker per server),
runs a subprocess, or runs a CLI command that starts servers.  Marking by reading the source keeps
the tiers right for new tests without a decorator to forget; ``@pytest.mark.slow`` by hand still
works for slow tests that start nothing.
"""
from __future__ import annotations

import inspect
import re
import types

import pytest

STARTS_A_PROCESS = re.compile(r"\b(running_cluster|start_server|spawn_server|LocalCluster|connect|Popen|"
                              r"subprocess\.(run|call|check_call|check_output)|\w*WorkerHandle\.start|init_rpc|"
                              r"Process|run_chaos|bench_remote|run_demo)\("
                              r"|\"--servers\"|\[\"(serve|demo)\"")   # the CLI starting servers in-process
DEPTH = 2


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _starts(fn, module_globals: dict, depth: int, seen: set) -> bool:
    fn = inspect.unwrap(fn)
    if id(fn) in seen:
        return False
    seen.add(id(fn))
    if STARTS_A_PROCESS.search(_source(fn)):
        return True
    if depth == 0 or not hasattr(fn, "__code__"):
        return False
    names = set(fn.__code__.co_names) | {n for c in fn.__code__.co_consts if isinstance(c, types.CodeType)
                                         for n in c.co_names}
    return any(_starts(module_globals[n], module_globals, depth - 1, seen) for n in names
               if isinstance(module_globals.get(n), types.FunctionType)
               and module_globals[n].__module__ == module_globals.get("__name__"))


def starts_processes(item: pytest.Item) -> bool:
    """Whether the test ``item`` (a ``pytest.Function``) starts a real process."""
    fn = getattr(item, "function", None)
    if fn is None:
        return False
    seen: set = set()
    if _starts(fn, fn.__globals__, DEPTH, seen):
        return True
    fixtures = getattr(item, "_fixtureinfo", None)
    for defs in (fixtures.name2fixturedefs.values() if fixtures else ()):
        for fixturedef in defs:
            func = fixturedef.func
            if _starts(func, getattr(func, "__globals__", {}), DEPTH, seen):
                return True
    return False
