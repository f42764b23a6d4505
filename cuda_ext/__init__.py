"""Native sampling ops (``torch.ops.graphfeed.*``): probed once, never breaking import.

The op library ``_C`` is compiled by ``pip install`` (see ``build.py``).  ``load_ops()``
returns the op namespace when the library is present and loads, else ``None`` (and
``load_error()`` says why).  The sampler picks an implementation in
``graphfeed.server.sampling.dispatch`` only; nothing else should call these ops directly.

Ops (schemas in ``csrc/*.cpp``): ``one_hop``, ``weighted_one_hop``, ``temporal_one_hop``,
``relabel``, ``sample_subgraph`` (fused multi-hop), ``sample_typed_subgraph`` (fused multi-hop
over a typed graph; CPU only), ``gather_rows``, ``gather_rows_into`` and, in CUDA builds,
``cache_gather`` (see :mod:`.feature_cache`).
"""
from __future__ import annotations

import importlib.machinery
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
_STATE: dict = {}


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


def _load():
    if "ops" in _STATE:
        return
    _STATE["ops"], _STATE["error"] = None, None
    path = library_path()
    if path is None:
        info = build_info()
        _STATE["error"] = (f"the native library failed to build: {info['error']}" if info.get("error")
                           else "the native library was not built with this install "
                                "(install torch first, then `pip install --no-build-isolation -e .`)")
        return
    import torch

    try:
        torch.ops.load_library(str(path))
        ops = torch.ops.graphfeed
        ops.one_hop  # noqa: B018 -- resolve one op now so a broken library fails here
    except (OSError, RuntimeError, AttributeError) as exc:
        _STATE["error"] = f"{path.name} does not load ({exc}); rebuild it with `python cuda_ext/build.py`"
        return
    _STATE["ops"] = ops


def load_ops():
    """The ``torch.ops.graphfeed`` namespace, or ``None`` when the library is unavailable."""
    _load()
    return _STATE["ops"]


def load_error() -> str | None:
    """Why :func:`load_ops` returned ``None`` (``None`` when it did not)."""
    _load()
    return _STATE["error"]


def build_was_expected() -> bool:
    """Whether this install tried to build the library (so its absence deserves a warning)."""
    return bool(build_info().get("attempted")) or library_path() is not None


def has_cuda_kernels() -> bool:
    """Whether the loaded library carries the CUDA kernels."""
    if load_ops() is None:
        return False
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key("graphfeed::one_hop", "CUDA"))
