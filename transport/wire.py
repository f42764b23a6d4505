"""The secure data path's codec: values as a JSON header plus raw tensor buffers -- never pickle.

A value is encoded to ``(header, buffers)``: ``header`` is JSON-able (plain lists, strings,
numbers, ``null``, ``true``/``false``, and one-key objects that name a type), ``buffers`` are
the contiguous bytes of its tensors in order.  Decoding builds only what this module knows:

=====================  ===================================================================
Python value           header
=====================  ===================================================================
None, bool, int,       itself (floats include ``NaN`` / ``Infinity``)
float, str
list                   a JSON list
tuple                  ``{"$t": [items]}``
dict                   ``{"$d": [[key, value], ...]}`` (keys encoded the same way)
bytes                  ``{"$b": "<base64>"}``
torch.Tensor           ``{"$T": index, "d": dtype name, "s": shape}`` (bytes in buffer ``index``)
a record               ``{"$R": name, "f": {field: value}}`` -- only classes in :data:`RECORDS`
=====================  ===================================================================

Every JSON object of a header is one of these forms, so no data can masquerade as a type tag.
Tensor dtypes come from :data:`DTYPES` only; a buffer's length must equal ``numel x itemsize``;
records are frozen dataclasses registered by name (:func:`register_record`) and rebuilt with
their own constructor, which validates them.  Anything else is a :class:`WireError`.

Buffers sit in one body, each at a multiple of :data:`ALIGN` bytes, so the receiver reads the
whole body into one preallocated tensor and the decoded tensors are views of it (no copy).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import math
from typing import Any, Iterable

import torch

from graphfeed.core.batch import byte_view

ALIGN = 16

#: dtype names a tensor may have on the wire
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in (
    "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

#: name -> record class that may travel (frozen dataclasses; see :func:`register_record`)
RECORDS: dict[str, type] = {}

MAX_DIMS = 16


class WireError(ValueError):
    """A value that cannot be encoded, or a header that does not decode to an allowed value."""


def register_record(cls: type) -> type:
    """Allow the frozen dataclass ``cls`` to travel by name (usable as a decorator)."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} is not a frozen dataclass: only records travel on the data path")
    have = RECORDS.get(cls.__name__)
    if have is not None and have is not cls:
        raise ValueError(f"two record classes are named {cls.__name__}: {have.__module__} and {cls.__module__}")
    RECORDS[cls.__name__] = cls
    return cls


def _register_core_records() -> None:
    from graphfeed.core import spec

    for name in ("SamplingSpec", "NodeInput", "NegativeSampling", "LinkInput", "LoaderSpec"):
        cls = getattr(spec, name, None)
        if cls is not None:
            register_record(cls)
    from graphfeed.core import embedding

    register_record(embedding.EmbeddingSpec)   # a table's creation (rpc_api.emb_create)
    register_record(embedding.SparseUpdate)    # a step's rule (rpc_api.emb_push)
    from graphfeed.core import compact

    register_record(compact.PackedBatch)        # a batch as it leaves a worker (rpc_api.pull, sample, ...)


_register_core_records()


# ---- encoding ---------------------------------------------------------------------------------------

def encode(value: Any) -> tuple[Any, list[torch.Tensor]]:
    """``(header, buffers)`` of ``value``: ``buffers`` are flat contiguous uint8 CPU tensors."""
    buffers: list[torch.Tensor] = []
    return _enc(value, buffers), buffers


def _enc(v: Any, buffers: list[torch.Tensor]) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, torch.Tensor):
        return _enc_tensor(v, buffers)
    if isinstance(v, list):
        return [_enc(x, buffers) for x in v]
    if isinstance(v, tuple):
        return {"$t": [_enc(x, buffers) for x in v]}
    if isinstance(v, dict):
        return {"$d": [[_enc(k, buffers), _enc(x, buffers)] for k, x in v.items()]}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(v)).decode("ascii")}
    cls = type(v)
    if RECORDS.get(cls.__name__) is cls:
        return {"$R": cls.__name__, "f": {f.name: _enc(getattr(v, f.name), buffers)
                                          for f in dataclasses.fields(v) if f.init}}
    if hasattr(v, "item") and hasattr(v, "dtype"):   # a numpy scalar
        return _enc(v.item(), buffers)
    raise WireError(f"a {cls.__module__}.{cls.__qualname__} cannot travel on the secure data path (allowed: "
                    f"None, bool, int, float, str, bytes, list, tuple, dict, tensors, records "
                    f"{', '.join(sorted(RECORDS))})")


def _enc_tensor(t: torch.Tensor, buffers: list[torch.Tensor]) -> dict:
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise WireError(f"a tensor of dtype {t.dtype} cannot travel (allowed: {', '.join(DTYPES)})")
    if t.device.type != "cpu":
        t = t.cpu()
    shape = [int(s) for s in t.shape]
    buffers.append(byte_view(t))
    return {"$T": len(buffers) - 1, "d": name, "s": shape}


def dumps_header(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=True).encode("utf-8")


