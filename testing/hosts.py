"""Emulated hosts on one machine: namespaces, a bridge, and real ``graphfeed`` processes in them.

    from graphfeed.testing.hosts import EmulatedHosts, unavailable

    with EmulatedHosts(3, link_rate="1gbit") as hosts:            # host0, host1, host2
        trainer, a, b = hosts
        parts_a = hosts.copy_parts(a, "runs/parts", [0])          # a's own copy of part 0
        server = hosts.start_server(a, parts_a, 0)                # graphfeed serve --host 198.18.X.2
        proc = trainer.popen([sys.executable, "train.py", server.address])
        a.link(False); ...; a.link(True)                          # its cable out and back in
    # leaving (or at exit, or on the next run after a crash): every process, namespace, veth and the bridge go

A host is a network namespace (``ip netns``) joined to a bridge by a veth pair, plus its own
PID, mount and UTS namespaces (``unshare``): its hostname, a private ``/dev/shm`` (tmpfs: no
shared-memory segment crosses hosts, as on separate machines), and its own ``/etc/hosts``.  Its
first process (``sleep``, pid 1 there) holds the namespaces; every command runs in them through
:mod:`graphfeed.testing.enter_host`, and killing that first process kills everything on the host.

Addresses: one free ``/24`` of 198.18.0.0/15 (the benchmarking range, RFC 2544) per instance;
host *i* is ``.i+1``, the bridge ``.254`` (so this process reaches every host: health checks,
benchmark probes).  ``resolve`` says what each host's own name resolves to there: ``"cluster"`` (its
address; the names of all hosts are in every ``/etc/hosts``), ``"loopback"`` (127.0.1.1, as a stock
Debian install writes it) or ``"none"`` (not at all) -- the last two are the set-ups where a library that
picks its address from the hostname (Gloo) goes wrong.

``link_rate`` (``tc`` notation, e.g. ``"1gbit"``) shapes both directions of every host's link with
a token bucket (``tbf``).  Names carry this process's pid (``gf<pid>-<n>...``): :func:`sweep_stale`
(run by every start) removes what a killed earlier run left behind.

Needs root, ``ip``, ``unshare`` and ``tc``; :func:`unavailable` says why not when not (tests skip with it).
"""
from __future__ import annotations

import atexit
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from graphfeed.core.process import pid_alive
from graphfeed.testing.cluster import (
    META_FILE,
    SERVE_COMMAND,
    ClusterError,
    ServeOptions,
    ServerProcess,
    spawn_server,
    wait_ready,
)

SUBNETS = [f"198.{b}.{c}" for b in (18, 19) for c in range(256)]   # the /24s of 198.18.0.0/15
BRIDGE_HOST = 254
LOOPBACK_NAME_ADDRESS = "127.0.1.1"
RESOLVE = ("cluster", "loopback", "none")
SETUP_TIMEOUT_S = 30.0     # a host's first process to mount and name its host
COMMAND_TIMEOUT_S = 30.0   # one ip/tc command
KILL_WAIT_S = 10.0
SHM_MB = 1024              # each host's /dev/shm (tmpfs: only what is written takes memory)
NAME_RE = re.compile(r"^gf(\d+)-(\d+)(?:h\d+|br)$")
ENTER = (sys.executable, "-m", "graphfeed.testing.enter_host")
HOST_INIT = ('set -e; hostname "$1"; mount -t tmpfs -o "size=$3m,mode=1777" graphfeed-shm /dev/shm; '
             'mount --bind "$2" /etc/hosts; echo ready; exec sleep infinity')
_COUNTER = [0]
_REASON: list[str | None] = []


UNPIN = ("-u", "TP_SOCKET_IFNAME", "-u", "GLOO_SOCKET_IFNAME")   # env(1) arguments


class HostsError(RuntimeError):
    """An emulated host could not be set up, or an ``ip``/``tc`` command failed."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HostsError(f"`{' '.join(argv)}` did not finish within {COMMAND_TIMEOUT_S:g} s") from None
    if check and done.returncode != 0:
        raise HostsError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why emulated hosts cannot be made on this machine (None: they can).  Probed once per process."""
    if not _REASON:
        _REASON.append(_probe())
    return _REASON[0]


