"""What ``graphfeed partition`` stores for link prediction and int8 transport: per-edge hard negatives
(``hard_neg_dst.npy``, homogeneous and typed input) and the int8 feature scales; ``graphfeed generate
--hard-negatives`` and ``graphfeed quantize``."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphfeed.cli.generate import write_graph
from graphfeed.cli.main import main as cli_main
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, PartitionPaths
from graphfeed.server.partition.format.quantize import LEVELS
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.server.partition.inputs.arrays import InputError
from graphfeed.server.partition.inputs.reader import read_graph
from graphfeed.server.partition.inputs.typed import write_typed_folder

WRITES = ("author", "writes", "paper")


@pytest.fixture(scope="module")
def tiny_hard(tmp_path_factory):
    """The tiny preset written with ``--hard-negatives 3``."""
    out = tmp_path_factory.mktemp("gen") / "tiny"
    write_graph(out, "tiny", 0, hard_negatives=3)
    return out


def test_generate_hard_negatives_are_same_class_non_edges(tiny_hard):
    ei, y, hard = (np.load(tiny_hard / f"{n}.npy") for n in ("edge_index", "y", "hard_neg_dst"))
    assert hard.shape == (ei.shape[1], 3) and hard.dtype == np.int64
    n = y.size
    edges = set((ei[0] * n + ei[1]).tolist())
    rows, cols = np.nonzero(hard >= 0)
    assert rows.size > 0.9 * hard.size
    src, neg = ei[0, rows], hard[rows, cols]
    assert not any(int(s) * n + int(d) in edges for s, d in zip(src, neg)) and not (src == neg).any()
    assert (y[neg] == y[ei[1, rows]]).all(), "hard negatives share the destination's class"


def _stored(root, etype=DEFAULT_EDGE_TYPE) -> dict[tuple[int, int], set[int]]:
    """Every part's stored lists, in original ids: ``(src, dst) -> hard negatives``."""
    meta, parts = open_parts(root)
    orig = {t: torch.cat([p.nodes(t).orig_id for p in parts]) for t in meta.node_types}
    out = {}
    for p in parts:
        stored = p.edges(etype).hard_negatives
        assert stored is not None
        lo, hi = p.nodes(etype[0]).start, p.nodes(etype[0]).stop
        src = stored.keys // stored.num_dst
        assert ((src >= lo) & (src < hi)).all(), "a part stores the lists of the edges whose source it owns"
        dst = stored.keys % stored.num_dst
        for s, d, row in zip(src.tolist(), dst.tolist(), stored.lists.tolist()):
            out[(int(orig[etype[0]][s]), int(orig[etype[2]][d]))] = {int(orig[etype[2]][w]) for w in row if w >= 0}
    return out


def test_partition_stores_each_edges_hard_negatives_with_its_source_part(tiny_hard, tmp_path, capsys):
    assert builder.partition_graph(read_graph(tiny_hard), 2, tmp_path / "p", method="metis") is not None
    assert cli_main(["info", str(tmp_path / "p")]) == 0
    assert "hard negatives  up to 3 per edge (num_hard_negatives)" in capsys.readouterr().out
    ei, hard = np.load(tiny_hard / "edge_index.npy"), np.load(tiny_hard / "hard_neg_dst.npy")
    stored = _stored(tmp_path / "p")
    want = {}
    for (u, v), row in zip(ei.T.tolist(), hard.tolist()):
        if any(w >= 0 for w in row):
            want.setdefault((u, v), {w for w in row if w >= 0})
    assert stored == want


def test_the_bounded_path_names_the_hard_negatives_it_does_not_store(tiny_hard, tmp_path, capsys):
    """``--memory-limit`` partitions through the bounded path, which stores no hard negatives: the run says so in
    one warning naming the file and the fix, and the parts have no lists (a loader asking for them is refused)."""
    code = cli_main(["partition", str(tiny_hard), "-p", "2", "-o", str(tmp_path / "p"), "--method", "random",
                     "--memory-limit", "256MB", "-q"])
    err = capsys.readouterr().err
    assert code == 0, err
    warning = [line for line in err.splitlines() if "not stored by the bounded-memory path" in line]
    assert len(warning) == 1 and "hard_neg_dst.npy" in warning[0] and "without --memory-limit" in warning[0], err
    _, parts = open_parts(tmp_path / "p")
    assert all(p.edges(DEFAULT_EDGE_TYPE).hard_negatives is None for p in parts)


