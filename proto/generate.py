"""Regenerate the checked-in gRPC stubs from ``control.proto``.

    python -m graphfeed.proto.generate          # rewrite control_pb2*.py
    python -m graphfeed.proto.generate --check  # exit 1 if the checked-in stubs are stale

The .proto is compiled as ``graphfeed/proto/control.proto`` so the stubs import each
other as ``graphfeed.proto.*``.  ``tests/core/test_proto.py`` runs ``--check``.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("control.proto",)
OUTPUTS = ("control_pb2.py", "control_pb2.pyi", "control_pb2_grpc.py")


def generate(dest: Path) -> None:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src" / "graphfeed" / "proto"
        src.mkdir(parents=True)
        for name in PROTOS:
            shutil.copy(HERE / name, src / name)
        out = Path(tmp) / "out"
        out.mkdir()
        args = ["protoc", f"-I{Path(tmp) / 'src'}", f"--python_out={out}", f"--pyi_out={out}",
                f"--grpc_python_out={out}"] + [f"graphfeed/proto/{n}" for n in PROTOS]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        for name in OUTPUTS:
            shutil.copy(out / "graphfeed" / "proto" / name, dest / name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        generate(HERE)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [n for n in OUTPUTS if (Path(tmp) / n).read_bytes() != (HERE / n).read_bytes()]
    if stale:
        print(f"stale generated stubs: {', '.join(stale)}; run `python -m graphfeed.proto.generate`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
