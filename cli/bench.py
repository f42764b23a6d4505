"""``graphfeed bench sample|remote|online|pyg``: sampling throughput and latency, one JSON line.

``sample`` measures the in-process sampler (:mod:`graphfeed.bench.sample`, where every
field is defined); ``remote`` measures the same figures through ``graphfeed serve``
daemons and the client (:mod:`graphfeed.bench.remote`); ``online`` the latency of
``Client.sample`` (:mod:`graphfeed.bench.online`); ``pyg`` PyG's own loader over graphfeed's stores against
graphfeed's loader (:mod:`graphfeed.bench.pyg`).
"""
from __future__ import annotations

import inspect
import json
import sys

from graphfeed.cli.main import UsageError
from graphfeed.transport import registry

HELP = ("benchmarks: `bench sample` (in-process sampler), `bench remote` (through servers), `bench online` (latency), "
        "`bench embedding` (server-held embeddings), `bench channel` (the secure data path's channel alone), "
        "`bench pyg` (PyG's loader over graphfeed's stores), `bench failover` (replicated parts under faults)")


def _fanouts(text: str, flag: str = "--num-neighbors", example: str = "15,10,5") -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a comma-separated list of integers, e.g. {example}") from None


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    for name, help_, add in (
            ("sample", "in-process sampler throughput over the training nodes", _add_sample),
            ("remote", "the same figures through graphfeed servers and the client", _add_remote),
            ("online", "latency of online sampling (client.sample) through graphfeed servers", _add_online),
            ("embedding", "typed training with server-held embeddings vs without (accuracy, batch time, push "
                          "throughput)", _add_embedding),
            ("channel", "CPU per GB of the secure data path's channel alone (loopback, TLS or MACs)", _add_channel),
            ("pyg", "PyG's NeighborLoader over graphfeed's stores vs client.neighbor_loader (seeds/s)", _add_pyg),
            ("partition", "edge cut, node and training-node balance of each partition method", _add_partition),
            ("failover", "replicated parts under kill -9s or a rolling restart: failed batches, longest wait",
             _add_failover)):
        # a benchmark's own --help: its function's docstring (argparse refills the lines)
        add(sub.add_parser(name, help=help_, description=inspect.cleandoc(add.__doc__ or "")))


def _add_sample(p) -> None:
    """One warm-up epoch, then the median (and min/max) over --epochs shuffled epochs of the input nodes; prints
    one JSON line."""
    p.add_argument("--graph", required=True, help="partition folder (from `graphfeed partition`)")
    p.add_argument("--features", action="store_true",
                   help="also gather x/y of every sampled node and encode the batch (full produce_batch path)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: sample on a GPU with graphfeed's CUDA kernels (a one-part partition; default cpu)")
    p.add_argument("--gpu-cache-mb", type=int, default=1024,
                   help="with --device cuda: feature rows kept in GPU memory, highest degree first (default 1024)")
    _add_workload(p)


