"""Int8 feature quantization: the per-column scale and offset of every node type's ``x``.

A loader with ``feature_dtype="int8"`` has the servers send ``x`` as int8 (a quarter of fp32's bytes):
``q = round((v - offset) / scale) - 128``, read back as ``(q + 128) * scale + offset``
(:func:`graphfeed.core.batch.quantize_features`).  ``offset`` is the column's minimum and ``scale`` its
range / 255 over the **whole graph**, so every part quantizes alike and a batch mixing rows of several parts
has one scale per column; the error of a value is at most ``scale / 2``.  ``graphfeed partition`` stores
them in every part (``x_qscale.npy``, ``x_qoffset.npy``, :meth:`PartitionPaths.quant_file`); a partition
written before has none and :func:`add_scales` (``graphfeed quantize PARTITION``) adds them in place.  The
columns with scales are the stored columns marked quantizable (:data:`graphfeed.core.columns.QUANTIZABLE`: ``x``).
"""
from __future__ import annotations

import os

import numpy as np

from graphfeed.core.columns import QUANTIZABLE
from graphfeed.server.partition.format.layout import PartitionMeta, PartitionPaths, read_meta, save_array

CHUNK_BYTES = 1 << 19         # float64 bytes of rows folded at a time: a few of these is the memory it takes
LEVELS = 255                  # int8 steps between a column's minimum and maximum


def _rows_per_chunk(columns: int) -> int:
    return max(1, CHUNK_BYTES // (8 * max(columns, 1)))


def _fold(chunk: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    chunk = np.asarray(chunk, dtype=np.float64).reshape(-1, low.size)
    finite = np.isfinite(chunk)
    low = np.minimum(low, np.where(finite, chunk, np.inf).min(axis=0, initial=np.inf))
    return low, np.maximum(high, np.where(finite, chunk, -np.inf).max(axis=0, initial=-np.inf))


def _start(columns: int, low, high) -> tuple[np.ndarray, np.ndarray]:
    return (np.full(columns, np.inf) if low is None else low), (np.full(columns, -np.inf) if high is None else high)


def column_range(x: np.ndarray, low: np.ndarray | None = None, high: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-column ``(min, max)`` of ``x`` [N, F] (float64), folded into ``low``/``high`` when given, a chunk of
    rows at a time.  Non-finite values are left out (a column of only those gets scale 1, offset 0)."""
    f = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
    low, high = _start(f, low, high)
    step = _rows_per_chunk(f)
    for start in range(0, x.shape[0], step):
        low, high = _fold(x[start:start + step], low, high)
    return low, high


def file_column_range(path, low: np.ndarray | None = None, high: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`column_range` of the ``.npy`` file at ``path`` (C order), read with plain reads, not a memory map,
    so only a chunk of rows takes memory or address space (the bounded-memory partition path calls it)."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(fh)
        f = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        if fortran and len(shape) > 1:
            raise ValueError(f"{path} is in Fortran order: re-run graphfeed partition")
        low, high = _start(f, low, high)
        step = _rows_per_chunk(f)
        for start in range(0, int(shape[0]) if shape else 0, step):
            rows = min(step, int(shape[0]) - start)
            chunk = np.fromfile(fh, dtype=dtype, count=rows * f)
            if chunk.size != rows * f:
                raise ValueError(f"{path} ends early: re-run graphfeed partition")
            low, high = _fold(chunk, low, high)
    return low, high


def scales_of_range(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, offset)`` float32 [F] of columns spanning ``[low, high]``; a constant column gets scale 1
    (its one value is the offset, exact)."""
    low = np.where(np.isfinite(low), low, 0.0)
    high = np.where(np.isfinite(high), high, low)
    span = high - low
    scale = np.where(span > 0, span / LEVELS, 1.0)
    return scale.astype(np.float32), low.astype(np.float32)


def is_quantizable(x: np.ndarray | None) -> bool:
    return x is not None and np.issubdtype(x.dtype, np.floating)


def write_scales(paths: PartitionPaths, ntype: str, num_parts: int, scale: np.ndarray, offset: np.ndarray,
                 column: str = "x") -> None:
    """Store the ``scale`` and ``offset`` of one node type's ``column`` in every part."""
    for k in range(num_parts):
        save_array(paths.quant_file(k, "scale", ntype, column), scale)
        save_array(paths.quant_file(k, "offset", ntype, column), offset)


def add_scales(root: str | os.PathLike, meta: PartitionMeta | None = None) -> dict[str, int]:
    """Compute and store the int8 scales of every node type with floating-point ``x`` of the partition at
    ``root`` (reading every part's ``x``, memory-mapped, in chunks); returns ``{node type: columns}``."""
    paths = PartitionPaths(root)
    meta = read_meta(root) if meta is None else meta
    done: dict[str, int] = {}
    for ntype in meta.node_types:
        for column in QUANTIZABLE:
            spec = meta.features.get(ntype, {}).get(column)
            if spec is None or not np.issubdtype(np.dtype(spec["dtype"]), np.floating):
                continue
            low = high = None
            for k in range(meta.num_parts):
                low, high = file_column_range(paths.node_file(k, column, ntype), low, high)
            assert low is not None and high is not None
            scale, offset = scales_of_range(low, high)
            write_scales(paths, ntype, meta.num_parts, scale, offset, column)
            done[ntype] = done.get(ntype, 0) + int(scale.size)
    return done
