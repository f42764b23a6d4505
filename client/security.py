"""Client side of control-plane security: TLS / mTLS channels and the bearer token.

Sources, highest precedence first (per setting)::

    connect(..., token=, tls_ca=, tls_cert=, tls_key=)
    the cluster YAML:   servers: [...]
                        token_file: /path/token          # or token: ... (prefer the file)
                        tls: {ca: ca.crt, cert: client.crt, key: client.key}
    the environment:    GRAPHFEED_TOKEN

Relative paths in the cluster YAML are relative to the YAML file.  TLS is on when any of
``tls_ca`` / ``tls_cert`` / ``tls_key`` is given (``tls_ca`` None = the system's roots);
``tls_cert`` and ``tls_key`` (a client certificate, for mTLS) go together.  The token is
sent as ``authorization: Bearer <token>`` on every control call.  Errors are
:class:`ClusterError` (a ValueError) naming the setting.
"""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import grpc

from graphfeed.client.errors import ClusterError

TOKEN_ENV = "GRAPHFEED_TOKEN"
TLS_KEYS = ("ca", "cert", "key")


@dataclass(frozen=True)
class ClientSecurity:
    token: str | None = field(default=None, repr=False)
    tls_ca: str | None = None      # PEM CA bundle that signed the servers' certificates
    tls_cert: str | None = None    # PEM client certificate (mTLS), with tls_key
    tls_key: str | None = None

    @property
    def tls(self) -> bool:
        return any(v is not None for v in (self.tls_ca, self.tls_cert, self.tls_key))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=_read(self.tls_ca, "tls_ca"),
                                            private_key=_read(self.tls_key, "tls_key"),
                                            certificate_chain=_read(self.tls_cert, "tls_cert"))

    def channel(self, address: str) -> grpc.Channel:
        """A control channel to ``address``: TLS if configured, the token on every call if set."""
        ch = grpc.secure_channel(address, self.credentials()) if self.tls else grpc.insecure_channel(address)
        return grpc.intercept_channel(ch, BearerToken(self.token)) if self.token else ch


def _read(path: str | None, what: str) -> bytes | None:
    return None if path is None else _read_file(path, what)


def _read_file(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ClusterError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, d: grpc.ClientCallDetails) -> _CallDetails:
        metadata = [*(d.metadata or ()), self._header]
        return _CallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)


def _check_token(token, where: str) -> str:
    if not isinstance(token, str) or not token.strip() or any(c.isspace() for c in token.strip()):
        raise ClusterError(f"{where}: the token must be a non-empty string without spaces")
    return token.strip()


def _from_yaml(doc: Mapping | None, base: Path | None) -> dict:
    """``token`` / ``tls_*`` settings of a cluster YAML mapping (paths made relative to its folder)."""
    if not doc:
        return {}
    where = f"cluster file {base}" if base else "cluster file"
    out: dict = {}
    if doc.get("token") is not None and doc.get("token_file") is not None:
        raise ClusterError(f"{where}: give token or token_file, not both")
    if doc.get("token_file") is not None:
        path = _path(doc["token_file"], base)
        out["token"] = _check_token(_read_file(path, "token_file").decode("utf-8", "replace"), f"{where}: token_file")
    elif doc.get("token") is not None:
        out["token"] = _check_token(doc["token"], f"{where}: token")
    tls = doc.get("tls")
    if tls is not None:
        if not isinstance(tls, dict) or set(tls) - set(TLS_KEYS):
            raise ClusterError(f"{where}: tls must be a mapping with keys {', '.join(TLS_KEYS)}, e.g. "
                               f"tls: {{ca: ca.crt}}")
        out.update({f"tls_{k}": _path(v, base) for k, v in tls.items() if v is not None})
    return out


def _path(value, base: Path | None) -> str:
    p = Path(str(value)).expanduser()
    return str(p if p.is_absolute() or base is None else base.parent / p)


def resolve(*, token: str | None = None, tls_ca=None, tls_cert=None, tls_key=None, cluster_doc: Mapping | None = None,
            cluster_path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """Merge arguments > cluster YAML > environment into a :class:`ClientSecurity`; ClusterError if invalid."""
    environ = os.environ if environ is None else environ
    values: dict = {}
    if environ.get(TOKEN_ENV):
        values["token"] = _check_token(environ[TOKEN_ENV], TOKEN_ENV)
    values.update(_from_yaml(cluster_doc, Path(cluster_path) if cluster_path else None))
    given = dict(token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
    values.update({k: (os.fspath(v) if k != "token" else _check_token(v, "token=")) for k, v in given.items()
                   if v is not None})
    sec = ClientSecurity(**values)
    if (sec.tls_cert is None) != (sec.tls_key is None):
        raise ClusterError("a client certificate needs both tls_cert and tls_key (or neither)")
    for what in ("tls_ca", "tls_cert", "tls_key"):
        _read(getattr(sec, what), what)  # fail now, naming the file, not at the first call
    return sec


def from_cluster(cluster, **given) -> ClientSecurity:
    """:func:`resolve` with the cluster YAML's settings when ``cluster`` is a file (not an address list)."""
    from graphfeed.client.cluster import _looks_like_address

    doc = path = None
    if isinstance(cluster, (str, os.PathLike)) and not _looks_like_address(os.fspath(cluster)):
        import yaml

        path = os.fspath(cluster)
        try:
            with open(path) as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError) as exc:
            raise ClusterError(f"cannot read the cluster file {path}: {exc}") from None
        doc = doc if isinstance(doc, dict) else None
    return resolve(cluster_doc=doc, cluster_path=path, **given)
