"""The servers of a cluster: parsing the description, control channels, consistency checks."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import grpc

from graphfeed.client.errors import ClusterError, from_rpc_error
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc


def parse_cluster(cluster) -> list[str]:
    """``host:port`` addresses from a YAML file (``servers: [...]``) or a list of addresses."""
    if isinstance(cluster, (str, os.PathLike)) and not _looks_like_address(str(cluster)):
        addresses = _read_yaml(os.fspath(cluster))
    elif isinstance(cluster, str):
        addresses = [cluster]
    else:
        addresses = list(cluster)
    if not addresses:
        raise ClusterError("the cluster has no servers: give a list of host:port or a YAML file with `servers:`")
    for a in addresses:
        if not isinstance(a, str) or not _looks_like_address(a):
            raise ClusterError(f"server address {a!r} is not host:port")
    if len(set(addresses)) != len(addresses):
        raise ClusterError(f"the cluster lists a server twice: {addresses}")
    return list(addresses)


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

    def call(self, method: str, request, timeout: float):
        try:
            return getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(self.name, method, exc) from None

    def close(self) -> None:
        self.channel.close()


def open_servers(addresses: Sequence[str], timeout: float, security=None) -> list[ServerConn]:
    """Channels to every server, their ClusterInfo, checked for consistency; sorted by part.

    ``security`` (:class:`graphfeed.client.security.ClientSecurity`): TLS and token; None = plain text.
    """
    servers = []
    for a in addresses:
        ch = security.channel(a) if security is not None else grpc.insecure_channel(a)
        servers.append(ServerConn(a, ch, pb_grpc.ControlStub(ch)))
    try:
        for s in servers:
            try:
                s.info = s.stub.GetClusterInfo(pb.ClusterInfoRequest(), timeout=timeout, wait_for_ready=True)
            except grpc.RpcError as exc:
                raise ClusterError(f"cannot reach graphfeed server {s.address}: {exc.code().name}: "
                                   f"{exc.details()}{_security_hint(exc, security)}") from None
        check_cluster(servers)
    except BaseException:
        for s in servers:
            s.close()
        raise
    return sorted(servers, key=lambda s: s.part)


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
    first = servers[0].cluster_info
    for s in servers[1:]:
        info = s.cluster_info
        if info.fingerprint != first.fingerprint or info.num_parts != first.num_parts:
            raise ClusterError(f"{s.address} serves a different graph than {servers[0].address} "
                               f"(fingerprint {info.fingerprint[:12]} vs {first.fingerprint[:12]}, "
                               f"{info.num_parts} vs {first.num_parts} parts): list servers of one partitioning")
    by_part: dict[int, list[str]] = {}
    for s in servers:
        by_part.setdefault(s.part, []).append(s.address)
    doubled = {p: a for p, a in by_part.items() if len(a) > 1}
    if doubled:
        raise ClusterError(f"part(s) served more than once: {doubled}; list each part's server exactly once")
    missing = sorted(set(range(first.num_parts)) - set(by_part))
    if missing:
        raise ClusterError(f"no server for part(s) {missing} of {first.num_parts}: start them and list them "
                           f"(servers given: {', '.join(s.name for s in servers)})")
