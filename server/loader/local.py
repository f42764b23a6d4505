"""Single-process neighbor loader over a partition folder (all partitions in this process).

For small graphs, tests, and as the reference the remote loader must equal: for the same
arguments and seed it yields identical batches (same plan, same sampler, same encoder).
"""
from __future__ import annotations

import os
from typing import Iterator, Sequence

import torch
from typing_extensions import Unpack

from graphfeed.core import batch as batch_codec
from graphfeed.core.agreement import check_ranks_agree, inputs_fingerprint, settings_fingerprint
from graphfeed.core.compat import check_not_graph, take_loader_extras
from graphfeed.core.data_check import check_data
from graphfeed.core.delivery import Delivery
from graphfeed.core.embedding import check_tables, hand_out_rows, rows_dtype
from graphfeed.core.epoch import BatchSpec, EpochPlan, input_positions
from graphfeed.core.loader_stats import LoaderStats
from graphfeed.core.progress import EpochProgress, PygLoaderFace, check_cursor
from graphfeed.core.spec import (
    LinkInput,
    LoaderSpec,
    LocalLoaderOptions,
    SeedInput,
    split_options,
)
from graphfeed.server.loader.served import PartsServed
from graphfeed.server.partition.format.store import Partition, open_parts, resolve_original_ids
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.server.sampling.producer import node_seed_time, planned_batches, produce_batch
from graphfeed.server.sampling.producer import sample_nodes as _sample_nodes


