"""GPU serving (issue 21) and the device-aware part sources it builds on (issue 19, item 4).

Everywhere: a source need not be a ``LocalSource`` to hold its part (the graph asks ``held()``),
batches leave a device in one copy and are unchanged on the CPU, the daemon's ``device`` setting
is validated, a ``device: cuda`` daemon on a machine without a GPU refuses to start with one line
and exit code 3, options the GPU cannot sample are named, and the trainer's ``pin_memory`` /
``device`` keywords behave as torch's DataLoader does without a GPU.

On a machine with a GPU and the CUDA kernels (``scripts/gpu_check.sh``): GPU-sampled batches equal
CPU-sampled ones bit for bit (node, typed, link, disjoint; topology in device memory and through
UVA), GPU daemons serve the remote loader the local loader's batches, a mixed cluster (one GPU
daemon, one CPU daemon) too, weighted sessions are refused at open, and ``pin_memory`` / ``device``
batches are pinned / on the GPU with the same values.
"""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from helpers.cluster import hermetic_env
from helpers.graphs import assert_same_batch, mag_tiny_parts

from graphfeed.core import batch as batch_codec
from graphfeed.core.delivery import Delivery
from graphfeed.core.epoch import EpochPlan, input_positions
from graphfeed.core.spec import LinkInput, LoaderSpec, NegativeSampling, NodeInput, SamplingSpec
from graphfeed.server.daemon.config import ConfigError, load_config
from graphfeed.server.loader.local import part_inputs
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.server.sampling.gpu import cuda_unavailable_reason, unsupported_on_gpu
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.server.sampling.link import LinkSeeds, produce_link_batch
from graphfeed.server.sampling.producer import planned_batches, produce_batch
from graphfeed.server.sampling.source import LocalSource

NO_GPU = cuda_unavailable_reason()
needs_gpu = pytest.mark.skipif(NO_GPU is not None, reason=f"GPU sampling unavailable: {NO_GPU}")


@pytest.fixture(scope="module")
def tiny2(tmp_path_factory):
    """``tiny`` in 2 random parts with a link split."""
    ei, x, y, splits = synth.generate_preset("tiny")
    root = tmp_path_factory.mktemp("gpu-serving") / "tiny2"
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, root, method="random", link_split={"val": 0.05})
    return root


def epoch_batches(graph: PartitionedGraph, spec: LoaderSpec, limit: int = 4) -> list[dict[str, torch.Tensor]]:
    """The wire form of the first ``limit`` batches of epoch 0 of ``spec`` over ``graph`` (every part here)."""
    parts = [s.held().part for s in graph.sources]
    inputs = part_inputs(parts, spec.input)
    counts = [t.numel() for t in inputs]
    plan = EpochPlan(spec, counts, 0)
    positions = [input_positions(counts, p) for p in range(len(inputs))]
    link = LinkSeeds(spec.input).resolve(graph, torch.cat(inputs)) if spec.is_link else None
    out = []
    for seq, entry, seeds, input_id in planned_batches(plan, inputs, positions):
        if seq >= limit:
            break
        if link is not None:
            out.append(produce_link_batch(graph, link, seeds, spec.sampling, entry, 0, seq,
                                          feature_dtype=spec.feature_torch_dtype))
        else:
            ntype = spec.input.type_or(graph.label_type)
            out.append(produce_batch(graph, seeds, spec.sampling, entry, 0, seq, input_type=ntype, input_id=input_id,
                                     feature_dtype=spec.feature_torch_dtype))
    return out


