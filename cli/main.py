"""``graphfeed`` command line: one subcommand per module of this package.

Each subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit code).  Modules are imported only when their command
runs, so ``graphfeed --help`` stays fast and the client-only install still works.
"""
from __future__ import annotations

import os

# Huge-page allocations for torch's large CPU tensors (batches are 10-100+ MB): torch
# reads this once, at its first allocation, so it is set before anything imports torch.
# Children (servers, workers, demo trainers) inherit it.  Set it to 0 to opt out.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import argparse  # noqa: E402 -- after THP_MEM_ALLOC_ENABLE is set (before torch can load)
import importlib  # noqa: E402 -- after THP_MEM_ALLOC_ENABLE is set (before torch can load)
import importlib.util  # noqa: E402 -- after THP_MEM_ALLOC_ENABLE is set (before torch can load)
import sys  # noqa: E402 -- after THP_MEM_ALLOC_ENABLE is set (before torch can load)

# command -> (module, one-line help)
COMMANDS = {
    "partition": ("graphfeed.cli.partition", "partition a graph into a graphfeed partition folder"),
    "info": ("graphfeed.cli.info", "describe a partition folder"),
    "quantize": ("graphfeed.cli.quantize", "store int8 feature scales in a partition written before they were"),
    "generate": ("graphfeed.cli.generate", "write a deterministic synthetic graph (.npy layout)"),
    "bench": ("graphfeed.cli.bench", "benchmarks: `bench sample` (in-process), `bench remote` (through servers), "
                                     "`bench online` (latency)"),
    "serve": ("graphfeed.cli.serve", "run a sampler-server daemon for one partition"),
    "demo": ("graphfeed.cli.demo", "end-to-end demo: generate, partition, serve, train with 2 DDP ranks"),
    "status": ("graphfeed.cli.status", "cluster health, sessions and throughput from the control plane"),
    "drain": ("graphfeed.cli.drain", "drain a server remotely, as SIGTERM does (rolling upgrades); --wait until "
                                     "it is gone"),
    "build-native": ("graphfeed.cli.build_native", "build the native sampling ops against the installed torch"),
}

# Modules only the `graphfeed[server]` extra installs: a command that needs one of them says so.
SERVER_EXTRA_MODULES = frozenset({"pymetis", "tqdm", "uvloop", "prometheus_client", "grpc_health",
                                  "grpc_reflection", "psutil"})
# command -> the server-extra modules it needs (checked before it runs, without importing them)
NEEDS = {
    "serve": ("uvloop", "prometheus_client", "grpc_health", "grpc_reflection", "psutil"),
    "partition": ("pymetis", "tqdm"),
    "status": ("grpc_health",),
    "demo": tuple(sorted(SERVER_EXTRA_MODULES)),
}
EXTRAS_HINT = "pip install 'graphfeed[server]'"


def missing_modules(names) -> list[str]:
    """Which of ``names`` cannot be imported here (looked up, not imported)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


class UsageError(Exception):
    """Bad arguments or input: printed as one line, exit code 2."""


def _available():
    out = {}
    for name, (module, help_) in COMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            out[name] = (module, help_)
    return out


def version() -> str:
    """The installed graphfeed's version (``unknown`` when run from a folder that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("graphfeed")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser(argv) -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="graphfeed",
                                     description="graphfeed: sampling service for distributed GNN training")
    parser.add_argument("--version", action="version", version=f"graphfeed {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = _available()
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_) in commands.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == wanted:  # import only the module that runs
            importlib.import_module(module).add_arguments(p)
    return parser, commands


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, commands = build_parser(argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    missing = missing_modules(NEEDS.get(args.command, ()))
    if missing:
        print(f"graphfeed {args.command}: error: this command needs the server extras (missing: "
              f"{', '.join(missing)}): {EXTRAS_HINT}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(commands[args.command][0])
        return int(module.run(args) or 0)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_EXTRA_MODULES:
            raise
        print(f"graphfeed {args.command}: error: this command needs the server extras (missing: {exc.name}): "
              f"{EXTRAS_HINT}", file=sys.stderr)
        return 2
    except (UsageError, ValueError, FileExistsError, FileNotFoundError) as exc:
        print(f"graphfeed {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"graphfeed {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