class LocalNeighborLoader(PygLoaderFace):
    """Iterate PyG mini-batches sampled from a partitioned graph: ``Data`` for a homogeneous graph,
    ``HeteroData`` for a typed one.

    Arguments follow PyG's ``NeighborLoader``; the first is the partition folder (or a :class:`PartitionedGraph`).
    ``data``: the script's own ``Data``/``HeteroData`` (PyG's first argument), checked against the parts
    before any batch (:func:`graphfeed.core.data_check.check_data`: ValueError naming the difference and the
    fix; ``verify=False`` warns instead); batches always come from the parts.  ``input_nodes`` is a split name
    (``"train"``, ``"val"``, ``"test"``), a tensor of original node ids, ``None`` (all nodes),
    or for a typed graph a tuple ``(node_type, split | ids | None)`` (a bare split or ``None``
    means the label type).  ``num_neighbors`` is one list of per-hop fanouts for every edge
    type, or a dict ``{(src, rel, dst): [...]}`` (edge types left out are not sampled).
    The keywords are :class:`~graphfeed.core.spec.LocalLoaderOptions` (documented there once:
    ``batch_size``, ``shuffle``, ``replace``, ``weight_attr``, ``time_attr``, ``input_time``, ``ordered``,
    ``feature_dtype``, ...; TypeError for another keyword).
    Each ``iter()`` is one epoch; epochs count from 0 and advance by one per ``iter()`` unless
    :meth:`set_epoch` is called (as with ``DistributedSampler``); every rank gets ``len(loader)`` batches
    (see :mod:`graphfeed.core.epoch` for ``drop_last`` and ``ordered``).
    The arguments are kept as one :class:`LoaderSpec` (``self.spec``).  One live iterator at a
    time, ``state_dict``/``load_state_dict`` and the DDP agreement check behave as the remote
    loader's (:mod:`graphfeed.core.progress`, :mod:`graphfeed.core.agreement`).
    ValueError (one line, naming the type and the fix) for a node type or fanout edge type the graph
    lacks.
    """

    embeddings: list | None   # LocalEmbedding tables of a node loader (None: none; link loaders refuse them)
    # what the remote loader has and an in-process loader has not: no client, no sessions on servers,
    # no read-ahead (each batch is made when asked), no feature cache (every row is in this process)
    client = None
    session_set = None
    prefetch = 0
    feature_cache = None

    def __init__(self, parts: str | os.PathLike | PartitionedGraph | None = None, num_neighbors=None, *,
                 input_nodes="train", data=None, verify: bool = True, **options: Unpack[LocalLoaderOptions]):
        own, spec_options = split_options(options, LocalLoaderOptions, type(self).__name__)
        self.transforms = take_loader_extras(own, "nodes")
        embeddings = own.pop("embeddings", None)
        delivery = Delivery(**own)   # first: a bad device fails before the parts are opened
        graph, data = open_graph(parts, data, type(self).__name__)
        self._setup(graph, LoaderSpec.of(input_nodes, num_neighbors, **spec_options))
        self._check_data(data, verify)
        self.delivery = delivery
        self.embeddings = check_tables(embeddings, graph.node_types)   # LocalEmbedding tables

    def _setup(self, graph: PartitionedGraph, spec: LoaderSpec) -> None:
        """Check ``spec`` against ``graph`` (ValueError naming the problem), resolve each part's input and
        its positions, and start the epoch bookkeeping (shared with the link loader)."""
        spec.check_schema(graph.node_types, graph.edge_types)
        for part in graph.parts:
            part.check_loader(spec)
        self.input_type = spec.input.type_or(graph.label_type)
        self.graph, self.spec = graph, spec.ordered_input(graph.books[self.input_type].num_nodes)
        self.inputs = part_inputs(self.graph.parts, self.spec.input)
        self.counts = [t.numel() for t in self.inputs]
        self._progress = EpochProgress()
        self._stats = LoaderStats(self.spec.kind, graph.num_parts)
        self._closed = False
        self.delivery = Delivery()   # as produced (the node loader's pin_memory / device replace it)
        self.embeddings = None   # the node loader's tables (link loaders refuse them)
        check_ranks_agree(self.spec, self.counts)
        self.positions = [input_positions(self.counts, p, part.input_positions(self.spec.input))
                          for p, part in enumerate(self.graph.parts)]
        if self.spec.ordered:   # every batch slices the whole input, in order (graphfeed.core.epoch)
            if self.input_type != graph.label_type:
                raise ValueError(f"ordered=True serves nodes of the label type {graph.label_type!r} so far, not "
                                 f"{self.input_type!r}: use ordered=False and place rows by batch.input_id")
            whole = resolve_original_ids(self.graph.parts, self.spec.ordered_ids, self.input_type)
            self.inputs = [whole] * len(self.counts)
            self.positions = [torch.arange(whole.numel())] * len(self.counts)

    def _check_data(self, data, verify: bool) -> None:
        """``data=``: the script's graph against this loader's parts (:mod:`graphfeed.core.data_check`)."""
        if data is not None:
            check_data(data, PartsServed(self.graph), transform=self.transforms.transform, verify=verify)

    @property
    def sessions(self) -> list[str]:
        """Session ids on servers: none (the remote loader has one per server)."""
        return []

    def _plan(self, epoch: int) -> EpochPlan:
        return EpochPlan(self.spec, self.counts, epoch)

    def __len__(self) -> int:
        return len(self._plan(self._progress.next_epoch))

    def __iter__(self) -> Iterator:
        """The next epoch's batches (a loaded state's epoch from its cursor); RuntimeError while an
        earlier iterator is live or after :meth:`close`; collective under DDP (:mod:`graphfeed.core.agreement`)."""
        if self._closed:
            raise RuntimeError("this loader was closed")
        epoch, start = self._progress.begin()
        plan = self._plan(epoch)
        check_cursor(epoch, start, len(plan))
        check_ranks_agree(self.spec, self.counts, epoch=epoch)
        self._stats.start_epoch(epoch)
        batches = self._batches(plan, start)
        self._progress.attach(batches, epoch, start, len(plan))
        return batches

    def _batches(self, plan: EpochPlan, start: int) -> Iterator:
        progress = self._progress
        with progress.running():
            for data in self.delivery(self._produced(plan, start)):
                progress.delivered += 1
                yield hand_out_rows(data, self.embeddings) if self.embeddings else data
        self._stats.end_epoch()

    def _produced(self, plan: EpochPlan, start: int) -> Iterator:
        for seq, entry, seeds, input_id in planned_batches(plan, self.inputs, self.positions, start):
            data = self.transforms.to_pyg(self._produce(plan.epoch, seq, entry, seeds, input_id))
            self._stats.delivered(entry.part)
            yield data
            self._stats.asked()

    def stats(self) -> dict:
        """The remote loader's figures (:mod:`graphfeed.client.metrics`) for this loader: wait is the time
        a batch took to make here; ``batches_by_server`` counts by producing part; no feature cache."""
        stats = self._stats.snapshot()
        stats["feature_cache"] = {"rows": 0, "bytes": 0, "rows_filled": 0, "bytes_filled": 0}
        return stats

    def fail_pulls(self, server: str, reason: str) -> None:
        """Nothing is pulled from a server in process: nothing to fail (the remote loader's hook)."""

    def close(self) -> None:
        """Stop a live epoch; a closed loader starts no epoch (the parts stay open for other loaders)."""
        if self._closed:
            return
        self._closed = True
        live = self._progress._gen() if self._progress._gen is not None else None
        if live is not None:
            live.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _produce(self, epoch: int, seq: int, entry: BatchSpec, seeds: torch.Tensor,
                 input_id: torch.Tensor) -> dict[str, torch.Tensor]:
        """The wire form of batch ``seq`` (plan entry ``entry``, ``seeds`` at input positions ``input_id``)."""
        sampling = self.spec.sampling
        return produce_batch(self.graph, seeds, sampling, entry, epoch, seq, input_type=self.input_type,
                             input_id=input_id, feature_dtype=self.spec.feature_torch_dtype,
                             seed_time=node_seed_time(self.graph, self.spec.input, sampling, self.input_type, seeds,
                                                      input_id),
                             node_extra=self._embedding_rows if self.embeddings else None)

    def _embedding_rows(self, ntype: str, gids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The batch fields of the loader's table of ``ntype`` (none without one): as a session worker's."""
        table = next((t for t in self.embeddings or () if t.spec.ntype == ntype), None)
        if table is None:
            return {}
        gids = gids.cpu()
        return {"emb": table.rows(gids, rows_dtype(table.spec, self.spec.feature_torch_dtype)), "emb_gid": gids}

    def state_dict(self) -> dict:
        """Epoch, cursor, seed and fingerprints (see :mod:`graphfeed.core.progress`)."""
        return self._progress.state_dict(self.spec.seed, *self._fingerprints())

    def load_state_dict(self, state: dict) -> None:
        """Continue ``state``'s epoch at its cursor on the next ``iter()``; ValueError for another loader's."""
        self._progress.load_state_dict(state, self.spec.seed, *self._fingerprints())

    def _fingerprints(self) -> tuple[int, int]:
        return settings_fingerprint(self.spec), inputs_fingerprint(self.spec, self.counts)


def open_graph(parts, data, loader: str) -> tuple[PartitionedGraph, object]:
    """``(graph of the parts, the script's data)`` of a local loader's first argument and ``data=``.

    ``parts``: a partition folder or a :class:`PartitionedGraph`; the older spelling ``data=folder`` (the
    first argument was named ``data``) still works.  TypeError naming the fix for a PyG graph passed first."""
    if parts is None and isinstance(data, (str, os.PathLike, PartitionedGraph)):
        parts, data = data, None
    if parts is None:
        raise TypeError(f"{loader}() needs the partition folder first (graphfeed partition's output)")
    if isinstance(parts, PartitionedGraph):
        return parts, data
    check_not_graph(parts, f"{loader}'s first argument", "pass the partition folder first and the script's "
                                                         "Data as data= (checked against the partition)")
    return PartitionedGraph.in_process(open_parts(parts)[1]), data


def sample_nodes(data: str | os.PathLike | PartitionedGraph, node_ids, num_neighbors, *, seed: int = 0,
                 replace: bool = False, direction: str = "in", weight_attr: str | None = None, feature_dtype=None):
    """One batch for arbitrary original node ids, in one process: what ``Client.sample`` returns for the
    same arguments (the in-process reference, :func:`graphfeed.server.sampling.producer.sample_nodes`).
    ValueError naming the bad id and the valid range for bad ids."""
    graph = data if isinstance(data, PartitionedGraph) else PartitionedGraph.in_process(open_parts(data)[1])
    spec = LoaderSpec.of(None, num_neighbors, replace=replace, direction=direction, seed=seed, rank=0, world_size=1,
                         weight_attr=weight_attr, feature_dtype=feature_dtype, ordered=False)
    for part in graph.parts:
        part.check_loader(spec)
    spec.check_schema(graph.node_types, graph.edge_types)
    wire = _sample_nodes(graph, node_ids, spec.sampling, spec.seed, feature_dtype=spec.feature_torch_dtype)
    return batch_codec.to_pyg(wire)


def part_inputs(parts: Sequence[Partition], node_input: SeedInput) -> list[torch.Tensor]:
    """Each part's seeds for ``node_input`` (global ids, :meth:`Partition.input_nodes`; for a
    :class:`LinkInput` the positions of the seed edges each part owns).

    Ids that no part holds raise :func:`resolve_original_ids`'s ValueError, which names them.
    """
    if isinstance(node_input, LinkInput):
        return [part.input_nodes(node_input) for part in parts]
    ntype = node_input.type_or(parts[0].label_type)
    try:
        inputs = [part.input_nodes(node_input) for part in parts]
    except ValueError:
        if node_input.ids is not None:
            resolve_original_ids(list(parts), node_input.ids, ntype)  # raises, naming the ids not in the graph
        raise
    if node_input.ids is not None and sum(t.numel() for t in inputs) != node_input.ids.numel():
        resolve_original_ids(list(parts), node_input.ids, ntype)      # raises, naming the ids not in the graph
    return inputs
