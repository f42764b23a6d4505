"""A field of a chunked input graph (``x``, ``edge_index``, ...) split over ``.npy`` or Parquet files, read by
row range: a row range is read with plain reads (never a memory map), so only the rows asked for take memory.

:func:`npy_chunks` and :func:`parquet_fields` describe the files (checking every header once, when the graph
is opened: :func:`graphfeed.server.partition.inputs.chunked.open_chunked`); :class:`ArrayChunks` reads them
back.  Descriptions are picklable (paths and shapes): Dask workers open the files themselves.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphfeed.core.columns import INPUT_COLUMNS
from graphfeed.server.partition.inputs.arrays import InputError, check_numeric_dtype, unreadable_npy

HASH_ROWS_BYTES = 1 << 26   # bytes of rows read at a time by the passes over a whole field (hash, classes)


@dataclass(frozen=True)
class ChunkFile:
    """One file holding rows ``[start, start + rows)`` of a field (for ``edge_index``: edges)."""

    path: str
    rows: int
    column: str = ""          # parquet: the column(s) read ("src,dst", "x", "x0..x99", "y")


@dataclass(frozen=True)
class ArrayChunks:
    """A field (``x``, ``edge_index``, ...) split over files, read by row range.

    ``row_shape`` excludes the row dimension; ``edge_index`` is stored ``[2, E]`` per ``.npy`` chunk
    and read back as ``[2, stop - start]``.
    """

    name: str
    files: tuple[ChunkFile, ...]
    dtype: str
    row_shape: tuple[int, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def check_numeric(self) -> None:
        """InputError naming the first file (and Parquet column) unless the field holds numbers: checked when the
        graph is opened, so a string column fails before any work (and before a scratch folder exists)."""
        first = self.files[0] if self.files else None
        if first is None:
            return
        if first.column:
            w = f"chunk {first.path}: column {first.column}"
            fix = (f"convert column {first.column} to numbers in every file (features float32: a list<float32> "
                   f"column or one x0, x1, ... column per feature; ids and labels int64) and re-export")
        else:
            w = f"chunk {first.path} of {self.name}"
            fix = f"save every {self.name} chunk as numbers, e.g. numpy.save(path, chunk.astype('float32'))"
        check_numeric_dtype(self.dtype, w, fix)

    @property
    def is_edge_index(self) -> bool:
        return self.name == "edge_index"

    @property
    def row_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.row_shape, dtype=np.int64)))

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` (edge_index: ``[2, stop - start]``), joined across files."""
        pieces, offset = [], 0
        for f in self.files:
            lo, hi = max(start, offset), min(stop, offset + f.rows)
            if lo < hi:
                pieces.append(_read_file(f, self, lo - offset, hi - offset))
            offset += f.rows
            if offset >= stop:
                break
        if not pieces:
            shape = (2, 0) if self.is_edge_index else (0, *self.row_shape)
            return np.empty(shape, dtype=self.dtype)
        return np.concatenate(pieces, axis=1 if self.is_edge_index else 0) if len(pieces) > 1 else pieces[0]

    def which(self, row: int) -> str:
        """The file holding ``row`` (for error messages)."""
        offset = 0
        for f in self.files:
            if row < offset + f.rows:
                return f.path
            offset += f.rows
        return self.files[-1].path if self.files else self.name


def _read_file(f: ChunkFile, chunks: ArrayChunks, lo: int, hi: int) -> np.ndarray:
    try:
        if f.path.endswith(".parquet"):
            return _read_parquet_rows(f, chunks, lo, hi)
        return _read_npy_rows(f.path, lo, hi, chunks.is_edge_index).astype(chunks.dtype, copy=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"chunk {f.path} of {chunks.name} cannot be read ({exc}); re-export it") from exc


