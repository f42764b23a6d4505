"""GPU sampling (``server/sampling/gpu.py``, ``graphfeed bench sample --device cuda``).

On a machine with a GPU and a CUDA build of the op library, a GPU sample equals the CPU one
(same nodes, edges and edge ids for the same batch seed) and the feature reads equal the stored
rows.  Everywhere else, asking for it fails with one line that says why.
"""
from __future__ import annotations

import json

import pytest
import torch

from graphfeed.cli.main import main as cli_main
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.server.sampling.gpu import GpuPart, cuda_unavailable_reason
from graphfeed.server.sampling.graph import sample_topology

needs_gpu = pytest.mark.skipif(cuda_unavailable_reason() is not None,
                               reason=f"GPU sampling unavailable: {cuda_unavailable_reason()}")


@pytest.fixture(scope="module")
def tiny_p1(tmp_path_factory):
    ei, x, y, splits = synth.generate_preset("tiny")
    root = tmp_path_factory.mktemp("gpu") / "tiny_p1"
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 1, root, method="random")
    return root


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="this machine can sample on a GPU")
def test_without_a_gpu_the_bench_says_why(tiny_p1, capsys):
    rc = cli_main(["bench", "sample", "--graph", str(tiny_p1), "--device", "cuda", "--epochs", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert "GPU sampling needs a GPU" in err[0] and cuda_unavailable_reason() in err[0]


@needs_gpu
@pytest.mark.parametrize("replace", [False, True])
def test_gpu_sample_equals_cpu_sample(tiny_p1, replace):
    _, (part,) = open_parts(tiny_p1)
    spec = SamplingSpec((5, 3, -1), replace=replace)
    gpu = GpuPart(part, spec, cache_bytes=64 * part.x[0].numel() * part.x.element_size())   # 64 rows on the GPU
    assert gpu.cached_rows == 64
    seeds = part.split("train")[:300]
    for seed in (0, 7):
        g = gpu.sample(seeds, seed)
        c = sample_topology(part.topology("csc"), 0, seeds, spec, seed)
        for name in ("nodes", "row", "col", "eids"):
            assert torch.equal(getattr(g, name).cpu(), getattr(c, name)), name
        assert g.num_sampled_nodes == c.num_sampled_nodes and g.num_sampled_edges == c.num_sampled_edges
        x, y, orig = gpu.gather(g.nodes)
        assert torch.equal(x.cpu(), part.x.index_select(0, c.nodes))
        assert torch.equal(y.cpu(), part.y.index_select(0, c.nodes))
        assert torch.equal(orig.cpu(), part.orig_id.index_select(0, c.nodes))


@needs_gpu
def test_gpu_bench_prints_device_fields(tiny_p1, capsys):
    rc = cli_main(["bench", "sample", "--graph", str(tiny_p1), "--device", "cuda", "--features", "--epochs", "1",
                   "--num-neighbors", "5,3", "--batch-size", "256", "--gpu-cache-mb", "1"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["device"] == "cuda" and r["gpu_cached_rows"] > 0 and r["seeds_per_s"] > 0
    assert r["seeds_per_epoch"] == len(open_parts(tiny_p1)[1][0].split("train"))
