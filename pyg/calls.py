"""The pyg layer's calls to the session workers (through the client's ``DataCalls``) and their errors' text."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

from graphfeed.client.errors import ServerError
from graphfeed.transport.errors import PeerLost

if TYPE_CHECKING:
    from graphfeed.client.client import Client

WAIT_SLACK = 30.0   # seconds beyond rpc_timeout an answer may take
_PREFIX = re.compile(r"^\w+(?:Error|Exception): ")                     # "ValueError: ..."
_WRAPPED = re.compile(r"^\w+(?:Error|Exception)\((['\"])(.*)\1\)$")   # torch RPC's repr of a remote error


def on_every_part(client: Client, name: str, args_of: Callable[[int], tuple]) -> list[Any]:
    """Worker function ``name(*args_of(part))`` on every part at once, the answers in part order; a worker's
    refusal (ValueError) is raised as one line naming the server.  A lost server is waited for and the calls
    made again (:meth:`Client.call_with_recovery`)."""
    client._check_usable()
    return client.call_with_recovery(name, lambda: _once(client, name, args_of))


def _once(client: Client, name: str, args_of: Callable[[int], tuple]) -> list[Any]:
    pending = [client.group.calls.call(p, name, args_of(p), client.rpc_timeout) for p in range(len(client.servers))]
    answers = []
    for part, p in enumerate(pending):
        try:
            answers.append(p.result(timeout=client.rpc_timeout + WAIT_SLACK))
        except ValueError as exc:
            raise ValueError(f"{client.servers[part].name}: {name}: {remote_message(exc)}") from None
        except PeerLost:
            raise   # the client waits for the server
        except Exception as exc:  # noqa: BLE001 -- a timeout or a failure, named like the loaders name it
            raise ServerError(client.servers[part].name, f"{name} failed: {remote_message(exc)}") from exc
    return answers


def remote_message(exc: BaseException) -> str:
    """A worker's error message without the transport's wrapping (``On WorkerInfo(...):``, the remote
    traceback, ``ValueError('...')``)."""
    for line in str(exc).strip().splitlines():
        line = _PREFIX.sub("", line.strip())
        if not line or line.startswith(("Traceback", "On WorkerInfo")):
            continue
        wrapped = _WRAPPED.match(line)
        return _PREFIX.sub("", wrapped.group(2)) if wrapped else line
    return type(exc).__name__
