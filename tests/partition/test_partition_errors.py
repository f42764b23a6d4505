"""Bad input reaches the user as one line naming the file/argument and the fix (exit code 2).

Also: partitioning is atomic (a crash never leaves a folder that loads) and a folder of
another format version is refused by name.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from graphfeed.cli.main import main
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.build.builder import partition_graph
from graphfeed.server.partition.format.layout import PartitionFormatError, read_meta
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs.reader import read_graph

N, E = 50, 200


def _write_graph(folder, **override):
    """A valid 50-node graph in the .npy layout; ``override`` replaces (or with None removes) an array."""
    rng = np.random.default_rng(0)
    arrays = {
        "edge_index": rng.integers(0, N, (2, E)).astype(np.int64),
        "x": rng.standard_normal((N, 4)).astype(np.float32),
        "y": rng.integers(0, 3, N).astype(np.int64),
        "train_idx": np.arange(0, 20, dtype=np.int64),
        "val_idx": np.arange(20, 30, dtype=np.int64),
        "test_idx": np.arange(30, 50, dtype=np.int64),
    }
    arrays.update(override)
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        if value is not None:
            np.save(folder / f"{name}.npy", value)
    return folder


def _partition_error(capsys, *args) -> str:
    """Run `graphfeed partition ...` in-process; assert exit code 2 and one error line; return it."""
    code = main(["partition", *map(str, args), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("graphfeed partition: error: ") and "\n" not in err and "Traceback" not in err
    return err


BAD_INPUTS = {
    "missing x and y": (dict(x=None, y=None), ["node count is unknown", "x.npy [N, F]", "num_nodes.npy"]),
    "num_nodes disagrees": (dict(x=None, num_nodes=np.int64(N + 1)), ["num_nodes.npy gives 51 nodes", "y.npy"]),
    "missing edges": (dict(edge_index=None), ["edge_index.npy is missing"]),
    "edges [E, 2]": (dict(edge_index=np.zeros((E, 2), dtype=np.int64)), ["shape [2, E]", "transpose"]),
    "edges float": (dict(edge_index=np.zeros((2, E), dtype=np.float32)), ["edge_index.npy", "integer", "int64"]),
    "edge id too large": (dict(edge_index=np.array([[0, 1], [2, N]])), ["edge_index.npy", f"0..{N}", f"0..{N - 1}"]),
    "negative edge id": (dict(edge_index=np.array([[0, -1], [2, 3]])), ["edge_index.npy", "-1..3"]),
    "x one-dimensional": (dict(x=np.zeros(N, dtype=np.float32)), ["x.npy", "[N, F]"]),
    "x strings": (dict(x=np.array([["a"]] * N)), ["x.npy", "numeric"]),
    "y too short": (dict(y=np.zeros(N - 1, dtype=np.int64)), ["y.npy has 49 entries but x has 50 rows"]),
    "y strings": (dict(y=np.array(["a"] * N)), ["y.npy", "must be numeric", "int64 or float32"]),
    "train idx out of range": (dict(train_idx=np.array([0, N + 5])), ["train_idx.npy", f"0..{N + 5}", "outside"]),
    "test idx negative": (dict(test_idx=np.array([-2, 3])), ["test_idx.npy", "outside"]),
    "val idx as mask": (dict(val_idx=np.ones(N, dtype=bool)), ["val_idx.npy", "bool mask", "flatnonzero"]),
    "duplicate train ids": (dict(train_idx=np.array([1, 2, 2])), ["train_idx.npy", "more than once"]),
    "empty train": (dict(train_idx=np.array([], dtype=np.int64)), ["train_idx.npy is empty"]),
    "edge_attr rows": (dict(edge_attr=np.zeros((E - 1, 2), dtype=np.float32)),
                       ["edge_attr.npy has 199 rows", "200 edges"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_npy_input(tmp_path, capsys, case):
    override, expected = BAD_INPUTS[case]
    folder = _write_graph(tmp_path / "in", **override)
    err = _partition_error(capsys, folder, "--num-parts", 2, "--output", tmp_path / "out")
    for text in expected:
        assert text in err, (text, err)
    assert not (tmp_path / "out").exists()


def test_malformed_npy_file(tmp_path, capsys):
    folder = _write_graph(tmp_path / "in")
    (folder / "y.npy").write_bytes(b"definitely not numpy")
    err = _partition_error(capsys, folder, "--num-parts", 2, "--output", tmp_path / "out")
    assert "y.npy is not a readable .npy array" in err and "numpy.save" in err


def test_missing_input(tmp_path, capsys):
    err = _partition_error(capsys, tmp_path / "nowhere", "--num-parts", 2, "--output", tmp_path / "out")
    assert "nowhere does not exist" in err and ".npy layout" in err


@pytest.mark.parametrize("parts,expected", [(0, "at least 1, got 0"), (-3, "at least 1, got -3"),
                                            (N + 1, f"larger than the number of nodes ({N})")])
def test_num_parts_out_of_range(tmp_path, capsys, parts, expected):
    folder = _write_graph(tmp_path / "in")
    err = _partition_error(capsys, folder, "--num-parts", parts, "--output", tmp_path / "out")
    assert "--num-parts" in err and expected in err


def test_output_with_different_partitioning_is_refused(tmp_path, capsys):
    folder = _write_graph(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["partition", str(folder), "-p", "2", "--method", "random", "-o", str(out), "-q"]) == 0
    capsys.readouterr()
    err = _partition_error(capsys, folder, "-p", 2, "--method", "random", "-o", out, "--seed", 1)
    assert "already holds a different partitioning" in err and "seed 0 -> 1" in err and "--overwrite" in err
    # a changed input (same parameters) is a different partitioning too
    _write_graph(folder, x=np.ones((N, 4), dtype=np.float32))
    err = _partition_error(capsys, folder, "-p", 2, "--method", "random", "-o", out)
    assert "input fingerprint" in err
    assert read_meta(out).seed == 0, "the refused run must leave the old partition alone"


def test_non_partition_folder_is_refused_even_with_overwrite(tmp_path, capsys):
    folder = _write_graph(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        err = _partition_error(capsys, folder, "-p", 2, "-o", out, *extra)
        assert "not empty and is not a graphfeed partition folder" in err
    assert (out / "precious.txt").read_text() == "keep me"


def test_empty_output_folder_is_used(tmp_path, capsys):
    folder = _write_graph(tmp_path / "in")
    (tmp_path / "out").mkdir()
    assert main(["partition", str(folder), "-p", "2", "-o", str(tmp_path / "out"), "-q"]) == 0
    assert read_meta(tmp_path / "out").num_parts == 2


def _set_format_version(root, version):
    meta = json.loads((root / "META.json").read_text())
    meta["format_version"] = version
    (root / "META.json").write_text(json.dumps(meta))


def test_other_format_version_is_refused(tmp_path, capsys):
    folder = _write_graph(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["partition", str(folder), "-p", "2", "-o", str(out), "-q"]) == 0
    _set_format_version(out, 99)
    with pytest.raises(PartitionFormatError, match="format_version 99 is not supported"):
        open_parts(out)
    capsys.readouterr()
    assert main(["info", str(out)]) == 2
    assert "format_version 99" in capsys.readouterr().err
    err = _partition_error(capsys, folder, "-p", 2, "-o", out)
    assert "format_version 99" in err and "--overwrite" in err
    assert main(["partition", str(folder), "-p", "2", "-o", str(out), "-q", "--overwrite"]) == 0
    assert read_meta(out).format_version == 1


def test_info_on_non_partition_folder(tmp_path, capsys):
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "META.json not found" in err and "graphfeed partition --output" in err


# ---------------------------------------------------------------------------------- torch inputs

def test_torch_input_errors(tmp_path, capsys):
    from torch_geometric.data import Data, HeteroData

    out = tmp_path / "out"
    ei = torch.randint(0, N, (2, E))
    cases = {
        "no_x.pt": (Data(edge_index=ei, train_mask=torch.ones(N, dtype=torch.bool)), "node count is unknown"),
        "no_train.pt": (Data(x=torch.zeros(N, 2), edge_index=ei, y=torch.zeros(N, dtype=torch.long)),
                        "train_mask is missing"),
        "bad_mask.pt": (Data(x=torch.zeros(N, 2), edge_index=ei, y=torch.zeros(N, dtype=torch.long),
                             train_mask=torch.ones(N - 1, dtype=torch.bool)), "train_mask must be a bool tensor"),
        "hetero.pt": (HeteroData(), "holds a HeteroData without node types"),
    }
    for name, (obj, expected) in cases.items():
        torch.save(obj, tmp_path / name)
        err = _partition_error(capsys, tmp_path / name, "-p", 2, "-o", out)
        assert name in err and expected in err, err
    (tmp_path / "junk.pt").write_bytes(b"\x00junk")
    assert "not a file written by torch.save" in _partition_error(capsys, tmp_path / "junk.pt", "-p", 2, "-o", out)


# ---------------------------------------------------------------------------------- atomicity

def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    graph = read_graph(_write_graph(tmp_path / "in"))
    calls = []

    def failing_save(path, array):
        calls.append(path)
        if len(calls) == 5:
            raise OSError("disk full (simulated)")
        return save(path, array)

    save = builder.save_array
    monkeypatch.setattr(builder, "save_array", failing_save)
    with pytest.raises(OSError, match="simulated"):
        partition_graph(graph, 2, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"], "the temporary folder is removed"


def test_crash_mid_write_never_leaves_a_loadable_folder(tmp_path):
    """A killed process (no cleanup runs) leaves only a temporary folder without META.json."""
    folder = _write_graph(tmp_path / "in")
    script = textwrap.dedent(f"""
        import os
        from graphfeed.server.partition.build import builder
        from graphfeed.server.partition.inputs.reader import read_graph
        real, calls = builder.save_array, []
        def dying_save(path, array):
            calls.append(path)
            if len(calls) == 6:
                os._exit(9)  # like SIGKILL: no finally, no rmtree
            real(path, array)
        builder.save_array = dying_save
        builder.partition_graph(read_graph({str(folder)!r}), 2, {str(tmp_path / 'out')!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert not (tmp_path / "out").exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name != "in"]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".out.tmp-")
    assert any(leftovers[0].rglob("*.npy")), "the crash happened mid-write"
    with pytest.raises(PartitionFormatError, match="not a graphfeed partition folder"):
        read_meta(leftovers[0])
    # the next run into the same output removes the dead run's leftovers
    partition_graph(read_graph(folder), 2, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


# ---------------------------------------------------------------------------------- non-numeric columns, scratch

def _chunked_folder(folder, x):
    """A small chunked graph (two edge chunks) whose ``x`` chunk is ``x``."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    edge_index = rng.integers(0, N, (2, E)).astype(np.int64)
    np.save(folder / "edge_index_00000.npy", edge_index[:, :E // 2])
    np.save(folder / "edge_index_00001.npy", edge_index[:, E // 2:])
    np.save(folder / "x_00000.npy", x, allow_pickle=True)
    np.save(folder / "train_idx.npy", np.arange(10))
    return folder


def _parquet_strings(folder):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder.mkdir()
    edge_index = np.random.default_rng(0).integers(0, N, (2, E))
    pq.write_table(pa.table({"src": edge_index[0], "dst": edge_index[1]}), folder / "edges-0.parquet")
    pq.write_table(pa.table({"x": [f"{i}.0" for i in range(N)], "y": np.zeros(N, np.int64)}),
                   folder / "nodes-0.parquet")
    np.save(folder / "train_idx.npy", np.arange(10))
    return folder


def _npy_objects(folder):
    _write_graph(folder, x=None)
    np.save(folder / "x.npy", np.array([[object()]] * N), allow_pickle=True)


NON_NUMERIC = {
    "parquet x of strings": (_parquet_strings, ["nodes-0.parquet: column x holds", "not numbers", "float32"]),
    "npy x of objects": (_npy_objects, ["x.npy holds Python objects", "astype('float32')"]),
    "x chunk of strings": (lambda f: _chunked_folder(f, np.array([["a"]] * N)),
                           ["x_00000.npy of x holds strings", "astype('float32')"]),
    "x chunk of objects": (lambda f: _chunked_folder(f, np.array([[object()]] * N)),
                           ["x_00000.npy holds Python objects", "astype('float32')"]),
}


@pytest.mark.parametrize("case", sorted(NON_NUMERIC))
def test_non_numeric_column_fails_before_any_work(tmp_path, capsys, case):
    write, expected = NON_NUMERIC[case]
    write(tmp_path / "in")
    err = _partition_error(capsys, tmp_path / "in", "-p", 2, "-o", tmp_path / "out")
    for text in expected:
        assert text in err, (text, err)
    assert "re-run" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"], "no output and no scratch folder"


def _bounded_error(capsys, folder, out) -> str:
    return _partition_error(capsys, folder, "-p", 2, "-o", out, "--method", "random", "--memory-limit", "200MB")


def test_input_error_found_mid_run_says_to_fix_the_input_and_names_the_scratch(tmp_path, capsys):
    edge_index = np.random.default_rng(0).integers(0, N, (2, E))
    edge_index[1, E - 3] = N + 5                                     # in the second chunk
    folder = _chunked_folder(tmp_path / "in", np.zeros((N, 2), np.float32))
    np.save(folder / "edge_index_00001.npy", edge_index[:, E // 2:])
    err = _bounded_error(capsys, folder, tmp_path / "out")
    scratch = tmp_path / ".out.work"
    assert "edge_index_00001.npy" in err and str(N + 5) in err
    assert "fails the same way until the input is fixed" in err and "re-run the same command to continue" not in err
    assert f"rm -r {scratch}" in err and scratch.is_dir()


def test_resumable_failure_says_re_run_names_the_scratch_and_the_re_run_finishes(tmp_path, capsys, monkeypatch):
    from graphfeed.server.partition.build import bounded

    folder = _chunked_folder(tmp_path / "in", np.zeros((N, 2), np.float32))
    real = bounded.write_rows

    def full_disk(path, row, array):
        if "orig_id" in str(path):
            raise OSError(28, "No space left on device (simulated)")
        real(path, row, array)

    monkeypatch.setattr(bounded, "write_rows", full_disk)
    err = _bounded_error(capsys, folder, tmp_path / "out")
    scratch = tmp_path / ".out.work"
    assert "No space left on device" in err
    assert f"finished chunks are kept in {scratch}: re-run the same command to continue" in err
    assert f"rm -r {scratch}" in err and scratch.is_dir()
    monkeypatch.setattr(bounded, "write_rows", real)
    assert main(["partition", str(folder), "-p", "2", "-o", str(tmp_path / "out"), "--method", "random",
                 "--memory-limit", "200MB", "-q"]) == 0
    assert read_meta(tmp_path / "out").num_parts == 2 and not scratch.exists()


def test_a_run_stopped_by_an_unexpected_error_names_its_scratch(tmp_path, capsys, monkeypatch):
    from graphfeed.server.partition.build import bounded

    folder = _chunked_folder(tmp_path / "in", np.zeros((N, 2), np.float32))
    monkeypatch.setattr(bounded, "write_rows", lambda *a: (_ for _ in ()).throw(RuntimeError("a bug (simulated)")))
    with pytest.raises(RuntimeError, match="simulated"):
        main(["partition", str(folder), "-p", "2", "-o", str(tmp_path / "out"), "--method", "random",
              "--memory-limit", "200MB", "-q"])
    scratch = tmp_path / ".out.work"
    assert f"the run stopped (finished chunks are kept in {scratch}" in capsys.readouterr().err
