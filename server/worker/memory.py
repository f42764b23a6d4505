"""This process's memory: the limit it runs under, and handing freed memory back.

**The limit** (:func:`memory_limit`) is what the kernel enforces on this process, not the host's RAM:
the memory cgroup this process is in -- read from ``/proc/self/cgroup``, so a container, a systemd
unit's ``MemoryMax=`` or a Kubernetes pod's ``limits.memory`` (all of them land in the process's own
cgroup) count, and so does any ancestor's smaller limit -- on cgroup v2 (``memory.max``) and v1
(``memory.limit_in_bytes``); else the host's memory.  The host's *available* memory
(``MemAvailable``) is reported beside it: what can be had now, which a loader's footprint is also
checked against (:func:`loader_memory`).

**Refusals keep nothing**: a refused request's exception must not hold the request -- its traceback's
frames hold every local of the functions it passed through (the ids, the tensors decoded from them),
and an exception stored in a pending result that the raising frame also holds is a reference cycle,
freed only whenever the garbage collector next runs.  :func:`released` drops those frames; the caller
gets the message, which is all that travels.  :func:`trim_heap` gives the freed pages back to the OS
(glibc keeps them in its arenas otherwise).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
MEMINFO = Path("/proc/meminfo")
UNLIMITED = 1 << 60          # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1
V2_FILE, V1_FILE = "memory.max", "memory.limit_in_bytes"


@dataclass(frozen=True)
class MemoryLimit:
    """A memory limit in bytes and where it was read (``source``: a file path, or ``"host memory"``)."""

    bytes: int
    source: str

    def describe(self) -> str:
        return f"{self.bytes / (1 << 30):.2f} GiB ({self.source})"


def cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """``(v2 path, v1 memory-controller path)`` of a ``/proc/<pid>/cgroup`` text (None where absent).

    Lines are ``hierarchy-id:controllers:path``: v2's is ``0::/path``; v1's memory line lists
    ``memory`` among its comma-separated controllers."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        hid, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2):
            continue
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _read_limit(path: Path) -> int | None:
    """The limit in one cgroup file: bytes, or None for ``max`` / v1's "unlimited" / an unreadable file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= UNLIMITED:
        return None
    return int(text)


def _mount_candidates(root: Path, path: str, leaf: str) -> list[Path]:
    """The cgroup's directory and its ancestors (smallest limit wins), under ``root``.

    Inside a container the cgroup namespace makes ``/proc/self/cgroup`` say ``/`` while the mount
    shows the container's own cgroup at ``root``; outside, the path is relative to ``root``."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    dirs = [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d / leaf for d in dirs]


def cgroup_limit(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> MemoryLimit | None:
    """The smallest memory limit of this process's cgroup and its ancestors (v2, else v1); None when
    none is set.  ``proc_cgroup``: the text of ``/proc/self/cgroup`` (read when None)."""
    if proc_cgroup is None:
        try:
            proc_cgroup = PROC_CGROUP.read_text()
        except OSError:
            proc_cgroup = ""
    v2, v1 = cgroup_paths(proc_cgroup)
    tries = []
    if v2 is not None:
        tries += _mount_candidates(root, v2, V2_FILE)
    if v1 is not None:
        tries += _mount_candidates(root / "memory", v1, V1_FILE)
    found = [(limit, path) for path in tries if (limit := _read_limit(path)) is not None]
    if not found:
        return None
    limit, path = min(found)
    return MemoryLimit(limit, str(path))


def host_memory() -> MemoryLimit:
    """The host's physical memory."""
    try:
        return MemoryLimit(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host memory")
    except (ValueError, OSError):
        return MemoryLimit(16 << 30, "assumed 16 GiB (host memory unreadable)")


def memory_limit(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> MemoryLimit:
    """What this process may use: its cgroup's limit when one is set and below the host's memory, else
    the host's memory."""
    host = host_memory()
    cgroup = cgroup_limit(proc_cgroup, root)
    return cgroup if cgroup is not None and cgroup.bytes < host.bytes else host


def available_memory(meminfo: Path = MEMINFO) -> int | None:
    """The host's ``MemAvailable`` in bytes (None where unreadable)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return None
    return None


LOADER_SHARE = 2   # a loader may use 1/LOADER_SHARE of the memory: the rest is the part's pages, the daemon, peers


def loader_memory(configured: int = 0, proc_cgroup: str | None = None, root: Path = CGROUP_ROOT,
                  meminfo: Path = MEMINFO) -> MemoryLimit:
    """What one loader's session worker may hold (its :class:`~graphfeed.server.sampling.budget.Footprint`):
    ``configured`` bytes when set (the daemon's ``loader_memory``), else half of this process's limit
    (:func:`memory_limit`; the rest is the part's pages, the daemon and its peers), or the host's memory
    available now when that is less -- it already leaves out what the other workers, daemons and
    trainers of the host hold."""
    if configured > 0:
        return MemoryLimit(int(configured), "loader_memory in the server config")
    limit = memory_limit(proc_cgroup, root)
    share = MemoryLimit(limit.bytes // LOADER_SHARE, f"1/{LOADER_SHARE} of {limit.describe()}")
    available = available_memory(meminfo)
    if available is not None and available < share.bytes:
        share = MemoryLimit(available, f"MemAvailable of {meminfo} now, below 1/{LOADER_SHARE} of "
                                       f"{limit.describe()}")
    return MemoryLimit(share.bytes, f"{share.source}; set loader_memory to choose")


def released(exc: BaseException) -> BaseException:
    """``exc`` without its traceback (nor its causes'): a refused request's data is no longer reachable
    from the error, which a pending result may hold (see the module doc)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


def _glibc_trim():
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):   # not glibc (musl, macOS)
        return None


_TRIM = _glibc_trim()
M_MMAP_THRESHOLD = -3          # mallopt's parameter number (glibc malloc.h)
MMAP_THRESHOLD = 1 << 20       # bytes: larger blocks are mapped on their own and unmapped when freed


def map_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """Have glibc map every heap block over ``threshold`` bytes on its own, so freeing it returns it.

    By default glibc raises this threshold to the largest block freed so far (up to 32 MiB): after one
    large request, the next ones are carved from the thread arenas, which then stay tens of MB larger
    (fragments between live blocks that ``malloc_trim`` cannot return).  For a process whose large
    blocks are rare -- the daemon's control plane -- a fixed threshold costs a map per large block and
    keeps its size flat; not for the session worker, whose batches are large blocks reused at the rate
    of its producers.  False where the C library has no ``mallopt``."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))


def trim_heap() -> bool:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``); False where there is none."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