def _add_workload(p) -> None:
    """The workload arguments both benchmarks share (same names, same defaults)."""
    p.add_argument("--num-neighbors", default="15,10,5", help="per-hop fanouts, -1 = all (default 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    p.add_argument("--epochs", type=int, default=3, help="measured epochs after one warm-up (default 3)")
    p.add_argument("--input", default="train", help="input nodes: train, val, test or all (default train); "
                                                    "with --link the link split whose edges are the seeds")
    p.add_argument("--seed", type=int, default=0, help="shuffling and sampling seed (default 0)")
    p.add_argument("--replace", action="store_true", help="sample with replacement")
    p.add_argument("--direction", default="in", choices=("in", "out"), help="in-edges (default) or out-edges")
    p.add_argument("--link", action="store_true",
                   help="link mode: seeds are the edges of link split --input (partition with --link-split); "
                        "seeds/s counts seed edges; full link batches (negatives, endpoints' samples, features)")
    p.add_argument("--neg-ratio", type=float, default=1.0,
                   help="--link: binary negatives per seed edge, strict (default 1; 0 = none)")


def _add_servers(p, graph_help: str, *, required: bool = False) -> None:
    """The servers a benchmark runs against (the same flags in each): N started over --graph, or running ones."""
    p.add_argument("--servers", required=required, default=None,
                   help="N: start N `graphfeed serve` daemons on 127.0.0.1 over --graph (which has N parts); "
                        "or a comma-separated host:port list of running servers")
    p.add_argument("--graph", default=None, help=graph_help)


def _add_remote(p) -> None:
    """Start N servers on loopback (or use running ones), pull one warm-up epoch and --epochs measured epochs of
    the input nodes through the remote loader; prints one JSON line with the fields of `bench sample` plus
    servers, prefetch and, with --compare, ratio_vs_inprocess."""
    _add_servers(p, "partition folder (needed with --servers N and --compare)")
    p.add_argument("--hosts", type=int, default=None,
                   help="instead of --servers: N emulated hosts (namespaces; needs root), the trainer on one and a "
                        "server per part of --graph on each other one (N = parts + 1); adds CPU per process and "
                        "bytes per batch on each link")
    p.add_argument("--tls", action="store_true",
                   help="with --hosts: TLS on the servers (secure data path) with a self-signed certificate made for "
                        "the emulated hosts' addresses")
    p.add_argument("--link-rate", default=None,
                   help="with --hosts: shape each host's link to this tc rate (e.g. 1gbit; default unshaped)")
    p.add_argument("--features", action="store_true",
                   help="accepted for symmetry with `bench sample`: remote batches always carry x and y")
    p.add_argument("--prefetch", type=int, default=4, help="pulls in flight per server (default 4)")
    p.add_argument("--peer-path", default="auto", choices=("auto", "rpc"),
                   help="with --servers N: auto = servers read the other parts from the shared files on this host "
                        "(default), rpc = peer workers call each other over torch RPC, as across hosts")
    p.add_argument("--channel", default="auto", choices=("auto", "rpc"),
                   help="batch channel: auto = shared memory with servers on this host (default), rpc = over the "
                        "data path's network transport only")
    p.add_argument("--transport", default=registry.AUTO, choices=registry.choices(),
                   help=f"the data path: {registry.AUTO} = the servers' default, {registry.SECURED_DEFAULT} "
                        f"(authenticated; TLS with --tls-cert), {registry.TRUSTED_DEFAULT} = torch RPC asked for by "
                        f"name on both ends (started servers without a token or TLS)")
    p.add_argument("--tls-cert", default=None, help="with --servers N: TLS on the started servers with this PEM "
                                                    "certificate (self-signed: it is the client's CA too)")
    p.add_argument("--tls-key", default=None, help="the private key of --tls-cert")
    p.add_argument("--feature-dtype", default=None, choices=("bf16", "fp16", "int8"),
                   help="features cast (int8: quantized) on the servers before they are sent (default: as stored)")
    p.add_argument("--feature-cache-mb", type=float, default=0.0,
                   help="the loader's hot-feature cache in MiB: the servers skip the rows of the highest in-degree "
                        "nodes it holds (default 0 = none)")
    p.add_argument("--peer-cache-mb", type=float, default=0.0,
                   help="started servers (--servers N, --hosts N): each replicates this many MiB of the other parts' "
                        "rows its edges reach most, so peers are asked only for the rest (peer_cache_bytes; "
                        "default 0 = none)")
    p.add_argument("--server-device", default="cpu",
                   help="with --servers N: where the started servers sample: cpu (default), cuda or cuda:N")
    p.add_argument("--trainer-device", default=None,
                   help="the loader's device=: batches moved there one batch ahead (e.g. cuda; default: host)")
    p.add_argument("--pin-memory", action="store_true", help="the loader's pin_memory=True")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="a simulated training step per batch (GPU spin on --trainer-device, else a sleep), so "
                        "wait_ms_per_batch shows whether the copy hides behind the step (default 0 = none)")
    _add_workload(p)
    p.add_argument("--compare", action="store_true",
                   help="also run `bench sample --features` on --graph with the same settings (own process) "
                        "and report ratio_vs_inprocess = remote seeds/s / in-process seeds/s")