def test_typed_folder_hard_negatives_per_edge_type(tmp_path):
    graph = synth.generate_mag_preset("mag-tiny", seed=0)
    writes = graph.edges[WRITES]
    papers = graph.nodes["paper"].num_nodes
    hard = np.random.default_rng(0).integers(-1, papers, size=(writes.num_edges, 2))
    writes.hard_neg_dst = hard
    (tmp_path / "g").mkdir()
    write_typed_folder(tmp_path / "g", graph)
    read = read_graph(tmp_path / "g")
    assert np.array_equal(read.edges[WRITES].hard_neg_dst, hard)
    assert read.edges[("paper", "cites", "paper")].hard_neg_dst is None
    builder.partition_graph(read, 2, tmp_path / "p", method="random")
    want = {}
    for (u, v), row in zip(writes.edge_index.T.tolist(), hard.tolist()):
        if any(w >= 0 for w in row):
            want.setdefault((u, v), {w for w in row if w >= 0})
    assert _stored(tmp_path / "p", WRITES) == want


@pytest.mark.parametrize("bad, message", [
    (np.zeros((5, 2), dtype=np.int64), r"hard_neg_dst.npy has shape \[5, 2\], edge_index has \d+ edges"),
    (np.zeros((0, 2), dtype=np.float32), r"has shape"),
])
def test_bad_hard_negative_input_is_one_line(tmp_path, bad, message):
    ei, x, y, splits = synth.generate(60, 4, 4, 2, seed=0)
    folder = tmp_path / "g"
    folder.mkdir()
    for name, arr in (("edge_index", ei), ("x", x), ("y", y), ("train_idx", splits["train"]), ("hard_neg_dst", bad)):
        np.save(folder / f"{name}.npy", arr)
    with pytest.raises(InputError, match=message):
        read_graph(folder)
    np.save(folder / "hard_neg_dst.npy", np.full((ei.shape[1], 1), 60))
    with pytest.raises(InputError, match=r"hard_neg_dst.npy\[0, 0\] = 60 is not a destination node id: ids are "
                                         r"0..59, -1 for padding"):
        read_graph(folder)


def test_int8_scales_span_each_column_over_the_whole_graph_and_quantize_restores_them(tmp_path, capsys):
    ei, x, y, splits = synth.generate(500, 4, 6, 2, seed=1)
    x[:, 2] = 3.5                                   # a constant column: scale 1, exact
    builder.partition_graph(builder.GraphInput(ei, x, y, splits), 3, tmp_path / "p", method="random")
    meta, parts = open_parts(tmp_path / "p")
    scales = [p.nodes("_N").quant_scales for p in parts]
    for scale, offset in scales:
        assert torch.equal(scale, scales[0][0]) and torch.equal(offset, scales[0][1]), "one scale for every part"
    scale, offset = scales[0]
    assert torch.allclose(offset, torch.from_numpy(x.min(0)))
    span = torch.from_numpy(x.max(0) - x.min(0))
    assert torch.allclose(scale[span > 0], span[span > 0] / LEVELS) and float(scale[2]) == 1.0
    paths = PartitionPaths(tmp_path / "p")
    for k in range(3):                              # a partition written before the scales existed
        for name in ("scale", "offset"):
            paths.quant_file(k, name).unlink()
    assert open_parts(tmp_path / "p")[1][0].nodes("_N").quant_scales is None
    assert cli_main(["info", str(tmp_path / "p")]) == 0
    assert f"int8 scales     missing: run `graphfeed quantize {tmp_path / 'p'}`" in capsys.readouterr().out
    assert cli_main(["quantize", str(tmp_path / "p")]) == 0
    assert "int8 scales stored for _N (6 columns)" in capsys.readouterr().out
    assert cli_main(["info", str(tmp_path / "p")]) == 0
    assert "int8 scales     stored (feature_dtype='int8')" in capsys.readouterr().out
    again = open_parts(tmp_path / "p")[1][1].nodes("_N").quant_scales
    assert torch.equal(again[0], scale) and torch.equal(again[1], offset)