def assert_same_wire(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and a
    for wa, wb in zip(a, b):
        assert set(wa) == set(wb)
        for k in wa:
            assert wa[k].device.type == "cpu" and wb[k].device.type == "cpu", k
            assert wa[k].dtype == wb[k].dtype and torch.equal(wa[k], wb[k]), k


# ---- the seam: device-aware sources (CPU) ------------------------------------------------------------

class Wrapped:
    """A part source that is not a LocalSource: it holds its part through another object."""

    local = True
    device = torch.device("cpu")

    def __init__(self, inner: LocalSource):
        self.inner, self.part_id = inner, inner.part_id

    def held(self):
        return self.inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_source_is_asked_what_it_holds_not_what_class_it_is(tiny2):
    parts = open_parts(tiny2)[1]
    spec = LoaderSpec(SamplingSpec((5, 3)), NodeInput(split="train"), batch_size=256, shuffle=True, seed=3)
    wrapped = PartitionedGraph([Wrapped(LocalSource(p)) for p in parts])
    assert wrapped.device == torch.device("cpu") and [p.part_id for p in wrapped.parts] == [0, 1]
    assert_same_wire(epoch_batches(wrapped, spec), epoch_batches(PartitionedGraph.in_process(parts), spec))


def test_to_host_leaves_a_host_batch_alone():
    wire = {"a": torch.arange(5), "b": torch.ones(2, 3)}
    assert batch_codec.to_host(wire) is wire


# ---- the daemon setting and its refusals (CPU) ----------------------------------------------------------

def test_device_setting_is_validated(tiny2):
    assert load_config(environ={}, flags={"partition": str(tiny2), "part": 0}).device == "cpu"
    assert load_config(environ={}, flags={"partition": str(tiny2), "part": 0, "device": "CUDA:1"}).device == "cuda:1"
    with pytest.raises(ConfigError, match=r"flag --device: device = 'gpu' is invalid: expected cpu, cuda or cuda:N"):
        load_config(environ={}, flags={"partition": str(tiny2), "part": 0, "device": "gpu"})
    with pytest.raises(ConfigError, match="gpu_topology"):
        load_config(environ={"GRAPHFEED_GPU_TOPOLOGY": "disk"}, flags={"partition": str(tiny2), "part": 0})


@pytest.mark.skipif(NO_GPU is None, reason="this machine can sample on a GPU")
def test_a_cuda_daemon_without_a_gpu_refuses_to_start_with_one_line(tiny2):
    res = subprocess.run([sys.executable, "-m", "graphfeed.cli", "serve", "--partition", str(tiny2), "--part", "0",
                          "--port", "0", "--device", "cuda"], env=hermetic_env(), capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 3, res.stderr
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "GPU sampling needs a GPU" in lines[0] and "device cuda" in lines[0] and "set device: cpu" in lines[0]


def test_options_the_gpu_lacks_are_named():
    uniform = LoaderSpec(SamplingSpec((5, 3)), NodeInput(split="train"), batch_size=8)
    assert unsupported_on_gpu(uniform) is None
    weighted = LoaderSpec(SamplingSpec((5,), weight_attr="edge_attr:0"), NodeInput(split="train"), batch_size=8)
    assert "weight_attr='edge_attr:0' (weighted sampling) is not on the GPU" in unsupported_on_gpu(weighted)
    temporal = LoaderSpec(SamplingSpec((5,), time_attr="time"), NodeInput(split="train"), batch_size=8)
    assert "time_attr='time' (temporal sampling) is not on the GPU" in unsupported_on_gpu(temporal)


# ---- the trainer's keywords (CPU) -------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_pin_memory_is_ignored_with_a_warning_and_cuda_is_refused():
    with pytest.warns(RuntimeWarning, match="pin_memory=True is ignored: torch sees no GPU"):
        assert not Delivery(pin_memory=True).active
    with pytest.raises(ValueError, match=r"device='cuda': torch sees no GPU here .* drop device="):
        Delivery(device="cuda")
    with pytest.raises(ValueError, match="device must be a torch device"):
        Delivery(device="tpu-ish")


def test_delivery_one_batch_ahead_keeps_order_and_values():
    from torch_geometric.data import Data

    batches = [Data(x=torch.full((3, 2), float(i)), edge_index=torch.zeros(2, 0, dtype=torch.long)) for i in range(5)]
    seen = []

    def source():
        for b in batches:
            seen.append(len(seen))
            yield b

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = []
        for data in Delivery(device="cpu")(source()):
            got.append(data)
            assert len(seen) == min(len(got) + 1, 5)   # the next batch was prepared before this one came
    assert [float(d.x[0, 0]) for d in got] == [0.0, 1.0, 2.0, 3.0, 4.0]


# ---- on a GPU ------------------------------------------------------------------------------------------------

def gpu_graph(root, placement: str = "auto", cache_rows: int = 500) -> PartitionedGraph:
    from graphfeed.server.sampling.gpu import GpuSource

    parts = open_parts(root)[1]
    x = parts[0].nodes(parts[0].label_type).x
    row_bytes = 0 if x is None else x[0].numel() * x.element_size()
    return PartitionedGraph([GpuSource(p, "cuda", cache_bytes=cache_rows * row_bytes, placement=placement)
                             for p in parts])


@needs_gpu
@pytest.mark.parametrize("placement", ["gpu", "uva"])
@pytest.mark.parametrize("replace, disjoint", [(False, False), (True, False), (False, True)])
def test_gpu_node_batches_equal_cpu_batches(tiny2, placement, replace, disjoint):
    spec = LoaderSpec(SamplingSpec((10, 5, 3), replace=replace, disjoint=disjoint), NodeInput(split="train"),
                      batch_size=512, shuffle=True, seed=1)
    gpu = gpu_graph(tiny2, placement)
    assert gpu.device.type == "cuda" and all(s.placement == placement for s in gpu.sources)
    assert_same_wire(epoch_batches(gpu, spec), epoch_batches(PartitionedGraph.in_process(open_parts(tiny2)[1]), spec))
    assert sum(s.hits for s in gpu.sources) > 0 and all(s.hits <= s.reads for s in gpu.sources)


@needs_gpu
def test_gpu_link_batches_equal_cpu_batches(tiny2):
    spec = LoaderSpec(SamplingSpec((5, 3)), LinkInput(None, None, NegativeSampling("binary", 1.0), split="val"),
                      batch_size=128, shuffle=True, seed=2)
    assert_same_wire(epoch_batches(gpu_graph(tiny2), spec),
                     epoch_batches(PartitionedGraph.in_process(open_parts(tiny2)[1]), spec))


@needs_gpu
def test_gpu_link_batches_with_seed_edge_exclusion_and_int8_equal_cpu_batches(tiny2):
    """exclude_seed_edges (the driver drops the pairs on the GPU frontier) and int8 features (quantized on the
    GPU): the same bytes as the CPU graph's."""
    spec = LoaderSpec(SamplingSpec((5, 3), exclude_seed_edges=True),
                      LinkInput(None, None, NegativeSampling("binary", 1.0), split="train"), batch_size=128,
                      shuffle=True, seed=2, feature_dtype="int8")
    got = epoch_batches(gpu_graph(tiny2), spec)
    assert_same_wire(got, epoch_batches(PartitionedGraph.in_process(open_parts(tiny2)[1]), spec))
    assert all(w["x@_N"].dtype == torch.int8 for w in got)


@needs_gpu
def test_gpu_typed_batches_equal_cpu_batches(tmp_path):
    mag_tiny_parts(tmp_path / "mag", parts=2, method="random")
    parts = open_parts(tmp_path / "mag")[1]
    for direction in ("in", "out"):
        spec = LoaderSpec(SamplingSpec((4, 3), direction=direction), NodeInput(split="train"), batch_size=64,
                          shuffle=True, seed=5)
        assert_same_wire(epoch_batches(gpu_graph(tmp_path / "mag"), spec),
                         epoch_batches(PartitionedGraph.in_process(parts), spec))


@needs_gpu
def test_a_gpu_source_answers_a_cpu_peer_on_the_host(tiny2):
    from graphfeed.server.sampling.gpu import GpuSource

    part = open_parts(tiny2)[1][1]
    gpu, cpu = GpuSource(part, "cuda"), LocalSource(part)
    gids = torch.arange(part.start, part.start + 300)
    spec = SamplingSpec((7,), replace=False, direction="in")
    hops = gpu.serve_one_hop(part.etype, gids, spec, 7, 11, 1), cpu.serve_one_hop(part.etype, gids, spec, 7, 11, 1)
    for name in ("counts", "neighbors", "eids"):
        got, want = (getattr(h, name) for h in hops)
        assert got.device.type == "cpu" and torch.equal(got, want)
    for (_, got), (_, want) in zip(gpu.gather(part.ntype, gids).items(), cpu.gather(part.ntype, gids).items()):
        assert got.device.type == "cpu" and torch.equal(got, want)


def _remote_batches(addresses, n: int = 3, **kwargs) -> list:
    import graphfeed.client as gf

    with gf.connect(addresses) as client, client.neighbor_loader("train", [10, 5], batch_size=512, shuffle=True,
                                                                 seed=4, **kwargs) as loader:
        return [b for _, b in zip(range(n), loader)]


def _local_batches(root, n: int = 3) -> list:
    from graphfeed.server.loader.local import LocalNeighborLoader

    loader = LocalNeighborLoader(root, [10, 5], input_nodes="train", batch_size=512, shuffle=True, seed=4)
    return [b for _, b in zip(range(n), loader)]


@needs_gpu
@pytest.mark.parametrize("devices", [("cuda", "cuda"), ("cuda", "cpu")], ids=["gpu-daemons", "mixed"])
def test_gpu_daemons_serve_the_local_loaders_batches(tiny2, tmp_path, devices):
    from graphfeed.testing.cluster import start_server, stop_processes

    servers = [start_server(tiny2, p, log_dir=tmp_path, env={"GRAPHFEED_DEVICE": d}) for p, d in enumerate(devices)]
    try:
        remote = _remote_batches([s.address for s in servers])
        for got, want in zip(remote, _local_batches(tiny2)):
            assert_same_batch(got, want)
        assert "topology=" in servers[0].logs() and "samples part 0 on cuda:0" in servers[0].logs()
        import graphfeed.client as gf
        with gf.connect([s.address for s in servers]) as client:
            with pytest.raises(ValueError, match=r"samples on cuda:0: weight_attr='edge_attr:0' \(weighted sampling\)"):
                client.neighbor_loader("train", [5], batch_size=64, weight_attr="edge_attr:0")
    finally:
        assert stop_processes([s.proc for s in servers]) == [0, 0], [s.log_tail() for s in servers]


@needs_gpu
def test_pinned_and_device_batches_hold_the_same_values(tiny2, tmp_path):
    from graphfeed.testing.cluster import LocalCluster

    with LocalCluster(tiny2, 2, log_dir=tmp_path) as cluster:
        plain = _remote_batches(cluster.addresses)
        pinned = _remote_batches(cluster.addresses, pin_memory=True)
        on_gpu = _remote_batches(cluster.addresses, pin_memory=True, device="cuda")
    for a, b, c in zip(plain, pinned, on_gpu):
        assert b.x.is_pinned() and not a.x.is_pinned()
        assert c.x.device.type == "cuda" and c.edge_index.device.type == "cuda"
        assert_same_batch(a, b)
        assert_same_batch(a, c.to("cpu"))


def test_gpu_cache_counts_add_up_across_workers():
    from graphfeed.server.daemon.metrics import METRICS, empty_figures, merge_figures

    total = merge_figures(empty_figures(), {"gpu_cache": {"hit": 30, "miss": 10}})
    merge_figures(total, {"gpu_cache": {"hit": 5, "miss": 5}})
    merge_figures(total, {"errors": {"produce": 1}})           # a CPU worker's snapshot has no gpu_cache
    assert total["gpu_cache"] == {"hit": 35, "miss": 15}
    assert METRICS["graphfeed_gpu_feature_cache_rows_total"].labels == ("result",)


def test_the_local_loader_takes_the_trainer_keywords(tiny2):
    from graphfeed.server.loader.local import LocalNeighborLoader

    def first(**kwargs):
        loader = LocalNeighborLoader(tiny2, [5, 3], input_nodes="train", batch_size=128, shuffle=True, seed=9, **kwargs)
        return list(loader), loader.state_dict()

    plain, state = first()
    moved, moved_state = first(device="cpu")   # the one-batch-ahead path, on the host
    assert len(plain) == len(moved) > 2 and state == moved_state
    loader = LocalNeighborLoader(tiny2, [5, 3], input_nodes="train", batch_size=128, device="cpu")
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["cursor"] == 2     # the batch prepared ahead is not counted as received
    it.close()
    for a, b in zip(plain, moved):
        assert_same_batch(a, b)
    if NO_GPU is None:
        on_gpu, _ = first(pin_memory=True, device="cuda")
        assert all(b.x.device.type == "cuda" for b in on_gpu)
        for a, b in zip(plain, on_gpu):
            assert_same_batch(a, b.to("cpu"))