def _add_online(p) -> None:
    """Start N servers on loopback (or use running ones) and time client.sample calls of random nodes, one after
    another, per request size; prints one JSON line with p50/p99/mean/max latency (ms) per size."""
    _add_servers(p, "partition folder (needed with --servers N)", required=True)
    p.add_argument("--num-neighbors", default="15,10,5", help="per-hop fanouts, -1 = all (default 15,10,5)")
    p.add_argument("--sizes", default="1,64,1024", help="seeds per request, comma-separated (default 1,64,1024)")
    p.add_argument("--requests", type=int, default=200, help="measured requests per size (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="unreported requests per size first (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random node ids (default 0)")


def _add_pyg(p) -> None:
    """Start N servers on loopback (or use running ones); after a warm-up epoch of each, time --rounds epochs of
    client.neighbor_loader and of PyG's NeighborLoader over graphfeed's stores (GraphfeedSampler picked) on the
    same input nodes, alternating; prints one JSON line with both seeds/s and their ratio (graphfeed.bench.pyg)."""
    _add_servers(p, "partition folder (needed with --servers N)", required=True)
    p.add_argument("--num-neighbors", default="10,5", help="per-hop fanouts, -1 = all (default 10,5)")
    p.add_argument("--batch-size", type=int, default=512, help="seeds per batch (default 512)")
    p.add_argument("--input-count", type=int, default=20_480,
                   help="input nodes of the label type, a seeded random choice (default 20480)")
    p.add_argument("--rounds", type=int, default=3, help="measured epochs of each loader (default 3)")
    p.add_argument("--pyg-prefetch", type=int, default=4,
                   help="the PyG loader's batches ahead per server (default 4; 0 = one synchronous call per batch)")
    p.add_argument("--step-ms", type=float, default=0.0, help="a simulated training step per batch (a sleep)")
    p.add_argument("--seed", type=int, default=0, help="input choice and graphfeed loader seed (default 0)")


def _run_pyg(args) -> int:
    from graphfeed.bench.pyg import PygBenchConfig, bench_pyg

    cfg = PygBenchConfig(servers=_servers(args.servers), graph=args.graph,
                         num_neighbors=_fanouts(args.num_neighbors, example="10,5"), batch_size=args.batch_size,
                         input_count=args.input_count, rounds=args.rounds, pyg_prefetch=args.pyg_prefetch,
                         step_ms=args.step_ms, seed=args.seed)
    return _print_result("pyg", bench_pyg, cfg)


def _add_embedding(p) -> None:
    """Train the same to_hetero GraphSAGE on a typed graph twice through the servers: featureless node types as
    zeros, then as learnable server tables (SparseAdam); prints one JSON line (graphfeed.bench.embedding)."""
    _add_servers(p, "typed partition folder, e.g. of `graphfeed generate --preset mag-small` (needed with "
                    "--servers N)", required=True)
    p.add_argument("--dim", type=int, default=128, help="embedding width (default 128)")
    p.add_argument("--num-neighbors", default="10,5", help="per-hop fanouts for every edge type (default 10,5)")
    p.add_argument("--batch-size", type=int, default=512, help="seeds per batch (default 512)")
    p.add_argument("--epochs", type=int, default=3, help="training epochs per run (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--threads", type=int, default=0,
                   help="the trainer's torch threads (default 0: torch's own; 1 keeps a loaded machine's timings "
                        "from thread oversubscription)")
    p.add_argument("--feature-dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="the loaders' feature_dtype (default: as stored); bfloat16 also narrows the rows on the wire")


def _add_channel(p) -> None:
    """A secure-path server in a child process answers calls with --frame-mb MiB tensors until --mb MiB arrived;
    prints one JSON line with GB/s, send and receive CPU-s per GB and AES-GCM's own CPU-s per GB on this core
    (graphfeed.bench.channel)."""
    p.add_argument("--mb", type=float, default=1024.0, help="MiB received per repeat (default 1024)")
    p.add_argument("--frame-mb", type=float, default=8.0, help="MiB per answer (default 8)")
    p.add_argument("--inflight", type=int, default=4, help="calls in flight (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the cheapest is reported (default 3)")
    p.add_argument("--no-tls", action="store_true", help="the MAC'd plain channel instead of TLS")
    p.add_argument("--hosts", type=int, default=0,
                   help="2: the server and the receiver on two emulated hosts (root, network namespaces), so the "
                        "receive figure is a trainer's off its host; default: loopback")


def _add_partition(p) -> None:
    """For every part count and method, the assignment alone (the bounded path's first stage, nothing written): the
    edge cut (fraction of directed edges between parts), each method's cut over METIS's, and the largest part's
    nodes and training nodes over the mean; one line each (graphfeed.bench.partition_quality)."""
    from graphfeed.bench.partition_quality import add_arguments as add

    add(p)


def _add_failover(p) -> None:
    """Every part on --replicas daemons; a fault-free epoch, then epochs under --kills kill -9s of the replica in
    use (or a rolling restart of every daemon); prints one JSON line: failed batches, every seed once, failovers,
    the median / p99 / longest wait for a batch (graphfeed.bench.failover)."""
    from graphfeed.bench.failover import add_arguments as add

    add(p)


def _run_failover(args) -> int:
    from graphfeed.bench.failover import bench_failover, config_of

    try:
        cfg = config_of(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _print_result("failover", bench_failover, cfg)


def _run_channel(args) -> int:
    from graphfeed.bench.channel import ChannelBenchConfig, bench_channel

    try:
        cfg = ChannelBenchConfig(megabytes=args.mb, frame_mb=args.frame_mb, inflight=args.inflight,
                                 tls=not args.no_tls, repeats=args.repeats, hosts=args.hosts)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _print_result("channel", bench_channel, cfg)


def _run_embedding(args) -> int:
    from graphfeed.bench.embedding import EmbeddingBenchConfig, bench_embedding

    cfg = EmbeddingBenchConfig(servers=_servers(args.servers), graph=args.graph, dim=args.dim,
                               num_neighbors=_fanouts(args.num_neighbors, example="10,5"),
                               batch_size=args.batch_size, epochs=args.epochs, seed=args.seed,
                               threads=args.threads, feature_dtype=args.feature_dtype)
    return _print_result("embedding", bench_embedding, cfg)


def _run_online(args) -> int:
    from graphfeed.bench.online import OnlineBenchConfig, bench_online

    sizes, fanouts = _fanouts(args.sizes, "--sizes", "1,64,1024"), _fanouts(args.num_neighbors)
    cfg = OnlineBenchConfig(servers=_servers(args.servers), graph=args.graph, num_neighbors=fanouts, sizes=sizes,
                            requests=args.requests, warmup=args.warmup, seed=args.seed)
    return _print_result("online", bench_online, cfg)


def _print_result(name: str, bench, cfg) -> int:
    """Run ``bench(cfg)`` of the cluster benches and print its figures as one JSON line; exit code 1 with one
    line when a server failed to start or stop."""
    try:
        result = bench(cfg)
    except RuntimeError as exc:
        print(f"graphfeed bench {name}: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def _workload(args) -> dict:
    """The workload arguments (:func:`_add_workload`) as the keyword fields both bench configs
    share; each config turns them into its one :class:`LoaderSpec` (``cfg.loader``)."""
    return dict(num_neighbors=_fanouts(args.num_neighbors), batch_size=args.batch_size, epochs=args.epochs,
                input=args.input, seed=args.seed, replace=args.replace, direction=args.direction, link=args.link,
                neg_ratio=args.neg_ratio)


def _servers(text: str):
    text = text.strip()
    if text.isdigit():
        return int(text)
    addresses = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in addresses if a.rpartition(":")[0] == "" or not a.rpartition(":")[2].isdigit()]
    if not addresses or bad:
        raise UsageError(f"--servers {text!r}: give a number of servers to start, or host:port,host:port")
    return addresses


def _run_remote(args) -> int:
    from graphfeed.bench.remote import RemoteBenchConfig, bench_remote

    if (args.servers is None) == (args.hosts is None):
        raise UsageError("bench remote: give --servers N (or host:port,...) or --hosts N, one of them")
    if args.link_rate is not None and args.hosts is None:
        raise UsageError("--link-rate shapes the links of emulated hosts: give --hosts N too")
    if args.tls and args.hosts is None:
        raise UsageError("--tls makes a certificate for emulated hosts: give --hosts N (or --tls-cert with --servers)")
    servers = _servers(args.servers) if args.servers is not None else max(1, args.hosts - 1)
    cfg = RemoteBenchConfig(servers=servers, graph=args.graph, prefetch=args.prefetch,
                            compare=args.compare, channel=args.channel, peer_path=args.peer_path,
                            transport=args.transport, tls_cert=args.tls_cert, tls_key=args.tls_key,
                            feature_dtype=args.feature_dtype, feature_cache_mb=args.feature_cache_mb,
                            peer_cache_mb=args.peer_cache_mb,
                            server_device=args.server_device, trainer_device=args.trainer_device,
                            pin_memory=args.pin_memory, step_ms=args.step_ms, **_workload(args))
    try:
        hosts = args.hosts is not None
        result = _hosts_bench(cfg, args.hosts, args.link_rate, args.tls) if hosts else bench_remote(cfg)
    except RuntimeError as exc:  # a server failed to start or stop, a comparison run failed: one line
        print(f"graphfeed bench remote: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def _hosts_bench(cfg, hosts: int, link_rate: str | None, tls: bool = False) -> dict:
    from graphfeed.bench.hosts import bench_remote_hosts

    if cfg.compare:
        raise UsageError("--compare runs with --servers only (the in-process figure has no hosts)")
    return bench_remote_hosts(cfg, hosts, link_rate, tls)


def run(args) -> int:
    command = getattr(args, "bench_command", None)
    if command == "remote":
        return _run_remote(args)
    if command == "online":
        return _run_online(args)
    if command == "embedding":
        return _run_embedding(args)
    if command == "channel":
        return _run_channel(args)
    if command == "pyg":
        return _run_pyg(args)
    if command == "failover":
        return _run_failover(args)
    if command == "partition":
        from graphfeed.bench.partition_quality import run as run_partition

        return run_partition(args)
    if command != "sample":
        raise UsageError("choose a benchmark: `graphfeed bench sample --graph DIR ...`, "
                         "`graphfeed bench remote --servers N --graph DIR ...` or "
                         "`graphfeed bench online --servers N --graph DIR`")
    from graphfeed.bench.sample import SampleBenchConfig, bench_sample

    cfg = SampleBenchConfig(graph=args.graph, features=args.features, threads=args.threads, device=args.device,
                            gpu_cache_mb=args.gpu_cache_mb, **_workload(args))
    try:
        result = bench_sample(cfg)
    except RuntimeError as exc:  # --device cuda without a GPU or without the CUDA kernels: one line
        print(f"graphfeed bench sample: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
