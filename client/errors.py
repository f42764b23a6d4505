"""Exceptions of the client library.  Every message names the server (``host:port part K``)."""
from __future__ import annotations

from typing import TypeGuard

import grpc


class ClusterError(ValueError):
    """The cluster description is wrong: unreachable servers, mixed graphs, missing or doubled parts."""


class ServerError(RuntimeError):
    """A server failed, died or answered with an error; ``server`` is ``"host:port part K"``; ``code`` the gRPC
    status name of a failed control call ("" otherwise): ``DEADLINE_EXCEEDED`` is a server that did not answer
    in time (paused or busy), ``UNAVAILABLE`` one that refused or dropped the connection."""

    def __init__(self, server: str, message: str, code: str = ""):
        super().__init__(f"graphfeed server {server}: {message}")
        self.server, self.code = server, code


class InvalidRequest(ValueError):
    """The server refused a request as invalid (gRPC INVALID_ARGUMENT)."""


class NotFound(LookupError):
    """The server does not know the group or session (gRPC NOT_FOUND)."""


def from_rpc_error(server: str, what: str, exc: grpc.RpcError) -> Exception:
    """The Python exception for a failed control call: ValueError, LookupError or ServerError."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(f"{server}: {what}: {details}")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(f"{server}: {what}: {details}")
    name = code.name if code is not None else "error"
    return ServerError(server, f"{what} failed ({name}: {details})", code.name if code is not None else "")


def unanswered(exc: BaseException | None) -> TypeGuard[ServerError]:
    """Whether ``exc`` is a control call its server did not answer in time (DEADLINE_EXCEEDED): a server that is
    paused (SIGSTOP, a frozen VM) or overloaded looks so, as one that is gone does not -- a closed port refuses
    (UNAVAILABLE), a restarted server no longer knows the group (NOT_FOUND) or says another incarnation."""
    return isinstance(exc, ServerError) and exc.code == "DEADLINE_EXCEEDED"
