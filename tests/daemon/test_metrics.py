"""Prometheus metrics through real ``graphfeed serve`` daemons (2 parts, 2000 nodes, ``--metrics-port 0``).

One module-scoped cluster; every test reads counter *deltas*, so test order does not matter.
"""
from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.graphs import synthetic_parts
from prometheus_client.parser import text_string_to_metric_families

import graphfeed.client as gf
from graphfeed.core import metric_names
from graphfeed.server.daemon import metrics as m
from graphfeed.testing.cluster import running_cluster

FANOUTS = [4, 3]
SCRAPE_BOUND = 1.0   # seconds: a scrape must answer within this, even during sampling


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("metrics") / "parts", nodes=2000, avg_degree=6, features=8,
                           classes=4, parts=2, name="metrics-2000")


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, args=("--metrics-port", "0"),
                         log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


def scrape_text(server, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://{server.host}:{server.metrics_port}/metrics", timeout=timeout) as reply:
        assert reply.status == 200
        return reply.read().decode()


def scrape(server) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted label items): value}`` of one scrape."""
    out = {}
    for family in text_string_to_metric_families(scrape_text(server)):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not exposed; have {sorted({k[0] for k in samples})}"
    return samples[key]


def total(samples: dict, name: str, **labels) -> float:
    """Sum over every series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def series_count(samples: dict) -> int:
    return len(samples)


# ---- the endpoint -----------------------------------------------------------------------------------

def test_ready_line_names_the_metrics_port_and_every_family_is_declared(cluster):
    for server in cluster:
        assert server.metrics_port and server.metrics_port != server.port
        samples = scrape(server)
        names = {name for name, _ in samples}
        assert names <= m.series_names() | {n + "_created" for n in m.series_names()} | m.PROCESS_SERIES, \
            names - m.series_names()
        assert m.PROCESS_SERIES <= names, m.PROCESS_SERIES - names       # the standard process collector
        assert value(samples, "process_resident_memory_bytes") > 0
        assert value(samples, "graphfeed_partition_info", graph=samples and next(
            dict(lab)["graph"] for n, lab in samples if n == "graphfeed_partition_info"),
            part=str(server.part), num_parts="2") == 1
        assert value(samples, "graphfeed_partition_nodes") > 0
        assert value(samples, "graphfeed_partition_edges") > 0
        assert value(samples, "graphfeed_partition_mapped_bytes") > 0
        build = [dict(lab) for n, lab in samples if n == "graphfeed_build_info"]
        assert len(build) == 1 and build[0]["version"] and build[0]["torch"]
        assert value(samples, "graphfeed_draining") == 0


def test_epoch_moves_counters_by_the_batches_delivered(cluster):
    before = [scrape(s) for s in cluster]
    with gf.connect([s.address for s in cluster], timeout=60) as client:
        loader = client.neighbor_loader("train", FANOUTS, batch_size=16, shuffle=True, seed=3, prefetch=2)
        n = sum(1 for _ in loader)
        per_server = loader.stats()["batches_by_server"]
        during = [scrape(s) for s in cluster]  # the session is still open: figures come from live workers
    after = [scrape(s) for s in cluster]       # the group closed: figures of stopped workers are kept
    assert n == len(loader) and sum(per_server) == n and all(k > 0 for k in per_server)
    for k in range(len(cluster)):
        for now in (during[k], after[k]):
            served = value(now, "graphfeed_batches_served_total", kind="train") - \
                value(before[k], "graphfeed_batches_served_total", kind="train")
            assert served == per_server[k], f"server {k}: metrics say {served}, client got {per_server[k]}"
            assert value(now, "graphfeed_bytes_served_total", kind="train") > \
                value(before[k], "graphfeed_bytes_served_total", kind="train")
            for stage in ("local_sample", "remote_sample", "feature_gather", "encode", "batch"):
                got = total(now, "graphfeed_stage_seconds_count", stage=stage) - \
                    total(before[k], "graphfeed_stage_seconds_count", stage=stage)
                assert got > 0, f"server {k}: no {stage} observations"
            assert total(now, "graphfeed_remote_calls_total", peer=f"part{1 - k}") > \
                total(before[k], "graphfeed_remote_calls_total", peer=f"part{1 - k}")
            assert value(now, "graphfeed_sessions_opened_total") == \
                value(before[k], "graphfeed_sessions_opened_total") + 1
            # the worker's secure listener took the trainer's connection and its peer's (the peer's remote calls)
            assert value(now, "graphfeed_data_path_listener_total", kind="authenticated") - \
                value(before[k], "graphfeed_data_path_listener_total", kind="authenticated") >= 2
            assert value(now, "graphfeed_data_path_listener_total", kind="handshake_timeout") == 0
            assert value(now, "graphfeed_data_path_saturated") == 0
        assert value(during[k], "graphfeed_sessions_open", kind="train") == 1
        assert value(during[k], "graphfeed_groups_open") == 1
        assert value(after[k], "graphfeed_sessions_open", kind="train") == 0
        assert value(after[k], "graphfeed_groups_open") == 0
        assert value(after[k], "graphfeed_buffered_batches", kind="train") == 0


