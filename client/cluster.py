"""The servers of a cluster: parsing the description, control channels, consistency checks."""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Sequence

import grpc

from graphfeed.client.errors import ClusterError, ServerError, from_rpc_error, unanswered
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc

log = logging.getLogger("graphfeed.client")
CONNECT_PROBE_TIMEOUT = 1.0   # seconds a TCP connect to a server may take before gRPC's wait takes over
RECONNECT_POLL = 0.5          # seconds between checks whether a restarted server is back
# grpc.health.v1 Check, called without the grpcio-health-checking package (a server-only dependency):
# the request HealthCheckRequest(service="") is empty on the wire, the reply is field 1 = status (varint).
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_SERVING = b"\x08\x01"
# The group capability OpenGroup returned, sent on every later control call (server/daemon/security.py).
CAPABILITY_HEADER = "graphfeed-group-capability-bin"
# Calls sent again when their server does not answer in time (DEADLINE_EXCEEDED: paused or busy, not gone), for
# up to ServerConn.patience seconds: calls a second delivery cannot harm (StartEpoch restarts the epoch at the
# same batch; an OpenSession carries its open_key, and the server answers a repeat with the session the first
# delivery opened).  Others raise at their first timeout.
RETRIED_WHEN_UNANSWERED = frozenset({"StartEpoch", "OpenSession"})


def parse_cluster(cluster) -> list[str]:
    """``host:port`` addresses from a YAML file (``servers: [...]``) or a list of addresses.

    ClusterError for an empty or doubled list, an entry that is not ``host:port``, and an
    address with a scheme (``grpc://host:port``): graphfeed takes bare ``host:port``.
    """
    if isinstance(cluster, str) and "://" in cluster:
        _refuse_scheme(cluster)
    if isinstance(cluster, (str, os.PathLike)) and not _looks_like_address(str(cluster)):
        addresses = _read_yaml(os.fspath(cluster))
    elif isinstance(cluster, str):
        addresses = [cluster]
    else:
        addresses = list(cluster)
    if not addresses:
        raise ClusterError("the cluster has no servers: give a list of host:port or a YAML file with `servers:`")
    for a in addresses:
        if isinstance(a, str) and "://" in a:
            _refuse_scheme(a)
        if not isinstance(a, str) or not _looks_like_address(a):
            raise ClusterError(f"server address {a!r} is not host:port")
    if len(set(addresses)) != len(addresses):
        raise ClusterError(f"the cluster lists a server twice: {addresses}")
    return list(addresses)


def _refuse_scheme(address: str) -> None:
    bare = address.split("://", 1)[1].rstrip("/")
    raise ClusterError(f"server address {address!r} has a scheme: pass host:port without one (e.g. {bare!r}); "
                       f"TLS is chosen with tls_ca=..., not with the address")


def _looks_like_address(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and not text.endswith((".yaml", ".yml")))


