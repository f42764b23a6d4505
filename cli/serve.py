"""``graphfeed serve``: run the sampler-server daemon for one partition.

    graphfeed serve --partition /srv/graph-2p --part 0 --port 50051
    graphfeed serve --config server.yaml                # every key of the schema
    GRAPHFEED_PORT=50052 graphfeed serve --config server.yaml
    graphfeed serve --config server.yaml --check-config # validate (opens the partition) and exit

Settings: defaults < YAML file < GRAPHFEED_<KEY> env vars < flags (see
graphfeed.server.daemon.config).  Once SERVING it prints one line on stdout:
``graphfeed-serve listening port=N host=H part=K pid=P`` (and writes N to --port-file).
Exit codes (graphfeed.server.daemon.exitcodes.ExitCode): 0 ok, 1 unexpected, 2 usage,
3 config error, 4 partition cannot be loaded, 5 cannot bind the port, 130 forced exit.
"""
from __future__ import annotations

import os
import sys

HELP = "run a sampler-server daemon for one partition"

# flag -> config key (every flag is optional: None means "not given")
FLAG_KEYS = ("partition", "part", "host", "port", "data_address", "metrics_port", "lease_seconds",
             "drain_grace_seconds", "log_format", "log_level", "tls_cert", "tls_key", "tls_client_ca", "token_file",
             "device", "data_path", "tls_peer_ca")


def add_arguments(parser) -> None:
    parser.epilog = ("exit codes: 0 ok, 1 unexpected error, 2 usage, 3 config error, 4 partition cannot be "
                     "loaded, 5 cannot bind the port, 130 forced exit (second signal). Every setting can also "
                     "come from GRAPHFEED_<KEY> env vars (e.g. GRAPHFEED_PORT); flags win over env, env over "
                     "the file.")
    parser.add_argument("--config", default=None, help="YAML config file (default: $GRAPHFEED_CONFIG)")
    parser.add_argument("--partition", default=None, help="partition folder (META.json inside)")
    parser.add_argument("--part", type=int, default=None, help="the part this server holds")
    parser.add_argument("--host", default=None, help="control-plane bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="control-plane port (default 50051; 0 = any free)")
    parser.add_argument("--data-address", default=None, help="interface the data path listens on (default: host)")
    from graphfeed.transport import registry

    parser.add_argument("--data-path", default=None, choices=registry.choices(),
                        help=f"{registry.AUTO} (default): the authenticated data path ({registry.SECURED_DEFAULT}), "
                             f"with or without a token or TLS; {registry.TRUSTED_DEFAULT} only by name (trusted "
                             f"networks only; trainers must ask for it too: "
                             f"connect(transport={registry.TRUSTED_DEFAULT!r}))")
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus HTTP port (default: off)")
    parser.add_argument("--lease-seconds", type=float, default=None, help="reap a trainer group after this "
                                                                          "long without Heartbeat (default 15)")
    parser.add_argument("--drain-grace-seconds", type=float, default=None,
                        help="on SIGTERM, wait this long for open groups to close (default 20)")
    parser.add_argument("--device", default=None, help="where session workers sample: cpu (default), cuda or cuda:N")
    parser.add_argument("--log-format", default=None, help="json or logfmt (default logfmt)")
    parser.add_argument("--log-level", default=None, help="debug, info, warning or error (default info)")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate: TLS on the control port (with --tls-key)")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", default=None, help="PEM CA: require client certificates it signed (mTLS)")
    parser.add_argument("--tls-peer-ca", default=None,
                        help="PEM CA that signed the other daemons' --tls-cert: session workers check their peers' "
                             "data-path certificates against it")
    parser.add_argument("--token-file", default=None,
                        help="file holding the bearer token every control call must carry (there is no --token "
                             "flag: command lines are visible to other users; use GRAPHFEED_TOKEN or the file)")
    parser.add_argument("--check-config", action="store_true",
                        help="validate the config and open the partition, then exit (0 = ok)")
    parser.add_argument("--port-file", default=None,
                        help="write the bound port to this file once SERVING (useful with --port 0)")


def _fail(code: int, message: str) -> int:
    print(f"graphfeed serve: error: {message}", file=sys.stderr, flush=True)
    return int(code)


def run(args) -> int:
    from graphfeed.server.daemon.config import ConfigError, load_config, token_file_exposure
    from graphfeed.server.daemon.exitcodes import ExitCode, StartupError

    flags = {k: getattr(args, k, None) for k in FLAG_KEYS}
    try:
        config = load_config(args.config, flags=flags)
    except ConfigError as exc:
        return _fail(ExitCode.CONFIG, str(exc))
    if config.log_format == "json":
        # torch's C++ warnings go straight to stderr, unformatted: keep them out of a JSON log (torch reads
        # this when it loads, which is after this point; session workers get it in their environment too).
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        if args.check_config:
            from graphfeed.server.daemon.served import load_partition

            served = load_partition(config)
            exposed = token_file_exposure(config.token_file)
            if exposed:
                print(f"warning: {exposed}", file=sys.stderr, flush=True)
            print(f"config ok: {config.summary()} num_parts={served.meta.num_parts} "
                  f"local_nodes={served.num_local_nodes}", flush=True)
            return ExitCode.OK
        from graphfeed.server.daemon.app import serve

        return serve(config, port_file=args.port_file)
    except StartupError as exc:
        return _fail(exc.code, str(exc))
    except Exception as exc:  # noqa: BLE001 -- a bug: keep the traceback for the report, then the one-line reason
        import traceback

        traceback.print_exc()
        return _fail(ExitCode.UNEXPECTED, f"unexpected {type(exc).__name__}: {exc}")
