"""Build of the native op library ``graphfeed.cuda_ext._C`` (sources, flags, setuptools hooks).

``setup.py`` calls :func:`setup_kwargs` so that ``pip install`` compiles the CPU ops
(and the CUDA ops when a CUDA torch and toolkit are present).  The extension is
optional: when torch is missing at build time, the compiler is missing, or the
compile fails, the install still succeeds, ``_build_info.json`` records why, and at
run time the sampler falls back to the pure-torch reference with one warning.

Environment switches (read at build time):
  GRAPHFEED_NATIVE=0     skip the native build entirely (no warning at run time; also read at run
                         time, where it switches off the build on first use)
  GRAPHFEED_CUDA=0|1     force the CUDA kernels off / on (default: on when torch.version.cuda
                         is set and a CUDA toolkit is found)
  MAX_JOBS=N             parallel compile jobs (torch's ninja build)

For development, rebuild in place with ``python cuda_ext/build.py`` (from the repo root).

An install without the library (a plain ``pip install .`` builds in an isolated env that
has no torch) gets it on first use instead: :func:`build_cached` compiles the same sources
with the same flags against the installed torch into a per-user cache (see
``graphfeed.cuda_ext.cache_folder``); ``graphfeed build-native`` runs that step on demand.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXT_NAME = "graphfeed.cuda_ext._C"
INFO_FILE = "_build_info.json"


def _rel(paths, root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in sorted(paths)]


def cpu_sources(root: Path) -> list[str]:
    csrc = HERE / "csrc"
    return _rel(list(csrc.glob("*.cpp")) + list((csrc / "cpu").glob("*.cpp")), root)


def cuda_sources(root: Path) -> list[str]:
    return _rel((HERE / "csrc" / "cuda").glob("*.cu"), root)


def source_files() -> list[Path]:
    """Every file the library is built from (sources and headers), sorted: what the cache key hashes."""
    csrc = HERE / "csrc"
    return sorted(p for p in csrc.rglob("*") if p.is_file() and p.suffix in (".cpp", ".cu", ".h", ".cuh"))


def cxx_flags(cuda: bool) -> list[str]:
    """Compiler flags of the C++ sources (the install build and the cached build use the same)."""
    return ["-O3", "-g0", "-fopenmp", "-DGRAPHFEED_WITH_CUDA=%d" % cuda]


NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr", "-DGRAPHFEED_WITH_CUDA=1"]
LINK_FLAGS = ["-fopenmp", "-g0"]


def want_cuda() -> bool:
    flag = os.environ.get("GRAPHFEED_CUDA", "").strip()
    if flag in ("0", "1"):
        return flag == "1"
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.version.cuda is not None and CUDA_HOME is not None


def _write_info(folder: Path, info: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")


def setup_kwargs(root: Path) -> dict:
    """``ext_modules`` and ``cmdclass`` for setup(), or ``{}`` when the build is switched off."""
    if os.environ.get("GRAPHFEED_NATIVE", "").strip() == "0":
        return {}
    try:
        import torch
        from torch.utils import cpp_extension as cx
    except ImportError:
        print("graphfeed: torch is not importable at build time; skipping the native ops "
              "(install torch first and use `pip install --no-build-isolation`)", file=sys.stderr)
        return {}
    cuda = want_cuda()
    cxx = cxx_flags(cuda)
    kwargs = dict(name=EXT_NAME, extra_link_args=LINK_FLAGS, optional=True)
    if cuda:
        ext = cx.CUDAExtension(sources=cpu_sources(root) + cuda_sources(root),
                               extra_compile_args={"cxx": cxx, "nvcc": NVCC_FLAGS}, **kwargs)
    else:
        ext = cx.CppExtension(sources=cpu_sources(root), extra_compile_args={"cxx": cxx}, **kwargs)

    class OptionalBuildExtension(cx.BuildExtension):
        """Builds the op library; any failure (compiler missing or broken, compile error) is
        recorded in ``_build_info.json`` and reported, never fatal to the install."""

        def run(self):
            inplace = bool(self.inplace or getattr(self, "editable_mode", False))
            info = {"attempted": True, "built": False, "cuda": cuda, "torch": torch.__version__, "error": None}
            try:
                super().run()
                info["built"] = all(Path(self.get_ext_fullpath(e.name)).exists() for e in self.extensions)
                if not info["built"]:
                    info["error"] = "the compiler produced no library (see the build log)"
            except Exception as exc:  # noqa: BLE001 -- any build failure must leave a usable install
                info["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            if info["error"]:
                print(f"graphfeed: WARNING: the native ops were not built ({info['error']}); "
                      "the pure-torch reference sampler will be used", file=sys.stderr)
            self._record(info, inplace)

        def _record(self, info: dict, inplace: bool) -> None:
            build_py = self.get_finalized_command("build_py")
            for ext in self.extensions:
                built = Path(self.get_ext_fullpath(ext.name))
                if not info["built"]:
                    built.unlink(missing_ok=True)
                _write_info(built.parent, info)
                if inplace:  # --inplace / editable installs load from the source folder
                    source = Path(self._get_inplace_equivalent(build_py, ext)[0])
                    if not info["built"]:
                        source.unlink(missing_ok=True)   # never load a stale library
                    _write_info(source.parent, info)

    return {"ext_modules": [ext], "cmdclass": {"build_ext": OptionalBuildExtension.with_options(use_ninja=True)}}


JIT_NAME = "graphfeed_native"


def build_cached(folder: Path, cuda: bool, verbose: bool = False) -> Path:
    """Compile the op library into ``folder`` against the installed torch; returns the library's path.

    The caller holds the cache lock.  Raises ``RuntimeError`` (with the compiler's message) or
    ``OSError`` when the build fails.
    """
    from torch.utils import cpp_extension as cx

    folder.mkdir(parents=True, exist_ok=True)
    root = HERE.parent
    sources = [str(root / p) for p in cpu_sources(root) + (cuda_sources(root) if cuda else [])]
    cx.load(name=JIT_NAME, sources=sources, extra_cflags=cxx_flags(cuda), extra_ldflags=LINK_FLAGS,
            extra_cuda_cflags=NVCC_FLAGS if cuda else None, build_directory=str(folder), verbose=verbose,
            with_cuda=cuda, is_python_module=False)
    library = folder / f"{JIT_NAME}.so"
    if not library.exists():
        raise RuntimeError(f"the build finished but left no {library}")
    return library


def main() -> int:
    """Rebuild the library in place (development): ``python cuda_ext/build.py``."""
    import subprocess

    root = HERE.parent
    return subprocess.call([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=root)


if __name__ == "__main__":
    sys.exit(main())
