"""Native sampling ops (``torch.ops.graphfeed.*``): probed once, never breaking import.

Where the op library comes from, first found wins:

1. ``_C`` next to this file, compiled by ``pip install --no-build-isolation`` (``build.py``);
2. the per-user cache (:func:`cache_folder`: ``$GRAPHFEED_CACHE_DIR``, else
   ``$XDG_CACHE_HOME/graphfeed``, else ``~/.cache/graphfeed``), keyed by torch version,
   Python ABI, CUDA on/off and a hash of the sources;
3. built into that cache now, on first use, against the installed torch (a plain
   ``pip install .`` builds in an isolated env without torch, so it ships no library).
   One build per key at a time (a file lock, bounded wait); a failed build is recorded
   and not retried until ``graphfeed build-native``.  ``GRAPHFEED_NATIVE_BUILD=0`` turns
   this step off; ``GRAPHFEED_NATIVE=0`` turns the native ops off altogether.

``load_ops()`` returns the op namespace when the library loads, else ``None`` (and
``load_error()`` says why; ``library_origin()`` says where it came from).  The sampler picks an implementation in
``graphfeed.server.sampling.dispatch`` only; nothing else should call these ops directly.

Ops (schemas in ``csrc/*.cpp``): ``one_hop``, ``weighted_one_hop``, ``temporal_one_hop``,
``relabel``, ``sample_subgraph`` (fused multi-hop), ``sample_typed_subgraph`` (fused multi-hop
over a typed graph; CPU only), ``gather_rows``, ``gather_rows_into`` and, in CUDA builds,
``cache_gather`` (see :mod:`.feature_cache`).
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
_STATE: dict = {}
BUILD_FIX = "run `graphfeed build-native` (needs a C++ compiler and the installed torch's headers)"
LOCK_WAIT_SECONDS = float(os.environ.get("GRAPHFEED_NATIVE_LOCK_WAIT", "1800"))  # another process's build
CACHE_INFO = "build.json"


def _to_stderr(message: str) -> None:
    print(f"graphfeed: {message}", file=sys.stderr, flush=True)


# Where the first-use build announces itself (the daemon points it at its structured log).
announce: Callable[[str], None] = _to_stderr


def _env_off(name: str) -> bool:
    return os.environ.get(name, "").strip() == "0"


def library_path() -> Path | None:
    """The compiled library next to this file, if any."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = HERE / f"_C{suffix}"
        if candidate.exists():
            return candidate
    return None


def build_info() -> dict:
    """What the install's build step recorded (``{}`` when it never ran)."""
    try:
        return json.loads((HERE / "_build_info.json").read_text())
    except (OSError, ValueError):
        return {}


