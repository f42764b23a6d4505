"""The seams between layers: the loader options table, the records that cross process boundaries,
the typed stats, the client's session set and the first-wins Pending (no servers needed)."""
from __future__ import annotations

import dataclasses
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from graphfeed.client.client import Client
from graphfeed.client.sessions import on_all
from graphfeed.core.batch import BATCH_FIELDS, NODE
from graphfeed.core.spec import (
    LOADER_OPTIONS,
    SAMPLING_OPTIONS,
    LoaderSpec,
    LocalLoaderOptions,
    RemoteLoaderOptions,
    SamplingSpec,
    option_keys,
)
from graphfeed.server.daemon.metrics import METRICS, served_metric
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.sampling.types import NODE_ROW_FIELDS, NodeRows, OneHop
from graphfeed.server.worker.commands import ServedCounts, SessionRow
from graphfeed.transport.pending import Pending

# ---- the options table ----------------------------------------------------------------------------


def test_sampling_options_are_exactly_the_sampling_spec_fields():
    fields = {f.name for f in dataclasses.fields(SamplingSpec)} - {"num_neighbors"}
    assert SAMPLING_OPTIONS == fields


def test_loader_options_are_loader_spec_fields_plus_input_time():
    spec_fields = {f.name for f in dataclasses.fields(LoaderSpec)}
    assert LOADER_OPTIONS - SAMPLING_OPTIONS - {"input_time"} <= spec_fields
    # what a loader keeps itself is not sent to the servers
    assert option_keys(LocalLoaderOptions) - LOADER_OPTIONS == {"pin_memory", "device", "transform",
                                                                "transform_sampler_output", "num_workers",
                                                                "persistent_workers", "prefetch_factor",
                                                                "dequantize", "embeddings"}
    assert option_keys(RemoteLoaderOptions) - option_keys(LocalLoaderOptions) == {"prefetch", "feature_cache_mb"}


@pytest.mark.parametrize("func", [Client.neighbor_loader, Client.link_neighbor_loader, LocalNeighborLoader.__init__,
                                  LocalLinkNeighborLoader.__init__, LoaderSpec.of])
def test_every_loader_takes_the_table_not_its_own_list(func):
    params = inspect.signature(func).parameters
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert not set(params) & LOADER_OPTIONS, "an option spelled out again beside the table"


def test_loader_spec_of_routes_options_and_keeps_defaults_and_errors():
    spec = LoaderSpec.of("train", [3, 2], batch_size=8, shuffle=True, replace=True, direction="out", rank=0,
                         world_size=1, disjoint=True, kind=None)
    assert spec.sampling == SamplingSpec((3, 2), replace=True, direction="out", disjoint=True)
    assert (spec.batch_size, spec.shuffle, spec.kind) == (8, True, "train")
    assert LoaderSpec.of("train", [3], rank=0, world_size=1) == LoaderSpec(SamplingSpec((3,)), spec.input,
                                                                         pack_partial=True)   # PyG's len
    with pytest.raises(ValueError, match="direction must be 'in' or 'out'"):
        LoaderSpec.of("train", [3], direction="up", rank=0, world_size=1)
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        LoaderSpec.of("train", [3], batch_size=0, rank=0, world_size=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bach_size'"):
        LoaderSpec.of("train", [3], bach_size=4)  # type: ignore[call-arg]


def test_a_local_loader_refuses_a_remote_only_or_unknown_keyword(tmp_path):
    with pytest.raises(TypeError, match="LocalNeighborLoader\\(\\) got an unexpected keyword argument 'prefetch'"):
        LocalNeighborLoader(tmp_path, [2], prefetch=2)  # type: ignore[call-arg]


# ---- records across process boundaries --------------------------------------------------------------

PLAIN = (int, float, bool, str, bytes, type(None), torch.Tensor)


def _plain(value) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    if dataclasses.is_dataclass(value):
        return type(value).__dataclass_params__.frozen and all(  # type: ignore[attr-defined]
            _plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    return isinstance(value, PLAIN)


def test_records_on_the_peer_rpc_are_frozen_plain_records():
    """What crosses the data path between workers: frozen dataclasses of primitives, tuples and tensors."""
    spec = SamplingSpec({("a", "r", "b"): [2, 1]}, replace=True, weight_attr="edge_attr")
    rows = NodeRows(torch.zeros(2, 3), None, torch.arange(2))
    hop = OneHop(torch.ones(2, dtype=torch.int64), torch.arange(2), torch.arange(2))
    for record in (spec, rows, hop):
        assert _plain(record), record
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, dataclasses.fields(record)[0].name, None)


def test_node_rows_fields_are_node_fields_of_the_batch_schema():
    assert NODE_ROW_FIELDS == ("x", "y", "n_id")
    assert all(BATCH_FIELDS[name].scope == NODE for name in NODE_ROW_FIELDS)
    assert set(NodeRows.COLUMNS) == set(NODE_ROW_FIELDS)


# ---- typed stats --------------------------------------------------------------------------------------

def test_served_counts_add_zero_gauges_and_name_the_metrics():
    a = ServedCounts(1, 2, 3, 4, 5)
    assert a + a == ServedCounts(2, 4, 6, 8, 10)
    assert a.cumulative() == ServedCounts(1, 2, 3, 0, 0)
    for key in ServedCounts.names():
        assert served_metric(key) in METRICS, key
    row = SessionRow("s", "g", "train", 0, a)
    assert row.as_fields()["bytes_served"] == 3 and row.as_fields()["session_id"] == "s"


# ---- session set and pending ---------------------------------------------------------------------------

class _Server:
    def __init__(self, part: int, delay: float, fail: bool = False):
        self.part, self.delay, self.fail = part, delay, fail


def test_on_all_calls_every_server_at_once_in_order_and_raises_the_first_error():
    servers = [_Server(p, 0.3) for p in range(4)]
    with ThreadPoolExecutor(4) as pool:
        t0 = time.monotonic()
        assert on_all(pool, servers, lambda s: s.part * 10) == [0, 10, 20, 30]

        def slow(s):
            time.sleep(s.delay)
            return s.part

        t0 = time.monotonic()
        assert on_all(pool, servers, slow) == [0, 1, 2, 3]
        assert time.monotonic() - t0 < 4 * 0.3, "the calls ran one after another"
        seen = []

        def failing(s):
            seen.append(s.part)
            if s.part in (1, 2):
                raise RuntimeError(f"part {s.part} failed")
            return s.part

        with pytest.raises(RuntimeError, match="part 1 failed"):
            on_all(pool, servers, failing)
        assert sorted(seen) == [0, 1, 2, 3], "every server is called even when one fails"


def test_pending_first_completion_wins():
    p = Pending()
    assert p.try_set_exception(RuntimeError("server gone"))
    assert not p.try_set_result(1)
    with pytest.raises(RuntimeError, match="server gone"):
        p.result()
    q = Pending()
    done = threading.Event()
    q.add_done_callback(lambda _: done.set())
    assert q.try_set_result(2) and done.is_set() and q.result() == 2
    with pytest.raises(RuntimeError, match="already complete"):
        q.set_result(3)
