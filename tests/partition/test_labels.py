"""Labels are stored and served as given: multi-label (2-D ``y``), regression (float ``y``) and
unlabelled graphs (no ``y``); attributes graphfeed does not keep get one warning line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphfeed.cli.main import main
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.format.layout import read_meta

N, E = 120, 600


def _graph(y: torch.Tensor | None, extra: dict | None = None) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {"x": torch.randn(N, 5, generator=g), "edge_index": torch.randint(0, N, (2, E), generator=g),
           "train_mask": torch.arange(N) % 3 == 0, "val_mask": torch.arange(N) % 3 == 1}
    if y is not None:
        out["y"] = y
    out.update(extra or {})
    return out


LABELS = {
    "multi-label int": (torch.randint(0, 2, (N, 4), generator=torch.Generator().manual_seed(1)), 4),
    "multi-label bool": (torch.rand(N, 3, generator=torch.Generator().manual_seed(2)) > 0.5, 3),
    "regression": (torch.randn(N, generator=torch.Generator().manual_seed(3)), 0),
    "regression 2-D": (torch.randn(N, 2, generator=torch.Generator().manual_seed(4)).double(), 0),
    "classes": (torch.arange(N) % 7, 7),
    "unlabelled": (None, 0),
}


def _partition(tmp_path, data: dict, capsys) -> tuple:
    src = tmp_path / "graph.pt"
    torch.save(data, src)
    out = tmp_path / "parts"
    assert main(["partition", str(src), "--num-parts", "2", "--method", "random", "--output", str(out), "-q"]) == 0
    return out, capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(LABELS))
def test_labels_are_stored_and_served_as_given(tmp_path, capsys, case):
    y, classes = LABELS[case]
    data = _graph(y)
    parts, err = _partition(tmp_path, data, capsys)
    assert err == ""                                     # nothing dropped: no warning
    meta = read_meta(parts)
    assert meta.num_classes == classes
    assert ("y" in meta.features[meta.label_type]) == (y is not None)
    loader = LocalNeighborLoader(parts, num_neighbors=[3, 2], batch_size=16, input_nodes="train", shuffle=True)
    seeds = []
    for batch in loader:
        # sampled edges are edges of the input, in local ids
        assert torch.equal(data["edge_index"][:, batch.e_id], batch.n_id[batch.edge_index])
        assert batch.edge_index.size(1) <= batch.batch_size * 3 + batch.num_sampled_nodes[1] * 2
        if y is None:
            assert getattr(batch, "y", None) is None
        else:
            assert batch.y.dtype == y.dtype and batch.y.shape[1:] == y.shape[1:]
            assert torch.equal(batch.y, y[batch.n_id])       # row for row, as stored
        seeds.append(batch.n_id[:batch.batch_size])
    assert sorted(torch.cat(seeds).tolist()) == torch.nonzero(data["train_mask"]).flatten().tolist()


def test_dropped_attributes_get_one_warning_line_naming_them(tmp_path, capsys):
    data = _graph(torch.arange(N) % 3, {"pos": torch.randn(N, 3), "node_year": torch.arange(N)})
    parts, err = _partition(tmp_path, data, capsys)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "node_year, pos" in lines[0], err
    assert (parts / "META.json").is_file()


def test_npy_folder_without_y_and_with_extra_files(tmp_path, capsys):
    folder = tmp_path / "npy"
    folder.mkdir()
    data = _graph(None)
    np.save(folder / "edge_index.npy", data["edge_index"].numpy())
    np.save(folder / "x.npy", data["x"].numpy())
    np.save(folder / "train_idx.npy", torch.nonzero(data["train_mask"]).flatten().numpy())
    np.save(folder / "node_year.npy", np.arange(N))
    out = tmp_path / "parts"
    assert main(["partition", str(folder), "--num-parts", "2", "--output", str(out), "-q"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node_year.npy" in err
    batch = next(iter(LocalNeighborLoader(out, num_neighbors=[2], batch_size=8, input_nodes="train")))
    assert getattr(batch, "y", None) is None and batch.x.shape[1] == 5