def _probe() -> str | None:
    if sys.platform != "linux":
        return f"emulated hosts need Linux namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces, veth pairs, mounts)"
    missing = [tool for tool in ("ip", "unshare", "tc", "sleep", "sh") if shutil.which(tool) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (iproute2, util-linux)"
    name = f"gf{os.getpid()}-0probe"
    made = _run("ip", "netns", "add", name, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip() or made.returncode}"
    _run("ip", "netns", "del", name, check=False)
    done = _run("unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "true", check=False)
    if done.returncode != 0:
        return f"`unshare --mount --uts --pid` fails here: {done.stderr.strip() or done.returncode}"
    return None


def sweep_stale() -> list[str]:
    """Remove namespaces and links named for a process that no longer runs (a crashed run's); their names."""
    gone = []
    netns = _run("ip", "netns", "list", check=False).stdout.split()
    links = [line.split(":")[1].strip().split("@")[0]
             for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines() if line.count(":") >= 2]
    for name in netns + links:
        m = NAME_RE.match(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        cmd = ("ip", "netns", "del", name) if name in netns else ("ip", "link", "del", name)
        if _run(*cmd, check=False).returncode == 0:
            gone.append(name)
    return gone


def _rate_bits(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)", rate.strip().lower())
    if m is None:
        raise ValueError(f"link_rate must be a tc rate such as '1gbit', '100mbit' or '500kbit', got {rate!r}")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] * (8 if m.group(3) == "bps" else 1)
    return float(m.group(1)) * scale


def _free_subnet() -> str:
    used = _run("ip", "-o", "-4", "addr", "show", check=False).stdout
    start = os.getpid() % len(SUBNETS)
    for k in range(len(SUBNETS)):
        subnet = SUBNETS[(start + k) % len(SUBNETS)]
        if f" {subnet}." not in used:
            return subnet
    raise HostsError("every /24 of 198.18.0.0/15 is in use on this machine")


@dataclass(frozen=True)
class LinkCounters:
    """Bytes and packets a host sent and received on its link (from its veth's counters, outside)."""

    sent: int
    received: int
    at: float   # time.monotonic() when read

    def __sub__(self, other: "LinkCounters") -> "LinkCounters":
        return LinkCounters(self.sent - other.sent, self.received - other.received, self.at - other.at)


@dataclass
class Host:
    """One emulated host (see the module doc).  Its processes run through :meth:`popen`."""

    index: int
    name: str          # its hostname
    address: str       # on the bridge
    netns: str         # ip netns name
    veth: str          # the outside end of its link (on the bridge)
    root: Path         # a folder of its own on the shared disk (part copies, logs)
    init: subprocess.Popen | None = None
    pid1: int = 0      # its first process, as this process sees it
    procs: list[subprocess.Popen] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)

    def command(self, argv: Sequence[str]) -> tuple[str, ...]:
        """``argv`` as a command line that runs it on this host, without the interface pins of the process that
        starts it (``lo`` pinned for an earlier cluster on loopback is not this host's interface)."""
        return (*ENTER, str(self.pid1), "--", "env", *UNPIN, *map(str, argv))

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on this host (``subprocess.Popen`` keywords; its own process group by default)."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host to its end, its output captured (killed after ``timeout`` s: HostsError)."""
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate(timeout=KILL_WAIT_S)
            raise HostsError(f"{argv[:3]}... on {self.name} did not finish within {timeout:g} s; killed it.\n"
                             f"stdout: {str(out)[-2000:]}\nstderr: {str(err)[-4000:]}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def link(self, up: bool) -> None:
        """Plug this host's cable in (``up``) or pull it out: its packets are dropped, connections stay open."""
        _run("ip", "link", "set", "dev", self.veth, "up" if up else "down")

    def block(self, other: "Host") -> None:
        """Drop everything this host sends to ``other`` (a blackhole route: no error, no answer)."""
        _run("ip", "-n", self.netns, "route", "replace", "blackhole", f"{other.address}/32")
        self.blocked.add(other.address)

    def unblock(self, other: "Host") -> None:
        if other.address in self.blocked:
            _run("ip", "-n", self.netns, "route", "del", "blackhole", f"{other.address}/32", check=False)
            self.blocked.discard(other.address)

    def counters(self) -> LinkCounters:
        """What this host sent and received so far (the outside veth's rx is the host's tx)."""
        stats = Path("/sys/class/net") / self.veth / "statistics"
        return LinkCounters(sent=int((stats / "rx_bytes").read_text()), received=int((stats / "tx_bytes").read_text()),
                            at=time.monotonic())


class LineReader:
    """Lines of a child's output pipe with a bound on each wait.  ``select`` on a buffered file object
    misses lines already in its buffer (two lines arrive in one read, the second waits forever): this
    reads the file descriptor itself and keeps the rest."""

    def __init__(self, pipe):
        self.fd = pipe.fileno()
        self.rest = b""

    def readline(self, timeout: float) -> str | None:
        """The next line (without its newline); "" at the end of the output; None after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.rest:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            data = os.read(self.fd, 65536)
            if not data:
                line, self.rest = self.rest, b""
                return line.decode(errors="replace")
            self.rest += data
        line, self.rest = self.rest.split(b"\n", 1)
        return line.decode(errors="replace") + "\n"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass


class EmulatedHosts:
    """``n`` emulated hosts on one bridge; a context manager (see the module doc).

    ``link_rate``: a tc rate for both directions of each host's link (None: unshaped);
    ``resolve``: what each host's own name resolves to (``"cluster"``, ``"loopback"``, ``"none"``; one value
    for all hosts, or one per host); ``work_dir``: where host folders go (a new temporary folder, removed
    at the end, when None).  Raises :class:`HostsError` when :func:`unavailable` says why not.
    """

    def __init__(self, n: int, *, link_rate: str | None = None, resolve: str | Sequence[str] = "cluster",
                 work_dir: str | os.PathLike | None = None, shm_mb: int = SHM_MB):
        if n < 1:
            raise ValueError(f"need at least 1 host, got {n}")
        resolves = [resolve] * n if isinstance(resolve, str) else list(resolve)
        if len(resolves) != n or any(r not in RESOLVE for r in resolves):
            raise ValueError(f"resolve must be one of {RESOLVE} or one per host, got {resolve!r}")
        self.rate_bits = None if link_rate is None else _rate_bits(link_rate)
        self.link_rate, self.resolves, self.n, self.shm_mb = link_rate, resolves, n, int(shm_mb)
        self.own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="graphfeed-hosts-"))
        _COUNTER[0] += 1
        self.prefix = f"gf{os.getpid()}-{_COUNTER[0]}"
        self.bridge = f"{self.prefix}br"
        self.hosts: list[Host] = []
        self.servers: list[ServerProcess] = []
        self.subnet = ""
        self._up = False

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    # ---- set-up ---------------------------------------------------------------------------------

    def start(self) -> "EmulatedHosts":
        reason = unavailable()
        if reason:
            raise HostsError(reason)
        sweep_stale()
        atexit.register(self.stop)
        self._up = True
        try:
            self.subnet = _free_subnet()
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.subnet}.{BRIDGE_HOST}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            self.hosts = [self._make_host(i) for i in range(self.n)]
            hosts_files = self._hosts_files()
            for host in self.hosts:
                self._start_init(host, hosts_files[host.index])
        except BaseException:
            self.stop()
            raise
        return self

    def _make_host(self, i: int) -> Host:
        host = Host(index=i, name=f"host{i}", address=f"{self.subnet}.{i + 1}", netns=f"{self.prefix}h{i}",
                    veth=f"{self.prefix}h{i}v", root=self.work_dir / f"host{i}")
        host.root.mkdir(parents=True, exist_ok=True)
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _run("ip", "link", "set", host.veth, "master", self.bridge)
        _run("ip", "link", "set", host.veth, "up")
        _run("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _run("ip", "-n", host.netns, "link", "set", "eth0", "up")
        _run("ip", "-n", host.netns, "link", "set", "lo", "up")
        if self.rate_bits is not None:
            self._shape(host)
        return host

    def _shape(self, host: Host) -> None:
        burst = max(32 * 1024, int((self.rate_bits or 0) / 8 / 250))   # bytes: 4 ms at the rate
        tbf = ("tbf", "rate", str(self.link_rate), "burst", str(burst), "latency", "50ms")
        _run("tc", "qdisc", "replace", "dev", host.veth, "root", *tbf)                        # into the host
        _run("ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf)  # out of it

    def _hosts_files(self) -> list[Path]:
        files = []
        for host in self.hosts:
            lines = ["127.0.0.1 localhost", "::1 localhost"]
            for other in self.hosts:
                if other is not host:
                    lines.append(f"{other.address} {other.name}")
                elif self.resolves[host.index] == "cluster":
                    lines.append(f"{host.address} {host.name}")
                elif self.resolves[host.index] == "loopback":
                    lines.append(f"{LOOPBACK_NAME_ADDRESS} {host.name}")
            path = host.root / "etc-hosts"
            path.write_text("\n".join(lines) + "\n")
            files.append(path)
        return files

    def _start_init(self, host: Host, hosts_file: Path) -> None:
        argv = ["ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child",
                "--mount-proc", "--propagation", "private", "sh", "-c", HOST_INIT, "sh", host.name, str(hosts_file),
                str(self.shm_mb)]
        host.init = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        out = host.init.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], SETUP_TIMEOUT_S)
        line = out.readline() if ready else b""
        if line.strip() != b"ready":
            _kill_group(host.init)
            err = host.init.stderr.read().decode(errors="replace").strip()   # type: ignore[union-attr]
            raise HostsError(f"{host.name} did not come up within {SETUP_TIMEOUT_S:g} s: {err or line!r}")
        host.pid1 = _only_child(host.init.pid)

    # ---- what runs on the hosts -------------------------------------------------------------------

    def copy_parts(self, host: Host, partition: str | os.PathLike, parts: Iterable[int]) -> Path:
        """Copy ``META.json`` and ``part_K`` of each of ``parts`` into the host's own folder (its own files,
        as on a separate machine: no inode is shared); returns that partition folder."""
        src, dst = Path(partition), host.root / "parts"
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / META_FILE, dst / META_FILE)
        for k in parts:
            if not (dst / f"part_{k}").exists():
                shutil.copytree(src / f"part_{k}", dst / f"part_{k}")
        return dst

    def start_server(self, host: Host, partition: str | os.PathLike, part: int, *,
                     log_dir: str | os.PathLike | None = None, **options) -> ServerProcess:
        """``graphfeed serve`` on ``host`` at its address, port 0; waits until SERVING (as
        :func:`graphfeed.testing.cluster.start_server`).  :meth:`stop` stops it unless the caller did."""
        options.setdefault("command", host.command(SERVE_COMMAND))
        options["host"] = host.address
        server = spawn_server(partition, part, log_dir if log_dir is not None else host.root / "logs",
                              ServeOptions(**options))
        self.servers.append(server)
        wait_ready(server)
        return server

    def heal(self) -> None:
        """Every link up, every block gone."""
        for host in self.hosts:
            host.link(True)
            for other in self.hosts:
                host.unblock(other)

    # ---- teardown -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every process on the hosts, then remove the namespaces, links and the bridge.  Idempotent."""
        if not self._up:
            return
        self._up = False
        atexit.unregister(self.stop)
        for server in self.servers:
            if server.proc.poll() is None:
                _kill_group(server.proc)
        for host in self.hosts:
            for proc in [*host.procs, *([host.init] if host.init else [])]:
                if proc.poll() is None:
                    _kill_group(proc)
            if host.pid1:
                try:
                    os.kill(host.pid1, signal.SIGKILL)   # pid 1 of the host: the kernel kills the rest
                except ProcessLookupError:
                    pass
        for proc in [s.proc for s in self.servers] + [p for h in self.hosts for p in h.procs + [h.init] if p]:
            try:
                proc.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for host in self.hosts:
            _run("ip", "netns", "del", host.netns, check=False)
            _run("ip", "link", "del", host.veth, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        if self.own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "EmulatedHosts":
        return self.start()

    def __exit__(self, *_) -> None:
        self.stop()


def _only_child(pid: int) -> int:
    """The child of ``pid`` (the host's first process, forked by ``unshare``)."""
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.02)
    raise HostsError(f"the first process of an emulated host (child of pid {pid}) did not appear")


def check_available() -> None:
    """ClusterError naming why emulated hosts cannot be made here (for command-line tools)."""
    reason = unavailable()
    if reason:
        raise ClusterError(reason)
