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

* Per-job authorization: ``OpenGroup`` hands its caller a group capability (32 random bytes); every
  later call on that group or its sessions carries it as ``graphfeed-group-capability-bin`` metadata
  (:func:`check_capability`, a constant-time compare).  One token is then no longer one trust domain:
  another job holding the same token cannot list, close, re-point or read a group it did not open.
  The refusal (PERMISSION_DENIED) names only what the caller sent.  ``GetStats`` lists only the groups
  whose capabilities the caller holds, unless it carries the admin token (``admin_token``) or the
  daemon has no token at all (:meth:`Authority.sees_all`).

Raises :class:`StartupError` (exit code CONFIG) when a TLS file cannot be read.
"""
from __future__ import annotations

import hmac
import secrets
from pathlib import Path

import grpc

from graphfeed.server.daemon.config import ServerConfig
from graphfeed.server.daemon.exitcodes import ExitCode, StartupError
from graphfeed.server.daemon.logs import EventLogger
from graphfeed.server.daemon.registry import RequestError

AUTH_HEADER = "authorization"
BEARER = "bearer "
OPEN_SERVICES = ("/grpc.health.v1.Health/",)   # method prefixes callable without a token
CAPABILITY_HEADER = "graphfeed-group-capability-bin"   # binary metadata: the group capability of OpenGroup
CAPABILITY_BYTES = 32


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


def new_capability() -> bytes:
    """A fresh group capability: only the caller of its OpenGroup learns it."""
    return secrets.token_bytes(CAPABILITY_BYTES)


def capabilities(metadata) -> list[bytes]:
    """Every group capability ``metadata`` carries (a client sends its group's; empty when none)."""
    out = []
    for key, value in metadata or ():
        if key.lower() == CAPABILITY_HEADER:
            out.append(value if isinstance(value, bytes) else str(value).encode("latin-1"))
    return out


def holds(capability: bytes, metadata) -> bool:
    """Whether ``metadata`` carries ``capability`` (each candidate compared in constant time)."""
    found = False
    for got in capabilities(metadata):
        found |= hmac.compare_digest(got, capability)
    return found


def check_capability(capability: bytes, metadata, what: str) -> None:
    """PERMISSION_DENIED unless ``metadata`` carries ``capability``; the message names only ``what`` (the
    caller's own input: the group or session id it sent), never the owner, its counts or its state."""
    if holds(capability, metadata):
        return
    raise RequestError(grpc.StatusCode.PERMISSION_DENIED,
                       f"this call does not carry the capability of {what}: only the trainer that opened a group may "
                       f"call on it and its sessions (send the OpenGroupReply.group_capability as "
                       f"{CAPABILITY_HEADER} metadata; graphfeed clients do)")


class Authority:
    """Who may call: the trainers' bearer token, each team's token (``tokens``: team -> token) and the
    operators' admin token all pass the token check; the admin token also sees every group in GetStats,
    and a team's token names the caller's team (its jobs' embedding namespace)."""

    def __init__(self, token: str | None, admin_token: str | None = None, teams: dict[str, str] | None = None):
        self.token, self.admin_token, self.teams = token, admin_token, dict(teams or {})

    @classmethod
    def of(cls, config: ServerConfig) -> "Authority":
        return cls(config.token, config.admin_token, config.tokens)

    @property
    def required(self) -> bool:
        return bool(self.token or self.teams)

    def reason(self, metadata) -> str | None:
        """None when ``metadata`` carries a token this daemon accepts; else why not."""
        if not self.required:
            return None
        accepted = [t for t in (self.token, self.admin_token, *self.teams.values()) if t]
        reasons = [check_token(t, metadata) for t in accepted]   # every one compared: no early exit
        return None if None in reasons else reasons[0]

    def is_admin(self, metadata) -> bool:
        return bool(self.admin_token) and check_token(self.admin_token or "", metadata) is None

    def team(self, metadata) -> str:
        """The team whose token ``metadata`` carries; "" for the trainers' token (or none)."""
        matched = [team for team, token in self.teams.items() if check_token(token, metadata) is None]
        return matched[0] if matched else ""

    def sees_all(self, metadata) -> bool:
        """GetStats shows every group: to the admin token, or on a daemon without a token (no tenants to
        tell apart: plain-text control planes are for trusted networks)."""
        return not self.required or self.is_admin(metadata)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuse (UNAUTHENTICATED) every call without the configured bearer token (or the admin token),
    except health checks."""

    def __init__(self, token: str | Authority, log: EventLogger):
        authority = token if isinstance(token, Authority) else Authority(token)
        if not authority.required:
            raise ValueError("TokenAuthInterceptor needs a non-empty token")
        self._authority = authority
        self.log = log
        self.rejected_total = 0

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        reason = self._authority.reason(handler_call_details.invocation_metadata)
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
    return [TokenAuthInterceptor(Authority.of(config), log)] if config.authenticates else []
