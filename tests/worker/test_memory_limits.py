"""The memory a process may use (issue 35, item 7): its own cgroup's limit (v2 and v1, found from
``/proc/self/cgroup``, "max" = none, the smallest of its ancestors), the host's available memory, a
loader's share; and a loader's whole footprint against it.  Fake cgroup trees, no real limits."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from graphfeed.server.sampling.budget import BatchEstimate, BudgetExceeded, WorkBudget, footprint, timed_batch
from graphfeed.server.worker import memory
from graphfeed.server.worker.memory import cgroup_limit, cgroup_paths, loader_memory, released

GIB = 1 << 30
V2 = "0::/system.slice/graphfeed@0.service\n"
V1 = ("12:pids:/user.slice\n11:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n"
      "1:name=systemd:/docker/abc\n")


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_paths_of_v1_v2_and_hybrid_hosts():
    assert cgroup_paths(V2) == ("/system.slice/graphfeed@0.service", None)
    assert cgroup_paths(V1) == (None, "/docker/abc")
    assert cgroup_paths("0::/\n4:memory:/kube/pod1\n") == ("/", "/kube/pod1")
    assert cgroup_paths("") == (None, None)


def test_v2_limit_is_the_process_own_cgroup_not_the_root(tmp_path):
    _write(tmp_path, "memory.max", "max\n")   # the root's file: what the old code read
    _write(tmp_path, "system.slice/graphfeed@0.service/memory.max", f"{8 * GIB}\n")   # systemd MemoryMax=8G
    limit = cgroup_limit(V2, tmp_path)
    assert limit is not None and limit.bytes == 8 * GIB
    assert limit.source.endswith("system.slice/graphfeed@0.service/memory.max")


def test_v2_max_means_no_limit_and_an_ancestor_smaller_limit_wins(tmp_path):
    _write(tmp_path, "system.slice/graphfeed@0.service/memory.max", "max\n")
    assert cgroup_limit(V2, tmp_path) is None
    _write(tmp_path, "system.slice/memory.max", f"{3 * GIB}\n")
    limit = cgroup_limit(V2, tmp_path)
    assert limit is not None and (limit.bytes, Path(limit.source).parent.name) == (3 * GIB, "system.slice")


def test_v2_inside_a_container_namespace_reads_the_mount_root(tmp_path):
    _write(tmp_path, "memory.max", f"{2 * GIB}\n")   # /proc/self/cgroup says "/" in its own namespace
    limit = cgroup_limit("0::/\n", tmp_path)
    assert limit is not None and limit.bytes == 2 * GIB


def test_v1_limit_and_its_unlimited_value(tmp_path):
    _write(tmp_path, "memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")   # v1's "no limit"
    assert cgroup_limit(V1, tmp_path) is None
    _write(tmp_path, "memory/docker/abc/memory.limit_in_bytes", f"{512 << 20}\n")
    limit = cgroup_limit(V1, tmp_path)
    assert limit is not None and limit.bytes == 512 << 20 and "memory.limit_in_bytes" in limit.source


def test_unreadable_or_garbled_files_are_no_limit(tmp_path):
    _write(tmp_path, "system.slice/graphfeed@0.service/memory.max", "lots\n")
    assert cgroup_limit(V2, tmp_path) is None
    assert cgroup_limit(V2, tmp_path / "missing") is None


def test_memory_limit_is_the_cgroup_when_below_the_host_else_the_host(tmp_path):
    _write(tmp_path, "system.slice/graphfeed@0.service/memory.max", f"{1 * GIB}\n")
    assert memory.memory_limit(V2, tmp_path).bytes == GIB
    _write(tmp_path, "system.slice/graphfeed@0.service/memory.max", str(1 << 59))   # above any host
    assert memory.memory_limit(V2, tmp_path).source == "host memory"


def test_loader_memory_is_half_the_limit_or_the_available_memory_when_less(tmp_path):
    _write(tmp_path, "system.slice/graphfeed@0.service/memory.max", f"{8 * GIB}\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {64 << 20} kB\nMemAvailable: {32 << 20} kB\n")   # 32 GiB available
    share = loader_memory(0, V2, tmp_path, meminfo)
    assert share.bytes == 4 * GIB and "memory.max" in share.source and "1/2" in share.source
    meminfo.write_text(f"MemAvailable: {3 << 20} kB\n")   # other processes hold the rest of the host
    share = loader_memory(0, V2, tmp_path, meminfo)
    assert share.bytes == 3 * GIB and "MemAvailable" in share.source
    configured = loader_memory(123 << 20, V2, tmp_path, meminfo)
    assert (configured.bytes, configured.source) == (123 << 20, "loader_memory in the server config")


def test_footprint_counts_producers_working_sets_and_buffered_batches():
    est = BatchEstimate(nodes=1000, edges=1000, bytes=100 << 20)
    fp = footprint(est, whole_graph=10 * GIB, max_bytes=GIB, producers=2, buffer_batches=8, buffer_bytes=256 << 20)
    assert (fp.batch_bytes, fp.buffered) == (100 << 20, 3)   # 256 MiB of 100 MiB batches: 3 (soft by one)
    assert fp.bytes == (100 << 20) * (2 * 2 + 3)
    with pytest.raises(BudgetExceeded, match=r"up to 734,003,200 bytes .* more than the 536,870,912 bytes a loader "
                                             r"may use on this server \(from a test\).*batch_size.*num_producers, "
                                             r"buffer_bytes or buffer_batches.*loader_memory"):
        fp.check(512 << 20, "from a test")
    fp.check(GIB, "from a test")
    # fanout -1: the estimate cannot tell, the whole graph or max_batch_bytes bounds the batch
    unbounded = BatchEstimate(None, None, None)
    assert footprint(unbounded, whole_graph=50 << 20, max_bytes=GIB, producers=1, buffer_batches=1,
                     buffer_bytes=1).batch_bytes == 50 << 20
    fp = footprint(unbounded, whole_graph=10 * GIB, max_bytes=GIB, producers=1, buffer_batches=1, buffer_bytes=1)
    assert (fp.batch_bytes, fp.bounded_by) == (GIB, "max_batch_bytes")


def test_released_errors_hold_no_frames():
    def refuse(big):
        raise ValueError("refused") from KeyError("inner")
    try:
        refuse(bytearray(10))
    except ValueError as exc:
        error = released(exc)
    assert error.__traceback__ is None and error.__cause__ is not None and error.__cause__.__traceback__ is None


def test_a_batch_that_outruns_its_time_fails_naming_its_size_and_the_settings():
    budget = WorkBudget(max_nodes=10**9, max_edges=10**9, max_seconds=45.0)
    budget.check_sample(100, 200, 0)   # outside a timed batch (a peer's hop): no clock
    with timed_batch():
        budget.check_sample(100, 200, 0)
    with timed_batch(started=time.monotonic() - 50.0):   # a batch begun 50 s ago
        with pytest.raises(BudgetExceeded, match=r"the batch took 5\d\.\d s up to hop 3 \(1,234 nodes and 5,678 "
                                                 r"edges sampled so far\), more than the 45 s this server allows.*"
                                                 r"rpc_timeout.*smaller fanouts.*batch_size.*connect\(rpc_timeout"):
            budget.check_sample(1234, 5678, 2)
    budget.check_sample(1234, 5678, 2)   # the clock ended with its batch
