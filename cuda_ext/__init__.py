"""Native sampling ops (``torch.ops.graphfeed.*``): probed once, never breaking import.

``load_ops()`` returns the op namespace when the compiled library is present and loads,
else ``None`` (and ``load_error()`` says why).  The sampler picks an implementation in
``graphfeed.server.sampling.dispatch`` only.
"""
from __future__ import annotations

_STATE: dict = {}


def _load():
    if "ops" in _STATE:
        return
    _STATE["ops"], _STATE["error"] = None, "the native library was not built with this install"


def load_ops():
    _load()
    return _STATE["ops"]


def load_error() -> str:
    _load()
    return _STATE["error"]


def build_was_expected() -> bool:
    """Whether this install tried to build the library (so its absence deserves a warning)."""
    return False