def cache_folder() -> Path:
    """This torch's and these sources' folder in the per-user cache (it may not exist yet)."""
    import torch

    base = os.environ.get("GRAPHFEED_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "graphfeed")
    from graphfeed.cuda_ext import build

    digest = hashlib.sha256()
    for path in build.source_files() + [HERE / "build.py"]:
        digest.update(path.relative_to(HERE).as_posix().encode() + b"\0" + path.read_bytes())
    cuda = "cuda" if _cache_wants_cuda() else "cpu"
    key = f"torch-{torch.__version__}-{sys.implementation.cache_tag}-{cuda}-{digest.hexdigest()[:16]}"
    return Path(base) / "native" / key.replace("+", "_")


def _cache_wants_cuda() -> bool:
    from graphfeed.cuda_ext import build

    try:
        return build.want_cuda()
    except ImportError:
        return False


def _read_cache_info(folder: Path) -> dict:
    try:
        return json.loads((folder / CACHE_INFO).read_text())
    except (OSError, ValueError):
        return {}


class _CacheLock:
    """An exclusive ``flock`` on ``FOLDER.lock``, waited for at most :data:`LOCK_WAIT_SECONDS` (then
    ``RuntimeError``); the kernel releases it when its holder exits, so a crashed build blocks no one."""

    def __init__(self, folder: Path):
        self.path = folder.with_name(folder.name + ".lock")
        self.fd: int | None = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise RuntimeError(f"waited {LOCK_WAIT_SECONDS:g} s for another process's native build "
                                       f"(lock {self.path}); set GRAPHFEED_NATIVE_LOCK_WAIT to wait longer") from None
                time.sleep(0.5)

    def __exit__(self, *exc):
        assert self.fd is not None
        os.close(self.fd)   # closing the descriptor releases the lock


def build_into_cache(force: bool = False, verbose: bool = False) -> Path:
    """Build the op library into :func:`cache_folder` (unless a build is there and ``force`` is off).

    Returns the library path.  Raises ``RuntimeError`` naming the cause when it cannot be built
    (no compiler, a compile error, an unwritable cache); the failure is recorded in the cache so
    later processes do not retry it.
    """
    from graphfeed.cuda_ext import build

    folder = cache_folder()
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler ({compiler!r} is not on PATH): install one (e.g. g++), then {BUILD_FIX}")
    try:
        with _CacheLock(folder):
            info = _read_cache_info(folder)
            library = folder / f"{build.JIT_NAME}.so"
            if not force and info.get("built") and library.exists():
                return library
            announce(f"building the native sampling ops into {folder} (once per torch version; "
                     "this takes a few minutes)")
            started = time.monotonic()
            try:
                build.build_cached(folder, _cache_wants_cuda(), verbose=verbose)
            except Exception as exc:  # noqa: BLE001 -- any compiler failure is recorded, reported, and survived
                error = f"{type(exc).__name__}: {exc}"[-2000:]
                _write_cache_info(folder, {"built": False, "error": error})
                raise RuntimeError(f"the native build in {folder} failed ({error})") from None
            _write_cache_info(folder, {"built": True, "seconds": round(time.monotonic() - started, 1)})
            return library
    except OSError as exc:
        raise RuntimeError(f"cannot use the native build cache {folder.parent} ({exc}): set "
                           "GRAPHFEED_CACHE_DIR to a writable folder") from None


def _write_cache_info(folder: Path, info: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CACHE_INFO).write_text(json.dumps(info, indent=1) + "\n")


def _find_library() -> tuple[Path | None, str, str | None]:
    """``(library, origin, error)``: the library to load and where it came from, or why there is none."""
    if _env_off("GRAPHFEED_NATIVE"):
        return None, "off", "GRAPHFEED_NATIVE=0 switches the native ops off"
    path = library_path()
    if path is not None:
        return path, "install", None
    from graphfeed.cuda_ext import build

    folder = cache_folder()
    info = _read_cache_info(folder)
    cached = folder / f"{build.JIT_NAME}.so"
    if info.get("built") and cached.exists():
        return cached, "cache", None
    if info.get("error"):
        return None, "cache", f"the native build in {folder} failed earlier ({info['error'][-300:]}); fix it, then " \
                              + BUILD_FIX
    if _env_off("GRAPHFEED_NATIVE_BUILD"):
        return None, "none", f"this install has no native library and GRAPHFEED_NATIVE_BUILD=0; {BUILD_FIX}"
    try:
        return build_into_cache(), "built", None
    except RuntimeError as exc:
        return None, "none", str(exc)


def _load():
    if "ops" in _STATE:
        return
    _STATE["ops"], _STATE["error"], _STATE["path"] = None, None, None
    path, _STATE["origin"], _STATE["error"] = _find_library()
    if path is None:
        return
    import torch

    try:
        torch.ops.load_library(str(path))
        ops = torch.ops.graphfeed
        ops.one_hop  # noqa: B018 -- resolve one op now so a broken library fails here
    except (OSError, RuntimeError, AttributeError) as exc:
        _STATE["error"] = f"{path} does not load ({exc}); {BUILD_FIX} --force"
        return
    _STATE["ops"], _STATE["path"] = ops, path


def load_ops():
    """The ``torch.ops.graphfeed`` namespace, or ``None`` when the library is unavailable."""
    _load()
    return _STATE["ops"]


def load_error() -> str | None:
    """Why :func:`load_ops` returned ``None`` (``None`` when it did not)."""
    _load()
    return _STATE["error"]


def library_origin() -> tuple[str, Path | None]:
    """Where the loaded library came from (``install``, ``cache``, ``built`` now) and its path;
    when none loaded: ``off``, ``none`` or ``cache`` (a recorded failed build) and ``None``."""
    _load()
    return _STATE["origin"], _STATE["path"]


def build_was_expected() -> bool:
    """Whether the native ops should be there (their absence deserves a warning): always, unless
    ``GRAPHFEED_NATIVE=0`` switched them off."""
    return not _env_off("GRAPHFEED_NATIVE")


def has_cuda_kernels() -> bool:
    """Whether the loaded library carries the CUDA kernels."""
    if load_ops() is None:
        return False
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key("graphfeed::one_hop", "CUDA"))