def layout(buffers: Iterable[torch.Tensor]) -> tuple[list[int], int]:
    """Offsets of ``buffers`` in the body and the body's length (each buffer aligned to :data:`ALIGN`)."""
    offsets, at = [], 0
    for b in buffers:
        offsets.append(at)
        at += _aligned(int(b.numel()))
    return offsets, at


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# ---- decoding ---------------------------------------------------------------------------------------

def loads_header(data: bytes | memoryview) -> Any:
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"the frame's header is not valid JSON: {exc}") from None


def decode(header: Any, body: torch.Tensor, descriptors: list) -> Any:
    """The value of ``header`` whose tensors are views of ``body`` (uint8) as ``descriptors`` place them:
    ``[[offset, nbytes], ...]`` per buffer index."""
    try:
        return _dec(header, body, descriptors)
    except RecursionError:
        raise WireError("the frame's value is nested too deeply") from None


def _dec(h: Any, body: torch.Tensor, descriptors: list) -> Any:
    if h is None or isinstance(h, (bool, str, int)):
        return h
    if isinstance(h, float):
        return h if not math.isnan(h) else math.nan
    if isinstance(h, list):
        return [_dec(x, body, descriptors) for x in h]
    if not isinstance(h, dict) or len(h) not in (1, 2, 3):
        raise WireError(f"unexpected header element {type(h).__name__}")
    if "$t" in h and len(h) == 1:
        return tuple(_dec(x, body, descriptors) for x in _list(h["$t"]))
    if "$d" in h and len(h) == 1:
        out = {}
        for pair in _list(h["$d"]):
            if not isinstance(pair, list) or len(pair) != 2:
                raise WireError("a dict entry is not a [key, value] pair")
            key = _dec(pair[0], body, descriptors)
            try:
                out[key] = _dec(pair[1], body, descriptors)
            except TypeError:
                raise WireError(f"a dict key of type {type(key).__name__} is not hashable") from None
        return out
    if "$b" in h and len(h) == 1:
        try:
            return base64.b64decode(str(h["$b"]), validate=True)
        except ValueError:
            raise WireError("a bytes value is not base64") from None
    if "$T" in h:
        return _dec_tensor(h, body, descriptors)
    if "$R" in h:
        return _dec_record(h, body, descriptors)
    raise WireError(f"unknown header object with keys {sorted(h)[:4]}")


def _list(v: Any) -> list:
    if not isinstance(v, list):
        raise WireError("expected a list in the frame's header")
    return v


def _dec_tensor(h: dict, body: torch.Tensor, descriptors: list) -> torch.Tensor:
    index, name, shape = h.get("$T"), h.get("d"), h.get("s")
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise WireError(f"tensor dtype {name!r} is not allowed (allowed: {', '.join(DTYPES)})")
    if not isinstance(index, int) or not 0 <= index < len(descriptors):
        raise WireError(f"tensor buffer index {index!r} is out of range")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise WireError(f"tensor shape {shape!r} is not a list of at most {MAX_DIMS} sizes >= 0")
    offset, nbytes = descriptors[index]
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel * itemsize != nbytes:
        raise WireError(f"tensor of shape {shape} and dtype {name} needs {numel * itemsize} bytes, its buffer "
                        f"has {nbytes}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return body[offset:offset + nbytes].view(dtype).view(shape)


def _dec_record(h: dict, body: torch.Tensor, descriptors: list) -> Any:
    name, fields = h.get("$R"), h.get("f")
    cls = RECORDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise WireError(f"record type {name!r} may not travel on the data path (allowed: {', '.join(sorted(RECORDS))})")
    if not isinstance(fields, dict):
        raise WireError(f"record {name} has no field mapping")
    allowed = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = set(fields) - allowed
    if unknown:
        raise WireError(f"record {name} has no field(s) {', '.join(sorted(unknown))}")
    try:
        return cls(**{k: _dec(v, body, descriptors) for k, v in fields.items()})
    except WireError:
        raise
    except (TypeError, ValueError) as exc:
        raise WireError(f"record {name} does not validate: {exc}") from None


# ---- errors -----------------------------------------------------------------------------------------

#: exception types a remote error is rebuilt as (the first of the error's classes found here)
ERRORS: dict[str, type[BaseException]] = {cls.__name__: cls for cls in (
    PermissionError, FileNotFoundError, TimeoutError, ConnectionError, OSError, KeyError, IndexError,
    LookupError, TypeError, ValueError, NotImplementedError, RuntimeError)}


def error_fields(exc: BaseException) -> tuple[str, str]:
    """``(type name, message)`` of ``exc``, the type being the nearest class the receiver rebuilds."""
    for cls in type(exc).__mro__:
        if ERRORS.get(cls.__name__) is cls:
            return cls.__name__, str(exc)
    return "RuntimeError", f"{type(exc).__name__}: {exc}"


def rebuild_error(type_name: Any, message: Any, where: str) -> BaseException:
    cls = ERRORS.get(type_name) if isinstance(type_name, str) else None
    text = f"On {where}: {type_name if cls else 'RuntimeError'}: {message}"
    return (cls or RuntimeError)(text)
