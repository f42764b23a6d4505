"""Sampling over a trainer's group: this worker's part locally, the other parts via their workers.

A :class:`DistributedGraph` is a :class:`graphfeed.server.loader.producer.SamplingGraph`:
each hop splits the frontier by owner, sends the remote pieces to the owning workers
(``rpc_async``, all at once), samples the local piece meanwhile, and stitches the pieces
back into frontier order.  The counter-based RNG keys every choice by (seed, hop, node), so
the result equals :class:`graphfeed.server.sampling.graph.LocalGraph`'s bit for bit.
"""
from __future__ import annotations

import torch
import torch.distributed.rpc as rpc

from graphfeed.core.constants import worker_name

from graphfeed.server.partition.store import Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.graph import sample_part
from graphfeed.server.sampling.neighbor import sample_subgraph, stitch
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.sampling.types import OneHop, SampledSubgraph
from graphfeed.server.worker import rpc_api
from graphfeed.server.worker.telemetry import WorkerTelemetry


class PeerError(RuntimeError):
    """A peer worker failed (or is unreachable) while serving a hop or a feature lookup."""


class DistributedGraph:
    def __init__(self, part: Partition, rpc_timeout: float, telemetry: WorkerTelemetry | None = None):
        self.part = part
        self.book = part.book
        self.rpc_timeout = float(rpc_timeout)
        self.telemetry = telemetry if telemetry is not None else WorkerTelemetry()

    # ---- the SamplingGraph protocol -------------------------------------------------------------

    def sample(self, seeds: torch.Tensor, spec: SamplingSpec, seed: int) -> SampledSubgraph:
        tel, me = self.telemetry, self.part.part_id
        if self.book.num_parts == 1:  # every node is local: the fused multi-hop sampler
            with tel.stage("local_sample"):
                return dispatch.sample_local(self.part.topology(spec.topology), self.part.start, seeds, spec, seed)

        def one_hop(gids: torch.Tensor, fanout: int, hop: int) -> OneHop:
            split = self.book.split(gids)
            t0 = tel.clock()
            remote = [(pos, p, self._call(p, "one_hop", rpc_api.one_hop, gids[pos], fanout, spec.replace,
                                          spec.direction, seed, hop)) for p, pos in split if p != me]
            pieces = []
            for p, pos in split:
                if p == me:  # sampled while the remote pieces are in flight
                    with tel.stage("local_sample"):
                        pieces.append((pos, sample_part(self.part, gids[pos], spec, fanout, seed, hop)))
            if remote:
                pieces += [(pos, OneHop(*self._wait(p, fut, "one_hop"))) for pos, p, fut in remote]
                tel.observe_stage("remote_sample", tel.clock() - t0)
            return stitch(gids.numel(), pieces)

        return sample_subgraph(seeds, spec, one_hop)

    def gather(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with self.telemetry.stage("feature_gather"):
            return self._gather(gids)

    def _gather(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        split = self.book.split(gids)
        part = self.part
        if len(split) == 1 and split[0][0] == part.part_id:  # all local (one part): no second copy
            return self.local_gather(gids)
        remote = [(pos, p, self._call(p, "gather", rpc_api.gather, gids[pos]))
                  for p, pos in split if p != part.part_id]
        x = torch.empty((gids.numel(),) + tuple(part.x.shape[1:]), dtype=part.x.dtype)
        y = torch.empty((gids.numel(),) + tuple(part.y.shape[1:]), dtype=part.y.dtype)
        orig = torch.empty(gids.numel(), dtype=torch.int64)
        # index_copy_ rather than ``x[pos] = ...``: advanced-indexing assignment is several times slower
        pieces = [(pos, self.local_gather(gids[pos])) for p, pos in split if p == part.part_id]
        for pos, rows in pieces + [(pos, self._wait(p, fut, "gather")) for pos, p, fut in remote]:
            for out, src in zip((x, y, orig), rows):
                out.index_copy_(0, pos, src)
        return x, y, orig

    # ---- what peers ask of this part ------------------------------------------------------------

    def _check_owned(self, gids: torch.Tensor) -> torch.Tensor:
        gids = torch.as_tensor(gids, dtype=torch.int64)
        p = self.part
        if gids.numel() and (int(gids.min()) < p.start or int(gids.max()) >= p.stop):
            raise ValueError(f"part {p.part_id} owns node ids {p.start}..{p.stop - 1}, "
                             f"got ids in {int(gids.min())}..{int(gids.max())}")
        return gids

    def local_one_hop(self, gids, fanout: int, replace: bool, direction: str, seed: int, hop: int):
        gids = self._check_owned(gids)
        spec = SamplingSpec((fanout,), replace=replace, direction=direction)
        res = sample_part(self.part, gids, spec, fanout, seed, hop)
        return res.counts, res.neighbors, res.eids

    def local_gather(self, gids):
        local = self._check_owned(gids) - self.part.start
        p = self.part  # the dispatched row gather (native: parallel, GIL released), as LocalGraph.gather
        return tuple(dispatch.gather_rows(t, local) for t in (p.x, p.y, p.orig_id))

    # ---- RPC plumbing ---------------------------------------------------------------------------

    def _call(self, part: int, call: str, func, *args):
        """``func(*args)`` on peer ``part``; its latency and outcome are recorded when it completes."""
        tel = self.telemetry
        t0 = tel.clock()
        fut = rpc.rpc_async(worker_name(part), func, args=args, timeout=self.rpc_timeout)

        def done(f) -> None:
            try:
                f.wait()
                ok = True
            except Exception:  # noqa: BLE001 -- the waiter raises it; here it is only counted
                ok = False
            tel.observe_remote(part, call, tel.clock() - t0, ok)

        fut.add_done_callback(done)
        return fut

    def _wait(self, part: int, fut, what: str):
        try:
            return fut.wait()
        except Exception as exc:  # RPC errors arrive as RuntimeError with the peer's message
            self.telemetry.count_error("remote")
            raise PeerError(f"{what} on peer worker part{part} failed: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