def _read_yaml(path: str) -> list[str]:
    import yaml

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise ClusterError(f"cannot read the cluster file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ClusterError(f"{path} is not valid YAML: {exc}") from None
    servers = doc.get("servers") if isinstance(doc, dict) else None
    if not isinstance(servers, list):
        raise ClusterError(f"{path} must contain `servers: [host:port, ...]`")
    return [str(s) for s in servers]


@dataclass
class ServerConn:
    """One server's control channel and what it said about itself."""

    address: str
    channel: grpc.Channel
    stub: pb_grpc.ControlStub
    info: pb.ClusterInfo | None = None
    group_lease: float = 0.0
    extra: dict = field(default_factory=dict)
    security: object = None   # ClientSecurity the channel was made with (None = plain text)
    # this trainer group's capability on this server (OpenGroupReply.group_capability; b"" before the group)
    capability: bytes = field(default=b"", repr=False)
    incarnation: str = ""     # the daemon's incarnation its OpenGroup answered (another one later: it restarted)
    patience: float = 0.0     # seconds a call of RETRIED_WHEN_UNANSWERED is sent again while unanswered

    @property
    def cluster_info(self) -> pb.ClusterInfo:
        """What the server said about itself; only after :func:`connect_all` reached it."""
        if self.info is None:
            raise ClusterError(f"{self.address} was not reached yet: connect before reading its cluster info")
        return self.info

    @property
    def part(self) -> int:
        return int(self.info.part_id) if self.info is not None else -1

    @property
    def name(self) -> str:
        return f"{self.address} part {self.part}" if self.info is not None else self.address

    @property
    def metadata(self) -> list[tuple[str, bytes]] | None:
        """The gRPC metadata of this trainer's calls: the group's capability once the group is open."""
        return [(CAPABILITY_HEADER, self.capability)] if self.capability else None

    @property
    def worker_start_seconds(self) -> float:
        """How long the server waits for a session worker to start (ClusterInfo; 0 from an older server)."""
        return float(getattr(self.info, "worker_start_seconds", 0.0) or 0.0)

    def call(self, method: str, request, timeout: float):
        """``method`` with the group's capability once the group is open (the server refuses a group's calls
        without it: PERMISSION_DENIED).  A call of :data:`RETRIED_WHEN_UNANSWERED` that its server does not
        answer within ``timeout`` is sent again until :attr:`patience` seconds passed: a paused server answers
        once it runs again (ServerError with code DEADLINE_EXCEEDED, naming the wait, past it)."""
        until = time.monotonic() + self.patience
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._call_once(method, request, timeout)
            except ServerError as exc:
                if method not in RETRIED_WHEN_UNANSWERED or not unanswered(exc):
                    raise
                if time.monotonic() >= until:
                    if attempts == 1:
                        raise
                    raise ServerError(self.name, f"{method} had no answer in {attempts} tries of {timeout:g} s "
                                                 f"(waited up to reconnect_timeout={self.patience:g} s for a paused "
                                                 f"or busy server): {exc}", exc.code) from None
                log.warning("graphfeed: %s did not answer %s within %g s (paused or busy?); sending it again, "
                            "for up to %g s in all", self.name, method, timeout, self.patience)

    def _call_once(self, method: str, request, timeout: float):
        try:
            return getattr(self.stub, method)(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(self.name, method, exc) from None

    def serving(self, timeout: float) -> bool | None:
        """The server's gRPC health: True when SERVING, False when it answers anything else (a daemon
        says NOT_SERVING from the moment it starts to drain: SIGTERM/SIGINT), None when it does not answer."""
        check = self.channel.unary_unary(HEALTH_CHECK)   # no (de)serializers: bytes in, bytes out
        try:
            return check(b"", timeout=timeout) == HEALTH_SERVING
        except grpc.RpcError:
            return None

    def draining(self, timeout: float) -> bool:
        """True when the server is draining (SIGTERM/SIGINT): its health says NOT_SERVING (cheap, checked
        first) and its stats say ``draining`` (health is also NOT_SERVING while a partition file is
        unreadable, which is no stop on purpose)."""
        if self.serving(timeout) is not False:
            return False
        try:
            return self.call("GetStats", pb.StatsRequest(), timeout=timeout).state == "draining"
        except Exception:  # noqa: BLE001 -- not answering is not a drain we can see
            return False

    def close(self) -> None:
        self.channel.close()

    def reopen(self) -> None:
        """A fresh control channel to the same address (after a server restart: no reconnect back-off)."""
        self.channel.close()
        self.channel = _make_channel(self.address, self.security)
        self.stub = pb_grpc.ControlStub(self.channel)

    def wait_back(self, deadline: float, budget: float, poll: float = RECONNECT_POLL) -> None:
        """Return once a server of this graph and part answers at :attr:`address`; bounded by
        ``deadline`` (``time.monotonic()``; ``budget`` is the whole wait in seconds, for the message).

        ServerError naming the server when the deadline passes (with the last reason it was not
        back) or when the server there holds another partition (refused: never resumed into).
        """
        old, why = self.cluster_info, "not tried yet"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerError(self.name, f"did not come back within reconnect_timeout={budget:g} s (waited "
                                             f"for a server of fingerprint {old.fingerprint[:12]} part "
                                             f"{old.part_id} to answer at {self.address}); last: {why}")
            try:
                probe_tcp(self.address, timeout=min(1.0, remaining))
                self.reopen()
                info = self.stub.GetClusterInfo(pb.ClusterInfoRequest(), timeout=min(5.0, max(0.5, remaining)))
            except (ClusterError, grpc.RpcError) as exc:
                why = error_line(exc)
                time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
                continue
            if (info.fingerprint, info.part_id, info.num_parts) != (old.fingerprint, old.part_id, old.num_parts):
                raise ServerError(self.name, f"came back with a different partition (fingerprint "
                                             f"{info.fingerprint[:12]}, part {info.part_id} of {info.num_parts}; "
                                             f"this client had fingerprint {old.fingerprint[:12]}, part "
                                             f"{old.part_id} of {old.num_parts}): refused to resume into it; "
                                             f"restart it with the partition it served")
            self.info = info
            return


def _make_channel(address: str, security) -> grpc.Channel:
    return security.channel(address) if security is not None else grpc.insecure_channel(address)


def error_line(exc: BaseException) -> str:
    text = (exc.details() if isinstance(exc, grpc.RpcError) and hasattr(exc, "details") else str(exc)) or ""
    text = text.strip()
    return text.splitlines()[0] if text else type(exc).__name__


def reach(address: str, timeout: float, security=None) -> ServerConn:
    """A control channel to ``address`` with the server's ClusterInfo (waits up to ``timeout`` s for it);
    ClusterError naming why the server cannot be reached (the channel then closed)."""
    probe_tcp(address)
    s = unreached(address, security)
    try:
        s.info = s.stub.GetClusterInfo(pb.ClusterInfoRequest(), timeout=timeout, wait_for_ready=True)
    except grpc.RpcError as exc:
        s.close()
        raise ClusterError(f"cannot reach graphfeed server {address}: {exc.code().name}: "
                           f"{exc.details()}{_security_hint(exc, security)}") from None
    return s


def unreached(address: str, security=None) -> ServerConn:
    """A control channel to ``address`` whose server has not answered yet (no ClusterInfo: its part is unknown)."""
    ch = _make_channel(address, security)
    return ServerConn(address, ch, pb_grpc.ControlStub(ch), security=security)


def probe_tcp(address: str, timeout: float = CONNECT_PROBE_TIMEOUT) -> None:
    """ClusterError at once when nothing accepts TCP connections at ``address`` (connection refused,
    unknown host).  A connect that merely takes longer than ``timeout`` s passes: gRPC's own wait
    (bounded by ``connect(timeout=)``) then decides."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except ConnectionRefusedError:
        raise ClusterError(f"cannot reach graphfeed server {address}: connection refused (nothing listens on "
                           f"port {port} of {host}; is the server up, and is {port} its control port?)") from None
    except socket.gaierror as exc:
        raise ClusterError(f"cannot reach graphfeed server {address}: unknown host {host!r} "
                           f"({exc.strerror}); check the address") from None
    except OSError:
        return   # timeout, unreachable route: gRPC's bounded wait reports it with its own status


def _security_hint(exc: grpc.RpcError, security) -> str:
    code = exc.code()
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return " (the server wants its bearer token: token=..., token_file in the cluster YAML or GRAPHFEED_TOKEN)"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        tls = security is not None and security.tls
        return (" (is the server up? does its certificate match tls_ca / the address?)" if tls else
                " (is the server up? if it uses TLS, pass tls_ca=... or `tls: {ca: ...}` in the cluster YAML)")
    return ""


def check_cluster(servers: Sequence[ServerConn]) -> None:
    """ClusterError unless ``servers`` hold one partitioning (one fingerprint) and every part of it, each part
    once or more (replicas)."""
    check_one_graph(servers)
    missing = missing_parts(servers)
    if missing:
        raise ClusterError(f"no server for part(s) {missing} of {servers[0].cluster_info.num_parts}: start them and "
                           f"list them (servers given: {', '.join(s.name for s in servers)})")


def check_one_graph(servers: Sequence[ServerConn]) -> None:
    """ClusterError naming the first server whose partitioning (fingerprint: the parts' content) differs."""
    first = servers[0].cluster_info
    for s in servers[1:]:
        info = s.cluster_info
        if info.fingerprint != first.fingerprint or info.num_parts != first.num_parts:
            raise ClusterError(f"{s.address} serves a different graph than {servers[0].address} "
                               f"(fingerprint {info.fingerprint[:12]} vs {first.fingerprint[:12]}, "
                               f"{info.num_parts} vs {first.num_parts} parts): list servers of one partitioning "
                               f"(a part's replicas serve the same partition files)")


def missing_parts(servers: Sequence[ServerConn]) -> list[int]:
    """The parts of the graph no server of ``servers`` serves."""
    return sorted(set(range(servers[0].cluster_info.num_parts)) - {s.part for s in servers})
