"""What a PyG script passes to its loaders that graphfeed's loaders take as PyG does (one module, both loaders).

- :class:`BatchTransforms`: ``transform=`` (a callable on each ``Data``/``HeteroData`` batch, e.g. the
  dataset's ``NormalizeFeatures()``) and ``transform_sampler_output=`` (a callable on the batch's
  tensors before they become PyG objects), applied per batch where the batch is delivered -- on the
  trainer for a remote loader -- as PyG's loaders apply theirs.  A dataset's transform changes only the
  trainer's local copy of the data: the servers serve what was partitioned, so the transform must be
  given to the loader to reach the batches.
- :func:`note_worker_options`: ``num_workers``, ``persistent_workers``, ``prefetch_factor`` -- a
  ``torch.utils.data.DataLoader``'s worker processes -- are accepted and logged once: the servers'
  session workers do that work (``prefetch`` is graphfeed's read-ahead).
- :func:`check_not_graph`: a ``Data``/``HeteroData`` passed where PyG takes the graph (its first
  positional argument) is a one-line ``TypeError`` naming the fix: the servers hold the graph.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from graphfeed.core import batch as batch_codec

log = logging.getLogger("graphfeed")
WORKER_OPTIONS = ("num_workers", "persistent_workers", "prefetch_factor")
_noted: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class BatchTransforms:
    """The per-batch callables of a loader (None = none).

    ``sampler_output`` gets the batch as graphfeed's record of tensors (the wire keys of
    :mod:`graphfeed.core.batch`: ``n_id@TYPE``, ``edge_index@EDGE_TYPE``, ``input_id``, ...) and returns such a
    mapping (graphfeed's counterpart of PyG's ``SamplerOutput``);
    ``transform`` gets the PyG object and returns the object the loader yields.
    """

    transform: Callable[[Any], Any] | None = None
    sampler_output: Callable[[dict], Mapping[str, torch.Tensor]] | None = None
    dequantize: bool = True     # int8 features (feature_dtype="int8") become float32 again (batch.to_pyg)

    def __post_init__(self) -> None:
        for name, fn in (("transform", self.transform), ("transform_sampler_output", self.sampler_output)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable applied to each batch (as PyG's loaders take it), "
                                f"got {type(fn).__name__}")

    def to_pyg(self, wire: Mapping[str, torch.Tensor]):
        """``wire`` (one batch's tensors) as the object the loader yields."""
        if self.sampler_output is not None:
            wire = self.sampler_output(dict(wire))
            if not isinstance(wire, Mapping):
                raise TypeError(f"transform_sampler_output must return the batch's mapping of tensors, got "
                                f"{type(wire).__name__}")
        data = batch_codec.to_pyg(wire, dequantize=self.dequantize)
        return data if self.transform is None else self.transform(data)


def note_worker_options(kind: str, **options) -> None:
    """Log (once per loader kind and option set) the DataLoader worker options that were passed."""
    given = {k: v for k, v in options.items() if v is not None}
    unknown = set(given) - set(WORKER_OPTIONS)
    if unknown:
        raise TypeError(f"unexpected loader option(s) {', '.join(sorted(unknown))}")
    if not given:
        return
    key = (kind, ",".join(f"{k}={v}" for k, v in sorted(given.items())))
    if key in _noted:
        return
    _noted.add(key)
    log.info("graphfeed loader %s: %s accepted and not used: the servers' session workers sample and "
             "gather (use prefetch= for read-ahead)", kind or "nodes", key[1])


def check_not_graph(value, argument: str, fix: str) -> None:
    """TypeError when ``value`` is a PyG graph object (``Data``/``HeteroData``/``FeatureStore`` tuple)."""
    graph = hasattr(value, "edge_index") or hasattr(value, "edge_types") or type(value).__name__ in (
        "Data", "HeteroData")
    if isinstance(value, tuple) and len(value) == 2 and hasattr(value[0], "get_tensor"):
        graph = True
    if graph:
        raise TypeError(f"{argument} got a {type(value).__name__}: a graphfeed loader takes no graph (the servers "
                        f"hold it); {fix}")


def take_loader_extras(own: dict, kind: str) -> BatchTransforms:
    """Pop a loader's PyG-only keywords from ``own`` (its options that are not sent to the servers): the
    per-batch transforms (returned) and the DataLoader worker options (logged once, then dropped)."""
    transforms = BatchTransforms(own.pop("transform", None), own.pop("transform_sampler_output", None),
                                 bool(own.pop("dequantize", True)))
    note_worker_options(kind, **{k: own.pop(k, None) for k in WORKER_OPTIONS})
    return transforms
