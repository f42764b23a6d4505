"""The part a daemon serves: opened once at startup, memory-mapped, checked.

The daemon itself never samples (its session workers do); it needs the partition's
schema for GetClusterInfo and the sizes it validates requests against.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from graphfeed.core.constants import SPLITS
from graphfeed.server.daemon.config import ServerConfig
from graphfeed.server.daemon.exitcodes import ExitCode, StartupError
from graphfeed.server.partition.format.layout import PartitionFormatError, PartitionMeta, PartitionPaths, read_meta
from graphfeed.server.partition.format.store import Partition


@dataclass(frozen=True)
class ServedPartition:
    root: str
    part_id: int
    meta: PartitionMeta
    local_split_sizes: dict[str, int]
    num_local_nodes: int
    file_sizes: dict[str, int] = field(default_factory=dict)   # every array file of the part -> its bytes

    def unreadable(self) -> str | None:
        """Why the part's files cannot be read now (one missing, truncated or grown since startup), else None.
        A few ``stat`` calls: cheap enough for every reaper pass."""
        for path, size in self.file_sizes.items():
            try:
                now = os.stat(path).st_size
            except OSError as exc:
                return f"{path} cannot be read: {exc.strerror or exc}"
            if now != size:
                return f"{path} is {now:,} bytes, {size:,} when the server started (truncated or replaced)"
        return None

    @property
    def num_nodes(self) -> int:
        """Nodes of the whole graph: valid original ids are ``0..num_nodes-1``."""
        return self.meta.num_nodes


def load_partition(config: ServerConfig) -> ServedPartition:
    """Open ``config.part`` of ``config.partition`` and map every array once.

    Raises :class:`StartupError` with ``PARTITION`` when the folder cannot be loaded, or
    ``CONFIG`` when the folder is fine but has no part ``config.part``.
    """
    try:
        meta = read_meta(config.partition)
    except PartitionFormatError as exc:
        raise StartupError(ExitCode.PARTITION, f"partition cannot be loaded: {exc}") from None
    if not 0 <= config.part < meta.num_parts:
        raise StartupError(ExitCode.CONFIG,
                           f"part = {config.part} is invalid: {config.partition} has parts 0..{meta.num_parts - 1}")
    try:
        part = Partition(config.partition, config.part, meta)
        for kind in meta.topologies:  # maps indptr/indices/eid of every edge type and checks their sizes
            for etype in part.edge_types:
                part.edges(etype).topology(kind)
        for ntype in part.node_types:
            store = part.nodes(ntype)
            _ = store.x, store.y, store.orig_id
        local = {name: int(part.split(name).numel()) for name in SPLITS if name in meta.split_sizes}
    except (PartitionFormatError, OSError) as exc:
        raise StartupError(ExitCode.PARTITION, f"partition cannot be loaded: {exc}") from None
    sizes = {str(p): p.stat().st_size for p in sorted(Path(PartitionPaths(config.partition).part(config.part))
                                                           .rglob("*.npy"))}
    return ServedPartition(root=str(config.partition), part_id=config.part, meta=meta,
                           local_split_sizes=local, num_local_nodes=part.num_nodes, file_sizes=sizes)
