"""bench/dgl_embedding_compare.py without DGL: its arguments and the command lines it gives its processes (the
run itself needs the DGL 2.1 venv of bench/distdgl_compare.py; CI has none)."""
from __future__ import annotations

import numpy as np
import pytest

from graphfeed.bench import dgl_embedding_compare as de


@pytest.fixture()
def typed_dir(tmp_path):
    """A typed graph folder as `graphfeed generate` writes it: a featureless type and a type with x."""
    (tmp_path / "author").mkdir()
    np.save(tmp_path / "author" / "num_nodes.npy", np.array(5))
    (tmp_path / "paper").mkdir()
    np.save(tmp_path / "paper" / "x.npy", np.zeros((4, 2), dtype=np.float32))
    (tmp_path / "author__writes__paper").mkdir()
    np.save(tmp_path / "author__writes__paper" / "edge_index.npy", np.array([[0, 4], [1, 3]]))
    return tmp_path


def test_defaults_match_the_graphfeed_push_figure(typed_dir):
    args = de.parse_args(["--graph", str(typed_dir)])
    assert (args.ntype, args.dim, args.rows, args.steps, args.parts, args.role) == ("author", 128, 50_000, 5, 1,
                                                                                     "main")
    assert de.partition_dir(de.parse_args(["--graph", str(typed_dir), "--workdir", "/w"])) == "/w/metis-1"


def test_every_role_gets_the_same_settings(typed_dir):
    args = de.parse_args(["--graph", str(typed_dir), "--dim", "16", "--rows", "100", "--steps", "2"])
    cmd = de._role_cmd(args, "trainer", "--result", "/r.json")
    again = de.parse_args(cmd[2:])
    assert (again.role, again.dim, again.rows, again.steps, again.graph, again.result) == \
        ("trainer", 16, 100, 2, str(typed_dir), "/r.json")


@pytest.mark.parametrize("argv, message", [
    (["--graph", "/nonexistent"], "has no node type folder 'author'"),
    (["--dim", "0"], ">= 1"),
])
def test_bad_arguments_name_the_fix(typed_dir, capsys, argv, message):
    if argv[0] != "--graph":
        argv = ["--graph", str(typed_dir), *argv]
    with pytest.raises(SystemExit):
        de.parse_args(argv)
    assert message in capsys.readouterr().err