def _read_npy_rows(path: str, lo: int, hi: int, edge_index: bool) -> np.ndarray:
    """Rows ``[lo, hi)`` of a C-order ``.npy`` file (``edge_index``: columns of both rows) read with plain
    reads, not a memory map: only the rows asked for take memory or address space."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(fh)
        if fortran and len(shape) > 1:
            raise ValueError("Fortran-order arrays are not read in chunks; "
                             "re-save it with numpy.save(path, numpy.ascontiguousarray(a))")
        start = fh.tell()
        if edge_index:
            n = shape[1]
            rows = []
            for r in (0, 1):
                fh.seek(start + (r * n + lo) * dtype.itemsize)
                rows.append(np.fromfile(fh, dtype=dtype, count=hi - lo))
            out = np.stack(rows)
        else:
            row_items = int(np.prod(shape[1:], dtype=np.int64))
            fh.seek(start + lo * row_items * dtype.itemsize)
            out = np.fromfile(fh, dtype=dtype, count=(hi - lo) * row_items).reshape(hi - lo, *shape[1:])
    expected = (2, hi - lo) if edge_index else (hi - lo, *shape[1:])
    if out.shape != expected:
        raise ValueError(f"the file ends early (read {list(out.shape)} of rows {lo}..{hi})")
    return out


def _read_parquet_rows(f: ChunkFile, chunks: ArrayChunks, lo: int, hi: int) -> np.ndarray:
    import pyarrow.parquet as pq

    columns = _parquet_columns(f.column)
    pf = pq.ParquetFile(f.path)
    groups: list[int] = []     # only the row groups that hold rows [lo, hi)
    first = start = 0
    for g in range(pf.metadata.num_row_groups):
        rows = pf.metadata.row_group(g).num_rows
        if start < hi and start + rows > lo:
            if not groups:
                first = start
            groups.append(g)
        start += rows
    table = pf.read_row_groups(groups, columns=columns).slice(lo - first, hi - lo)
    if chunks.is_edge_index:
        return np.stack([table.column(c).to_numpy().astype(chunks.dtype, copy=False) for c in columns])
    if len(columns) > 1:
        return np.stack([table.column(c).to_numpy() for c in columns], axis=1).astype(chunks.dtype, copy=False)
    column = table.column(columns[0]).combine_chunks()
    if chunks.row_shape:   # a list column: flatten the values and fold them back into rows
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(-1, *chunks.row_shape).astype(chunks.dtype, copy=False)
    return column.to_numpy(zero_copy_only=False).astype(chunks.dtype, copy=False)


def _parquet_columns(spec: str) -> list[str]:
    if ".." in spec:   # x0..x99
        first, last = spec.split("..")
        prefix = first.rstrip("0123456789")
        return [f"{prefix}{i}" for i in range(int(first[len(prefix):]), int(last[len(prefix):]) + 1)]
    return spec.split(",")


def npy_chunks(name: str, paths: list[Path]) -> ArrayChunks:
    files: list[ChunkFile] = []
    dtype, row_shape = None, None
    shape: tuple[int, ...]
    for path in paths:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"chunk {unreadable_npy(path, exc, 're-export it')} (field {name})") from exc
        if name == "edge_index":
            if array.ndim != 2 or array.shape[0] != 2 or not np.issubdtype(array.dtype, np.integer):
                raise InputError(f"chunk {path} of edge_index has shape {list(array.shape)} and dtype {array.dtype}; "
                                 f"every edge_index chunk is an integer [2, E_i] array")
            rows, shape = int(array.shape[1]), ()
        else:
            if array.ndim == 0:
                raise InputError(f"chunk {path} of {name} is a scalar; give one row per node/edge")
            rows, shape = int(array.shape[0]), tuple(int(s) for s in array.shape[1:])
        if dtype is not None and (array.dtype != dtype or shape != row_shape):
            raise InputError(f"chunk {path} of {name} has dtype {array.dtype} rows {list(shape)}, but the chunks "
                             f"before it have {dtype} {list(row_shape or ())}; every chunk of a field has the same")
        dtype, row_shape = array.dtype, shape
        files.append(ChunkFile(str(path), rows))
    return ArrayChunks(name, tuple(files), str(np.dtype("int64") if name == "edge_index" else dtype),
                       tuple(row_shape or ()))


def parquet_fields(folder: Path) -> dict[str, ArrayChunks]:
    out: dict[str, ArrayChunks] = {}
    edges, nodes = sorted(folder.glob("edges*.parquet")), sorted(folder.glob("nodes*.parquet"))
    if edges:
        out.update(_parquet_group(edges, {"edge_index": "src,dst", "edge_weight": "edge_weight",
                                          "edge_time": "edge_time"}))
    if nodes:
        out.update(_parquet_group(nodes, {c.file: c.file for c in INPUT_COLUMNS}))
    return out


def _parquet_group(paths: list[Path], wanted: dict[str, str]) -> dict[str, ArrayChunks]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files: dict[str, list[ChunkFile]] = {}
    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in paths:
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"chunk {path} is not a readable Parquet file ({exc}); re-export it") from exc
        schema, rows = pf.schema_arrow, pf.metadata.num_rows
        for name, column in wanted.items():
            spec = _parquet_spec(path, schema, name, column, pf)
            if spec is None:
                continue
            col, dtype, shape = spec
            if name in specs and specs[name] != (dtype, shape):
                raise InputError(f"chunk {path}: column {col} has {dtype} {list(shape)}, other files "
                                 f"{specs[name][0]} {list(specs[name][1])}; every file needs the same columns")
            specs[name] = (dtype, shape)
            files.setdefault(name, []).append(ChunkFile(str(path), rows, col))
        if "edge_index" in wanted and not any(f.path == str(path) for f in files.get("edge_index", [])):
            raise InputError(f"chunk {path} has no integer columns src and dst; every edges*.parquet file needs them")
    return {name: ArrayChunks(name, tuple(fs), specs[name][0], specs[name][1]) for name, fs in files.items()}


def _parquet_spec(path: Path, schema, name: str, column: str, pf) -> tuple[str, str, tuple[int, ...]] | None:
    import pyarrow as pa

    names = set(schema.names)
    if name == "edge_index":
        if not {"src", "dst"} <= names:
            return None
        if not all(pa.types.is_integer(schema.field(c).type) for c in ("src", "dst")):
            raise InputError(f"chunk {path}: columns src and dst must be integers")
        return "src,dst", "int64", ()
    if name == "x" and "x" not in names:
        numbered = sorted((int(c[1:]), c) for c in names if re.fullmatch(r"x\d+", c))
        if not numbered:
            return None
        if [i for i, _ in numbered] != list(range(len(numbered))):
            raise InputError(f"chunk {path}: feature columns must be x0, x1, ... without gaps")
        dtype = schema.field(numbered[0][1]).type.to_pandas_dtype()
        return f"x0..x{len(numbered) - 1}", str(np.dtype(dtype)), (len(numbered),)
    if column not in names:
        return None
    typ = schema.field(column).type
    if pa.types.is_list(typ) or pa.types.is_fixed_size_list(typ) or pa.types.is_large_list(typ):
        first = pf.read_row_group(0, columns=[column]).column(0) if pf.metadata.num_row_groups else None
        width = len(first[0]) if first is not None and len(first) else 0
        return column, str(np.dtype(typ.value_type.to_pandas_dtype())), (width,)
    return column, str(np.dtype(typ.to_pandas_dtype())), ()


def chunk_classes(y: ArrayChunks) -> int:
    """As :func:`input_arrays.label_classes`, streaming: ``max + 1`` of integer class labels."""
    if np.issubdtype(np.dtype(y.dtype), np.floating) or y.rows == 0:
        return 0
    if len(y.row_shape) == 1:
        return int(y.row_shape[0])
    if y.row_shape:
        return 0
    step = max(1, HASH_ROWS_BYTES // max(1, y.row_bytes))
    return int(max(int(y.read(s, min(s + step, y.rows)).max()) for s in range(0, y.rows, step))) + 1


def hash_chunks(h, label: str, chunks: ArrayChunks) -> None:
    """What ``graph_input._hash_array`` hashes for the concatenated field, read a slice at a time."""
    if chunks.is_edge_index:
        h.update(f"{label}:{np.dtype(chunks.dtype).str}:{[2, chunks.rows]};".encode())
        step = max(1, HASH_ROWS_BYTES // 8)
        for row in (0, 1):
            for s in range(0, chunks.rows, step):
                h.update(np.ascontiguousarray(chunks.read(s, min(s + step, chunks.rows))[row]))
        return
    h.update(f"{label}:{np.dtype(chunks.dtype).str}:{[chunks.rows, *chunks.row_shape]};".encode())
    step = max(1, HASH_ROWS_BYTES // max(1, chunks.row_bytes))
    for s in range(0, chunks.rows, step):
        h.update(np.ascontiguousarray(chunks.read(s, min(s + step, chunks.rows))))
