"""Control-plane security: TLS (optionally mTLS) credentials and the bearer-token check.

* :func:`server_credentials` -- ``grpc.ServerCredentials`` from ``tls_cert``/``tls_key``
  (and ``tls_client_ca``: clients must present a certificate that CA signed), or None
  for a plain-text port.
* :class:`TokenAuthInterceptor` -- a ``grpc.aio`` server interceptor that lets a call
  through only when its metadata holds ``authorization: Bearer <token>`` equal to the
  configured token (constant-time compare).  Every other call ends with
  UNAUTHENTICATED and one log line (``auth_rejected`` with peer, method and reason).
  The gRPC health service is exempt, so orchestrators (systemd, Docker HEALTHCHECK,
  Kubernetes ``grpc:`` probes, which cannot send headers) can probe it; health reveals
  only SERVING / NOT_SERVING.

Handshake failures (a plain-text client on a TLS port, a client certificate no trusted
CA signed, an expired certificate) end in the TLS layer before any handler runs: the
client gets UNAVAILABLE, gRPC core logs them (``GRPC_VERBOSITY=debug``), this module
never sees them.

Raises :class:`StartupError` (exit code CONFIG) when a TLS file cannot be read.
"""
from __future__ import annotations

import hmac
from pathlib import Path

import grpc

from graphfeed.server.daemon.config import ServerConfig
from graphfeed.server.daemon.exitcodes import ExitCode, StartupError
from graphfeed.server.daemon.logs import EventLogger

AUTH_HEADER = "authorization"
BEARER = "bearer "
OPEN_SERVICES = ("/grpc.health.v1.Health/",)   # method prefixes callable without a token


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise StartupError(ExitCode.CONFIG, f"cannot read {what} {path}: {exc.strerror or exc}") from None


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials of the control port (mTLS with ``tls_client_ca``); None = plain text."""
    if config.tls_key is None or config.tls_cert is None:
        return None
    key = _read(config.tls_key, "tls_key")
    cert = _read(config.tls_cert, "tls_cert")
    ca = _read(config.tls_client_ca, "tls_client_ca") if config.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def bearer_token(metadata) -> str | None:
    """The token of the ``authorization: Bearer <token>`` entry of ``metadata``; None if there is none."""
    for key, value in metadata or ():
        if key.lower() == AUTH_HEADER:
            if isinstance(value, bytes):
                value = value.decode("latin-1")
            return value[len(BEARER):].strip() if value.lower().startswith(BEARER) else ""
    return None


def check_token(expected: str, metadata) -> str | None:
    """None if ``metadata`` carries ``expected``; otherwise the reason it does not (for the log and client)."""
    got = bearer_token(metadata)
    if got is None:
        return "no authorization metadata (send 'authorization: Bearer <token>')"
    if not got:
        return "authorization metadata is not 'Bearer <token>'"
    if not hmac.compare_digest(got.encode("utf-8", "replace"), expected.encode("utf-8")):
        return "wrong bearer token"
    return None


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuse (UNAUTHENTICATED) every call without the configured bearer token, except health checks."""

    def __init__(self, token: str, log: EventLogger):
        if not token:
            raise ValueError("TokenAuthInterceptor needs a non-empty token")
        self._token = token
        self.log = log
        self.rejected_total = 0

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        reason = check_token(self._token, handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        if reason is None:
            return handler
        return self._rejecting(handler, method, reason)

    def _rejecting(self, handler, method: str, reason: str):
        """A handler of the same streaming shape as ``handler`` that logs and aborts."""
        async def deny(request_or_iterator, context):
            del request_or_iterator   # set, not abort: abort's exception would keep the request in a cycle
            self.rejected_total += 1
            self.log.warning("auth_rejected", peer=context.peer(), method=method, reason=reason)
            context.set_code(grpc.StatusCode.UNAUTHENTICATED)
            context.set_details(f"{reason}; pass the server's token (graphfeed.client.connect(..., token=...), "
                                f"token_file in the cluster YAML, or GRAPHFEED_TOKEN)")

        req_stream = bool(handler and handler.request_streaming)
        resp_stream = bool(handler and handler.response_streaming)
        make = {(False, False): grpc.unary_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}[(req_stream, resp_stream)]
        return make(deny)


def server_interceptors(config: ServerConfig, log: EventLogger) -> list[grpc.aio.ServerInterceptor]:
    return [TokenAuthInterceptor(config.token, log)] if config.token else []
