"""Exceptions of the client library.  Every message names the server (``host:port part K``)."""
from __future__ import annotations

import grpc


class ClusterError(ValueError):
    """The cluster description is wrong: unreachable servers, mixed graphs, missing or doubled parts."""


class ServerError(RuntimeError):
    """A server failed, died or answered with an error; ``server`` is ``"host:port part K"``."""

    def __init__(self, server: str, message: str):
        super().__init__(f"graphfeed server {server}: {message}")
        self.server = server


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
    return ServerError(server, f"{what} failed ({name}: {details})")
