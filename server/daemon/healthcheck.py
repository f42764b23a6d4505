"""A health probe for orchestrators: exit 0 iff the daemon's gRPC health says SERVING.

    python -m graphfeed.server.daemon.healthcheck [HOST:PORT] [--service NAME] [--timeout S]
                                                  [--tls-ca CA] [--tls-cert CRT --tls-key KEY]

HOST:PORT defaults to ``127.0.0.1:$GRAPHFEED_PORT`` (50051).  The health service needs no
bearer token (see :mod:`.security`); on a TLS port give the CA that signed the server's
certificate (and a client certificate when the server requires mTLS), also as
``GRAPHFEED_HEALTH_TLS_CA`` / ``_CERT`` / ``_KEY`` so a container HEALTHCHECK line needs no
flags.  Exit codes: 0 SERVING, 1 anything else (NOT_SERVING, draining, unreachable,
handshake failure), 2 usage.  Imports only grpc (fast enough for a probe every few seconds).
"""
from __future__ import annotations

import argparse
import os
import sys

EXIT_SERVING = 0
EXIT_UNHEALTHY = 1
DEFAULT_PORT = 50051
CONTROL_SERVICE = "graphfeed.control.v1.Control"


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m graphfeed.server.daemon.healthcheck",
                                description="exit 0 iff the graphfeed daemon at HOST:PORT is SERVING")
    p.add_argument("address", nargs="?", default=f"127.0.0.1:{env('GRAPHFEED_PORT') or DEFAULT_PORT}",
                   help="HOST:PORT of the control port (default 127.0.0.1:$GRAPHFEED_PORT or 50051)")
    p.add_argument("--service", default=CONTROL_SERVICE,
                   help=f"health service name (default {CONTROL_SERVICE}; '' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    p.add_argument("--tls-ca", default=env("GRAPHFEED_HEALTH_TLS_CA"), help="CA of the server's certificate")
    p.add_argument("--tls-cert", default=env("GRAPHFEED_HEALTH_TLS_CERT"), help="client certificate (mTLS)")
    p.add_argument("--tls-key", default=env("GRAPHFEED_HEALTH_TLS_KEY"), help="client key (mTLS)")
    return p


def _channel(args):
    import grpc

    if not (args.tls_ca or args.tls_cert):
        return grpc.insecure_channel(args.address)

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(root_certificates=read(args.tls_ca) if args.tls_ca else None,
                                         private_key=read(args.tls_key) if args.tls_key else None,
                                         certificate_chain=read(args.tls_cert) if args.tls_cert else None)
    return grpc.secure_channel(args.address, creds)


def probe(args) -> tuple[int, str]:
    """``(exit code, one-line status)``."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    names = health_pb2.HealthCheckResponse.ServingStatus
    try:
        with _channel(args) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
    except grpc.RpcError as exc:
        return EXIT_UNHEALTHY, f"{args.address}: unhealthy: {exc.code().name}: {exc.details()}"
    except OSError as exc:
        return EXIT_UNHEALTHY, f"{args.address}: unhealthy: cannot read a TLS file: {exc}"
    status = names.Name(reply.status)
    code = EXIT_SERVING if reply.status == health_pb2.HealthCheckResponse.SERVING else EXIT_UNHEALTHY
    return code, f"{args.address}: {status}"


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        print("healthcheck: error: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    code, line = probe(args)
    print(line, file=sys.stdout if code == EXIT_SERVING else sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
