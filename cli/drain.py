"""``graphfeed drain HOST:PORT``: drain one server from afar, as SIGTERM does (the stop of a rolling upgrade).

Sends the Drain control call and prints one line: the server is draining -- its health says NOT_SERVING, new
groups and sessions are refused, its open groups are served for up to its ``drain_grace_seconds``, then it exits
0 -- and that grace.  A repeat answers the same and does not restart the grace.

``--wait SECONDS`` then waits, at most that long, until the server is gone (its port refuses connections) and
exits 0; at the bound it names the address and that it is still up (exit 1).  Exit codes: 0 draining (gone, with
``--wait``), 1 unreachable, refused or still up at the bound, 2 bad arguments.

Who may drain: on a daemon with an ``admin_token``, only that token (``--token-file`` holding it, or
``GRAPHFEED_TOKEN``); else whatever token the daemon requires (none on a daemon without one).  ``--token-file``,
``--tls-ca``, ``--tls-cert``/``--tls-key`` and ``GRAPHFEED_TOKEN`` work as for ``graphfeed status``.
"""
from __future__ import annotations

import argparse
import math
import socket
import sys
import time
from typing import Callable

import grpc

from graphfeed.cli import status
from graphfeed.core.constants import MAX_DRAIN_REASON, check_drain_reason

HELP = "drain a server remotely, as SIGTERM does (rolling upgrades); --wait until it is gone"
GONE_POLL = 0.1      # seconds between two looks at the port (a restarted daemon binds it again within seconds)
CONNECT_TIMEOUT = 1.0   # seconds one look may take (a host that drops packets: the look says "up")


def add_arguments(parser) -> None:
    parser.add_argument("address", metavar="HOST:PORT", help="control address of the server to drain")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="then wait up to SECONDS until the server is gone (its port refuses connections); "
                             "default 0: do not wait")
    parser.add_argument("--reason", default="", metavar="TEXT",
                        help=f"why (the server logs it with the caller's address; at most {MAX_DRAIN_REASON} "
                             f"characters)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for the Drain call (default 10)")
    parser.add_argument("--token-file", default=None,
                        help="file with the token: the operators' admin token where the server has one")
    parser.add_argument("--tls-ca", default=None, help="PEM CA bundle of the server's certificate (turns TLS on)")
    parser.add_argument("--tls-cert", default=None, help="PEM client certificate (mTLS), with --tls-key")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")


def run(args) -> int:
    address, open_channel = _target(args)
    try:
        with open_channel(address) as channel:
            reply = _drain(channel, args.reason, args.timeout)
    except grpc.RpcError as exc:
        return _fail(f"{address}: {_refusal(exc)}")
    print(f"{address} draining: its open groups are served up to {reply.grace_seconds:g} s (drain_grace_seconds), "
          f"then it exits", flush=True)
    if not args.wait:
        return 0
    if not wait_gone(address, time.monotonic() + args.wait):
        return _fail(f"{address} is still up after --wait {args.wait:g} s (its port accepts connections; its "
                     f"grace is {reply.grace_seconds:g} s): wait longer, or read its log")
    print(f"{address} gone", flush=True)
    return 0


def _target(args) -> tuple[str, Callable[[str], grpc.Channel]]:
    """The server's address and a function opening a control channel to it (``graphfeed status``'s: the same
    address check, token and TLS options); UsageError / ValueError (exit 2) for bad arguments."""
    from graphfeed.cli.main import UsageError

    if not (0 < args.timeout < math.inf):
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if not (0 <= args.wait < math.inf):
        raise ValueError(f"--wait must be 0 or more seconds (a finite number), got {args.wait:g}")
    check_drain_reason(args.reason)
    if args.address.endswith((".yaml", ".yml")):
        raise UsageError(f"{args.address} is a cluster file: drain takes one server's HOST:PORT (drain the servers "
                         f"of a rolling upgrade one at a time)")
    options = argparse.Namespace(servers=[args.address], token_file=args.token_file, tls_ca=args.tls_ca,
                                 tls_cert=args.tls_cert, tls_key=args.tls_key)
    addresses, open_channel = status.targets(options)
    return addresses[0], open_channel


def _drain(channel: grpc.Channel, reason: str, timeout: float):
    from graphfeed.proto import control_pb2 as pb
    from graphfeed.proto import control_pb2_grpc as pb_grpc

    return pb_grpc.ControlStub(channel).Drain(pb.DrainRequest(reason=reason), timeout=timeout)


def _refusal(exc: grpc.RpcError) -> str:
    """Why the Drain call failed, in one line (``graphfeed status``'s wording)."""
    code = exc.code()
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "this server has no Drain call (an older graphfeed): stop it with SIGTERM on its host"
    reason = status.rpc_error(exc)[1]
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{reason} (check the address, and that `graphfeed serve` runs there)"
    return reason


def wait_gone(address: str, deadline: float) -> bool:
    """Whether ``address``'s port refuses connections (the daemon closed it: it exited) before ``deadline``
    (``time.monotonic()``); looks every GONE_POLL s, each look bounded by CONNECT_TIMEOUT and the deadline."""
    host, _, port = address.rpartition(":")
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(CONNECT_TIMEOUT, left)):
                pass
        except ConnectionRefusedError:
            return True
        except OSError:
            pass   # no answer in time, or a network error: not seen gone
        time.sleep(min(GONE_POLL, max(0.0, deadline - time.monotonic())))


def _fail(message: str) -> int:
    print(f"graphfeed drain: error: {message}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="graphfeed drain")
    add_arguments(p)
    sys.exit(run(p.parse_args()))
