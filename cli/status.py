"""``graphfeed status HOST:PORT... | CLUSTER.yaml``: one table of every server, from the control plane.

For each server: gRPC health, then GetClusterInfo (graph, part) and GetStats (state, groups and
sessions open, batches/bytes served, buffered batches/bytes, uptime, sampler).  A server that does not
answer is a row saying why; the exit code is 1 when any server is down or not SERVING, else 0.
Servers are asked in parallel, each call bounded by ``--timeout``.

``--wait SECONDS`` first waits (at most that long) until every server reports SERVING: a daemon just started
with ``graphfeed serve`` takes a few seconds (maps its part, forms its workers' pool) before it answers, so a
script that starts servers can follow with ``graphfeed status --wait 60 ...`` instead of sleeping.  At the
bound it names the servers still not serving (stderr) and prints the table as it is then (exit 1).

Security: ``--token-file``, ``--tls-ca``, ``--tls-cert``/``--tls-key``, the cluster YAML's
``token_file:``/``tls:`` and ``GRAPHFEED_TOKEN`` work as for ``graphfeed.client.connect``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import grpc

HELP = "cluster health, sessions and throughput from the control plane"
CONTROL_SERVICE = "graphfeed.control.v1.Control"
COLUMNS = ("server", "health", "part", "state", "groups", "sessions", "batches", "bytes", "buf_batches",
           "buf_bytes", "uptime", "sampler")


@dataclass
class ServerRow:
    server: str
    up: bool
    health: str = "-"
    part: str = "-"
    state: str = "-"
    groups: int | None = None
    sessions: int | None = None
    batches: int | None = None          # served, every session so far
    bytes: int | None = None            # served, every session so far
    buf_batches: int | None = None      # produced, not yet pulled
    buf_bytes: int | None = None
    uptime: float | None = None         # seconds
    graph: str = ""
    metrics_port: int | None = None
    sampler: str = "-"                  # "native" or "reference" (the pure-torch fallback)
    error: str = ""


def add_arguments(parser) -> None:
    parser.add_argument("servers", nargs="+", metavar="HOST:PORT",
                        help="control addresses of the servers (or one cluster YAML with `servers:`)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call to a server (default 5)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to SECONDS for every server to report SERVING (a daemon takes a few "
                             "seconds after `graphfeed serve` starts); default 0: ask once")
    parser.add_argument("--json", action="store_true", help="one JSON object per server instead of the table")
    parser.add_argument("--token-file", default=None, help="file with the bearer token the servers require")
    parser.add_argument("--tls-ca", default=None, help="PEM CA bundle of the servers' certificates (turns TLS on)")
    parser.add_argument("--tls-cert", default=None, help="PEM client certificate (mTLS), with --tls-key")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")


def run(args) -> int:
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout:g}")
    if args.wait < 0:
        raise ValueError(f"--wait must be 0 or more seconds, got {args.wait:g}")
    addresses, open_channel = targets(args)
    with ThreadPoolExecutor(max_workers=min(16, len(addresses))) as pool:
        if args.wait:
            deadline = time.monotonic() + args.wait
            late = {a: why for a, why in zip(addresses, pool.map(
                lambda a: wait_serving(a, open_channel, deadline, args.timeout), addresses)) if why}
            if late:
                print(f"graphfeed status: error: not SERVING after --wait {args.wait:g} s: "
                      f"{'; '.join(f'{a} ({why})' for a, why in late.items())}; check that `graphfeed serve` runs "
                      f"there and read its log", file=sys.stderr, flush=True)
        rows = list(pool.map(lambda a: probe(a, open_channel, args.timeout), addresses))
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
    else:
        print(format_table(rows))
    return 0 if all(r.up and r.health == "SERVING" for r in rows) else 1


def targets(args):
    """The addresses, and a function opening a control channel to one of them."""
    from graphfeed.cli.main import UsageError

    cluster = args.servers[0] if len(args.servers) == 1 and args.servers[0].endswith((".yaml", ".yml")) \
        else list(args.servers)
    secured = (isinstance(cluster, str) or args.token_file or args.tls_ca or args.tls_cert or args.tls_key
               or os.environ.get("GRAPHFEED_TOKEN"))
    if not secured:  # the common case needs no client import (torch): status stays quick
        for a in cluster:
            host, sep, port = a.rpartition(":")
            if not (sep and host and port.isdigit()):
                raise UsageError(f"server address {a!r} is not host:port")
        return cluster, grpc.insecure_channel
    from graphfeed.client.cluster import parse_cluster
    from graphfeed.client.security import from_cluster

    token = None
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {args.token_file}: {exc.strerror}") from None
    security = from_cluster(cluster, token=token, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key)
    return parse_cluster(cluster), security.channel


def wait_serving(address: str, open_channel, deadline: float, timeout: float) -> str:
    """Ask ``address``'s health until it reports SERVING or ``deadline`` (``time.monotonic()``) passes: "" once it
    serves, else the last reason it did not.  Each try is a fresh channel (it connects at once, not after gRPC's
    growing reconnect back-off), bounded by ``timeout`` and the deadline."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    why = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return why
        try:
            with open_channel(address) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=CONTROL_SERVICE), timeout=min(timeout, left, 2.0),
                    wait_for_ready=True)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return ""
            why = f"health {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            why = "unreachable" if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                else rpc_error(exc)[1]
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def probe(address: str, open_channel, timeout: float) -> ServerRow:
    """One server's row; never raises (a failure is the row's ``error``)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from graphfeed.proto import control_pb2 as pb
    from graphfeed.proto import control_pb2_grpc as pb_grpc

    row = ServerRow(server=address, up=False)
    try:
        with open_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=CONTROL_SERVICE), timeout=timeout)
            row.up = True
            row.health = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
            control = pb_grpc.ControlStub(channel)
            info = control.GetClusterInfo(pb.ClusterInfoRequest(), timeout=timeout)
            stats = control.GetStats(pb.StatsRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        row.health, row.error = rpc_error(exc)
        return row
    except Exception as exc:  # noqa: BLE001 -- e.g. unreadable TLS files: still one row
        row.health, row.error = "ERROR", f"{type(exc).__name__}: {exc}"
        return row
    row.part, row.graph = f"{info.part_id}/{info.num_parts}", info.graph_name
    row.state, row.groups, row.sessions = stats.state, stats.groups_open, stats.sessions_open
    row.batches, row.bytes = stats.batches_served_total, stats.bytes_served_total
    row.buf_batches, row.buf_bytes = stats.buffered_batches, stats.buffered_bytes
    row.uptime, row.metrics_port = stats.uptime_seconds, stats.metrics_port or None
    row.sampler = stats.sampler or "-"
    return row


def rpc_error(exc: grpc.RpcError) -> tuple[str, str]:
    """``(health column, reason)`` for a failed call."""
    code = exc.code() if hasattr(exc, "code") else None
    details = ((exc.details() if hasattr(exc, "details") else "") or "").strip()
    first = details.splitlines()[0] if details else "no answer"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "DOWN", f"unreachable: {first}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "DOWN", "no answer in time (--timeout)"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return "DENIED", f"{first} (give --token-file or GRAPHFEED_TOKEN)"
    return "ERROR", f"{code.name if code else 'error'}: {first}"


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    n = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 86400}d{s % 86400 // 3600:02d}h" if s >= 86400 else f"{s // 3600}h{s % 3600 // 60:02d}m" \
        if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _failed(r: ServerRow) -> bool:
    return bool(r.error)


def _cells(r: ServerRow) -> list[str]:
    num = lambda v: "-" if v is None else str(v)  # noqa: E731 -- a one-line local formatter
    return [r.server, r.health, r.part, r.state, num(r.groups), num(r.sessions), num(r.batches), _size(r.bytes),
            num(r.buf_batches), _size(r.buf_bytes), _duration(r.uptime), r.sampler]


def format_table(rows: list[ServerRow]) -> str:
    """Fixed-width table; a server that failed is ``server  DOWN|ERROR  reason`` on its row."""
    body = {id(r): _cells(r) for r in rows if not _failed(r)}
    widths = [max([len(c)] + [len(cells[i]) for cells in body.values()] +
                  [len(r.server) for r in rows if i == 0]) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip()]
    for r in rows:
        if _failed(r):
            lines.append(f"{r.server.ljust(widths[0])}  {r.health.ljust(widths[1])}  {r.error}")
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(body[id(r)], widths)).rstrip())
    graphs = sorted({r.graph for r in rows if r.graph})
    down = sum(1 for r in rows if not (r.up and r.health == "SERVING"))
    summary = f"{len(rows)} server(s), {down} down or not serving"
    return "\n".join(lines + [summary + (f"; graph {', '.join(graphs)}" if graphs else "")] + replica_lines(rows))


def replica_lines(rows: list[ServerRow]) -> list[str]:
    """Where a part has replicas (more than one server of it answered): how many of each part's serve, and a
    warning for a part down to one serving replica (the next loss stalls its jobs)."""
    by_part: dict[str, list[ServerRow]] = {}
    for r in rows:
        if r.part != "-":
            part = r.part.split("/")[0]
            by_part.setdefault(f"{r.graph} part {part}" if r.graph else f"part {part}", []).append(r)
    if not any(len(found) > 1 for found in by_part.values()):
        return []
    serving = {part: sum(1 for r in found if r.health == "SERVING") for part, found in by_part.items()}
    lines = ["replicas: " + ", ".join(f"{part} {serving[part]}/{len(found)} serving"
                                      for part, found in sorted(by_part.items()))]
    lines += [f"warning: {part} has one serving replica left" for part, found in sorted(by_part.items())
              if len(found) > 1 and serving[part] == 1]
    return lines


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="graphfeed status")
    add_arguments(p)
    sys.exit(run(p.parse_args()))