def test_scrape_during_sampling_answers_within_a_second(cluster):
    times: list[float] = []
    stop = threading.Event()

    def scrape_loop():
        while not stop.is_set():
            t0 = time.perf_counter()
            scrape_text(cluster[0], timeout=10)
            times.append(time.perf_counter() - t0)
            time.sleep(0.05)

    with gf.connect([s.address for s in cluster], timeout=60) as client:
        loader = client.neighbor_loader("train", [10, 10], batch_size=8, shuffle=True, seed=5, prefetch=4)
        thread = threading.Thread(target=scrape_loop, daemon=True)
        thread.start()
        try:
            for _ in range(2):
                n = sum(1 for _ in loader)
                assert n == len(loader)
        finally:
            stop.set()
            thread.join(15)
    assert not thread.is_alive(), "the scrape loop did not end"
    assert times, "no scrape finished during the epochs"
    assert max(times) < SCRAPE_BOUND, f"slowest scrape took {max(times):.3f} s (all: {times})"


def test_series_do_not_grow_with_sessions(cluster):
    with gf.connect([s.address for s in cluster], timeout=60) as client:
        first = client.neighbor_loader("train", FANOUTS, batch_size=64, seed=1)
        sum(1 for _ in first)
        baseline = [series_count(scrape(s)) for s in cluster]
        first.close()
        for i in range(3):
            with client.neighbor_loader("train", FANOUTS, batch_size=64, seed=10 + i) as loader:
                sum(1 for _ in loader)
        assert [series_count(scrape(s)) for s in cluster] == baseline
    for s in cluster:
        samples = scrape(s)
        assert not any("session" in k for _, lab in samples for k, _v in lab), "a series is labelled by session"


# ---- client side (no servers) -------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_loader_stats_data_stall_ratio_and_rate():
    from graphfeed.client.metrics import LoaderStats

    clock = FakeClock()
    stats = LoaderStats("train", num_servers=2, clock=clock)
    stats.start_epoch(0)
    for server, (wait, step) in enumerate([(1.0, 3.0), (0.5, 3.5)]):   # waits 1.5 s of 8 s wall
        clock.now += wait
        stats.delivered(server)
        clock.now += step
        stats.asked()
    stats.end_epoch()
    s = stats.snapshot()
    assert (s["batches"], s["batches_by_server"]) == (2, [1, 1])
    assert s["wait_seconds"] == pytest.approx(1.5) and s["wall_seconds"] == pytest.approx(8.0)
    assert s["data_stall_ratio"] == pytest.approx(1.5 / 8.0)
    assert s["batches_per_second"] == pytest.approx(2 / 8.0)
    stats.start_epoch(1)                      # a second epoch: per-epoch figures reset, totals keep the first
    clock.now += 2.0                          # still waiting for the first batch: that wait counts already
    s = stats.snapshot()
    assert (s["epoch"], s["batches"], s["data_stall_ratio"]) == (1, 0, pytest.approx(1.0))
    assert s["total"]["batches"] == 2 and s["total"]["wall_seconds"] == pytest.approx(10.0)


def test_client_metrics_endpoint_and_names_match_the_contract():
    from graphfeed.client import metrics as cm

    assert cm.CLIENT_METRICS is metric_names.CLIENT_METRICS   # one list, in core, for client and server
    # a name no other test uses: LOADERS holds every live loader of this process (another
    # test's "val" loader not yet collected would add its batches to the same series)
    NAME = "contract-test-loader"
    clock = FakeClock()
    stats = cm.LoaderStats(NAME, num_servers=1, clock=clock)
    stats.start_epoch(0)
    clock.now += 1.0
    stats.delivered(0)
    clock.now += 3.0
    server = cm.start_metrics_server(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        server.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert {name for name, _ in samples} <= m.series_names(metric_names.CLIENT_METRICS)
    assert value(samples, "graphfeed_client_batches_total", loader=NAME) == 1
    # the ratios are PromQL's to derive: wait and wall as counters, per-batch waits as a histogram
    assert value(samples, "graphfeed_client_wait_seconds_total", loader=NAME) == pytest.approx(1.0)
    assert value(samples, "graphfeed_client_wall_seconds_total", loader=NAME) == pytest.approx(4.0)
    assert value(samples, "graphfeed_client_batch_wait_seconds_count", loader=NAME) == 1
    assert value(samples, "graphfeed_client_batch_wait_seconds_sum", loader=NAME) == pytest.approx(1.0)
    assert value(samples, "graphfeed_client_batch_wait_seconds_bucket", loader=NAME, le="0.5") == 0
    assert value(samples, "graphfeed_client_batch_wait_seconds_bucket", loader=NAME, le="1.0") == 1
    assert not any(spec.type == "gauge" for spec in metric_names.CLIENT_METRICS.values())
