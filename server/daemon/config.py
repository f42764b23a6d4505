"""Server configuration: one schema, validated once into a frozen :class:`ServerConfig`.

Sources, lowest precedence first::

    defaults  <  YAML file (--config / GRAPHFEED_CONFIG)  <  GRAPHFEED_<KEY> env vars  <  command-line flags

Example file (every key optional except ``partition`` and ``part``)::

    partition: /srv/graph/products-2p
    part: 0
    host: 0.0.0.0
    port: 50051
    lease_seconds: 15
    buffer_bytes: 256MiB
    device: cuda:0                              # sample on this GPU (default cpu)
    gpu_cache_bytes: 4GiB                       # GPU memory for the hottest feature rows
    log_format: json
    tls_cert: /etc/graphfeed/tls/server.crt     # TLS on the gRPC port (with tls_key)
    tls_key: /etc/graphfeed/tls/server.key
    tls_client_ca: /etc/graphfeed/tls/ca.crt    # optional: require client certificates (mTLS)
    token_file: /etc/graphfeed/token            # bearer token every control call must carry
    max_batch_bytes: 512MiB                     # work caps of one batch (0 = derived from memory)

Unknown keys are errors naming the key; a wrong type or range names the key, the
source it came from and what is expected.  Raises :class:`ConfigError`.
"""
from __future__ import annotations

import ipaddress
import math
import os
import re
import string
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from graphfeed.server.sampling.budget import WorkBudget
from graphfeed.server.worker import memory
from graphfeed.server.worker.settings import WorkerSettings
from graphfeed.transport import registry

if TYPE_CHECKING:
    from graphfeed.transport.path import DataPath

ENV_PREFIX = "GRAPHFEED_"
CONFIG_ENV = "GRAPHFEED_CONFIG"
LOG_FORMATS = ("logfmt", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_PORT = 65535
MIN_TOKEN_LENGTH = 16
MIN_TOKEN_DISTINCT = 5     # distinct characters a token needs (refuses aaaa..., 1212...); a random 16-character
#                            hex token has fewer than 5 about twice in a million draws
MIN_TOKEN_BITS = 50.0      # estimated entropy a token needs: length x log2(size of the alphabet it is drawn from)
DEFAULT_MAX_HOPS = 10
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20   # ~8M explicit node ids; splits and link splits are named, not sent
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")
# Words of example tokens in documentation and manifests: such a token is refused, never served with.
PLACEHOLDER_WORDS = ("replace-me", "replace_me", "replaceme", "changeme", "change-me", "placeholder", "example",
                     "your-token", "xxxxxxxx")
SECRET_KEYS = frozenset({"token", "admin_token", "tokens"})   # values never echoed in errors, summaries or reprs



class ConfigError(ValueError):
    """The configuration is invalid; the message names the key, its source and the fix."""


@dataclass(frozen=True)
class ServerConfig(WorkerSettings):
    """Validated daemon settings (units in the names: seconds, bytes): the :class:`WorkerSettings` its session
    workers read (declared there, inherited as flat keys) and the daemon's own."""

    partition: str                     # partition folder (META.json inside)
    part: int                          # the part this daemon serves
    host: str = "127.0.0.1"            # control-plane (gRPC) bind address
    port: int = 50051                  # control-plane port; 0 = any free port
    data_address: str = ""             # interface the torch RPC data path binds to ("" = host)
    # CIDRs a worker may dial as its peers (JoinGroup's endpoints); () = the data address's own network
    peer_networks: tuple[str, ...] = ()
    metrics_port: int | None = None    # Prometheus HTTP port (None = off)
    lease_seconds: float = 15.0        # a group without Heartbeat for this long is reaped
    drain_grace_seconds: float = 20.0  # on SIGTERM, wait this long for open groups to close
    max_groups: int = 16               # trainer groups (session worker processes) at once
    max_sessions_per_group: int = 16   # loaders per trainer group
    call_timeout: float = 60.0         # bound on every daemon -> worker command (open_session, stats, ...)
    # bound on a session worker's start in OpenGroup (a process importing torch and mapping the part: tens of
    # seconds when many start at once on a busy host); trainers learn it from ClusterInfo and wait longer
    worker_start_seconds: float = 120.0
    # session workers started at once (0 = the CPUs this daemon may use); more OpenGroups wait their turn, in order,
    # within worker_start_seconds: a burst of trainers then connects one after another instead of every start
    # sharing the CPUs until all of them pass the bound together
    worker_starts: int = 0
    # session workers kept started ahead of their groups (torch imported, ~0.25 GB each): an OpenGroup -- a
    # trainer's connect, or its move to another replica of a part -- then skips the process start and imports
    warm_workers: int = 0
    max_hops: int = DEFAULT_MAX_HOPS   # a loader's hops at most
    max_batch_nodes: int = 0           # sampled nodes of one batch at most (0 = max_batch_bytes / 64)
    max_batch_edges: int = 0           # sampled edges of one batch at most (0 = max_batch_bytes / 32)
    max_batch_bytes: int = 0           # bytes of one batch at most (0 = 1/8 of the memory limit, 256 MiB..4 GiB)
    loader_memory: int = 0             # what one loader's session worker may hold (0 = 1/2 of the memory limit, or
    #                                    the host's available memory when less; see budget.Footprint)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES   # largest control request accepted (refused unread)
    session_idle_seconds: float = 600.0  # a session without StartEpoch/pull/sample this long is closed (0 = never)
    log_format: str = "logfmt"         # "logfmt" | "json"
    log_level: str = "info"            # "debug" | "info" | "warning" | "error"
    tls_cert: str | None = None        # PEM server certificate (chain): TLS on the control port
    tls_key: str | None = None         # PEM private key of tls_cert (both or neither)
    tls_client_ca: str | None = None   # PEM CA bundle: clients must present a certificate it signed (mTLS)
    tls_peer_ca: str | None = None     # PEM CA bundle that signed the other daemons' tls_cert: workers check peers
    token: str | None = field(default=None, repr=False)  # bearer token on every control call (never logged)
    token_file: str | None = None      # file holding the token (read once at load; exclusive with token)
    # the operators' token: passes like the token, and GetStats shows it every trainer group (a trainer's
    # token sees only the groups it opened); needs token, must differ from it
    admin_token: str | None = field(default=None, repr=False)
    admin_token_file: str | None = None   # file holding the admin token (exclusive with admin_token)
    # one token per team (team name -> token): a caller's team is the token it holds, and its jobs' embedding
    # checkpoints live under embedding_dir/<team>/<job>; passes beside (or instead of) token
    tokens: dict[str, str] | None = field(default=None, repr=False)
    tokens_file: str | None = None     # file of "team: token" lines read into tokens (exclusive with tokens)
    # the data path (graphfeed.transport.registry): "auto" = the authenticated one, with or without a token or
    # TLS; or a data path's name (torch RPC only so, for trusted networks; refused with a token or TLS)
    data_path: str = registry.AUTO

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def data_transport(self) -> DataPath:
        """The data path this daemon's workers serve (``data_path``; ``auto``: the authenticated one)."""
        return registry.served(self.data_path)

    @property
    def authenticates(self) -> bool:
        """Whether control calls need a token (the trainers' ``token`` or a team's of ``tokens``)."""
        return bool(self.token or self.tokens)

    @property
    def effective_data_address(self) -> str:
        return self.data_address or self.host

    @property
    def work_budget(self) -> WorkBudget:
        """The caps of one batch (``max_batch_*`` are resolved at load: never 0 here)."""
        return WorkBudget(max_hops=self.max_hops, max_nodes=self.max_batch_nodes, max_edges=self.max_batch_edges,
                          max_bytes=self.max_batch_bytes, max_seconds=BATCH_TIME_SHARE * self.rpc_timeout)

    def summary(self) -> str:
        return (f"partition={self.partition} part={self.part} host={self.host} port={self.port} "
                f"data_address={self.effective_data_address} lease_seconds={self.lease_seconds:g} "
                f"device={self.device} tls={'mtls' if self.tls_client_ca else 'on' if self.tls else 'off'} "
                f"token={'on' if self.token else 'off'} teams={len(self.tokens or {})} "
                f"data_path={self.data_transport.name}")


# ---- per-key parsing: each returns the value or raises ValueError("expected ...") -----------------

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _int(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    expect = f"an integer {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    def parse(v):
        if isinstance(v, str):
            v = v.strip()
            if not re.fullmatch(r"-?\d+", v):
                raise ValueError(f"expected {expect}")
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise ValueError(f"expected {expect}")
        return v
    return parse


def _seconds(lo: float, hi: float, allow_zero: bool = False) -> Callable[[Any], float]:
    expect = f"a number of seconds {'>= 0' if allow_zero else '> 0'} and <= {hi:g}"

    def parse(v):
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise ValueError(f"expected {expect}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise ValueError(f"expected {expect}")
        if v > hi or v < lo or (v == 0 and not allow_zero):
            raise ValueError(f"expected {expect}")
        return float(v)
    return parse


def _bytes(v, lo: int = 1) -> int:
    """An integer byte count or a size string like ``256MiB``."""
    expect = f"a byte count >= {lo}: an integer or a size like 256MiB / 1GiB"
    if isinstance(v, str):
        m = _SIZE.match(v)
        if not m:
            raise ValueError(f"expected {expect}")
        v = int(m.group(1)) * _UNITS[(m.group(2) or "")[:1].lower()]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"expected {expect}")
    return v


def _bytes_or_auto(v) -> int:
    """A byte count, or 0: derived from the memory limit at load."""
    return _bytes(v, lo=0)


def _string(allow_empty: bool = False) -> Callable[[Any], str]:
    def parse(v):
        if not isinstance(v, str) or (not allow_empty and not v.strip()):
            raise ValueError("expected a non-empty string")
        return v.strip()
    return parse


def _flag(v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return v.strip().lower() in ("true", "yes", "on", "1")
    raise ValueError("expected true or false")


def _networks(v) -> tuple[str, ...]:
    """IP networks in CIDR form: a list, or one comma-separated string ("" = none)."""
    items = v.split(",") if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)):
        raise ValueError("expected CIDR networks: a list or a comma-separated string like 10.0.0.0/16,fd00::/64")
    out = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        try:
            out.append(str(ipaddress.ip_network(text, strict=False)))
        except ValueError:
            raise ValueError(f"{text!r} is not a network in CIDR form (like 10.0.0.0/16)") from None
    return tuple(out)


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(v):
        if not isinstance(v, str) or v.strip().lower() not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return v.strip().lower()
    return parse


def _optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse(v):
        if v is None or (isinstance(v, str) and v.strip().lower() in ("", "null", "none", "off")):
            return None
        return inner(v)
    return parse


def _pem_file(what: str, marker: bytes) -> Callable[[Any], str]:
    """A readable file holding a PEM block (``marker`` is part of its BEGIN line); the absolute path."""
    def parse(v):
        p = Path(_string()(v)).expanduser().absolute()
        text = _read_bytes(p, what)
        if marker not in text:
            raise ValueError(f"{p} is not a PEM {what}: it has no '-----BEGIN ...{marker.decode()}' line")
        return str(p)
    return parse


def _read_bytes(p: Path, what: str) -> bytes:
    if not p.is_file():
        raise ValueError(f"expected a readable {what} file; {p} does not exist or is not a file")
    try:
        return p.read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} file {p} cannot be read: {exc.strerror or exc}") from None


def _token(v) -> str:
    """A bearer token: printable ASCII without spaces (it travels in an HTTP/2 header), long enough."""
    if not isinstance(v, str):
        raise ValueError("expected a string token")
    v = v.strip()
    if len(v) < MIN_TOKEN_LENGTH or not all(33 <= ord(c) <= 126 for c in v):
        raise ValueError(f"expected at least {MIN_TOKEN_LENGTH} printable ASCII characters without spaces "
                         f"(e.g. the output of `openssl rand -hex 32`)")
    if any(word in v.lower() for word in PLACEHOLDER_WORDS):
        raise ValueError("expected a real secret, got the placeholder of an example: generate one with "
                         "`openssl rand -hex 32`")
    if len(set(v)) < MIN_TOKEN_DISTINCT or _token_bits(v) < MIN_TOKEN_BITS or _repeats(v) or _guessable(v):
        raise ValueError(f"expected a random secret: a token needs at least {MIN_TOKEN_DISTINCT} distinct characters "
                         f"and {MIN_TOKEN_BITS:g} bits of estimated entropy (length x log2(alphabet): 16 for hex, "
                         f"36 for lowercase and digits, ...), no repeated pattern, and must not be a common word "
                         f"followed by digits; generate one with `openssl rand -hex 32`")
    return v


_GUESSABLE = re.compile(r"^(password|passwd|secret|token|admin|letmein|qwerty|graphfeed|abc|test)[\W_]*\d*[\W_]*$",
                        re.IGNORECASE)


def _token_bits(token: str) -> float:
    """Entropy of a token as if each character were drawn at random from the alphabet its character classes
    make up (hex digits count 16, not 36: the output of ``openssl rand -hex``)."""
    if all(c in string.hexdigits for c in token) and (token.islower() or token.isupper() or token.isdigit()):
        alphabet = 16
    else:
        classes = (string.digits, string.ascii_lowercase, string.ascii_uppercase, string.punctuation)
        alphabet = sum(len(chars) for chars in classes if any(c in chars for c in token))
    return len(token) * math.log2(alphabet)


def _repeats(token: str) -> bool:
    """Whether the token is a shorter unit written at least twice (``abcdeabcdeabcdea``)."""
    return any(token == (token[:p] * (len(token) // p + 1))[:len(token)] for p in range(1, len(token) // 2 + 1))


def _guessable(token: str) -> bool:
    """A dictionary word plus digits (``password12345678``), or a run of one keyboard row / alphabet."""
    runs = ("abcdefghijklmnopqrstuvwxyz", "0123456789abcdef", "0123456789", "qwertyuiop", "asdfghjkl", "zxcvbnm")
    low = token.lower()
    return bool(_GUESSABLE.match(token)) or any(low in r * 4 for r in runs)


TEAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _teams(v) -> dict[str, str]:
    """Team tokens: a mapping, or text of ``team: token`` lines (``#`` comments); each token a random secret,
    no two teams with one token."""
    if isinstance(v, str):
        pairs = [line.split(":", 1) for line in v.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if any(len(p) != 2 for p in pairs):
            raise ValueError("expected 'team: token' lines")
        v = {team.strip(): token.strip() for team, token in pairs}
    if not isinstance(v, dict) or not v:
        raise ValueError("expected a mapping of team names to tokens (or 'team: token' lines)")
    out = {}
    for team, token in v.items():
        if not isinstance(team, str) or not TEAM_NAME.fullmatch(team):
            raise ValueError(f"expected team names of 1-64 letters, digits, '.', '_', '-', got {str(team)[:40]!r}")
        try:
            out[team] = _token(token)
        except ValueError as exc:
            raise ValueError(f"team {team!r}: {exc}") from None
    if len(set(out.values())) != len(out):
        raise ValueError("expected one token per team: two teams hold the same token")
    return out


def _token_file(v) -> str:
    p = Path(_string()(v)).expanduser().absolute()
    _read_bytes(p, "token")
    return str(p)


def _device(v) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` (whether this host has that GPU is checked at startup)."""
    if not isinstance(v, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", v.strip().lower()):
        raise ValueError("expected cpu, cuda or cuda:N")
    return v.strip().lower()


PARSERS: dict[str, Callable[[Any], Any]] = {
    "partition": _string(),
    "part": _int(0),
    "host": _string(),
    "port": _int(0, MAX_PORT),
    "data_address": _string(allow_empty=True),
    "peer_networks": _networks,
    "metrics_port": _optional(_int(0, MAX_PORT)),
    "lease_seconds": _seconds(0.0, 86400.0),
    "drain_grace_seconds": _seconds(0.0, 86400.0, allow_zero=True),
    "max_groups": _int(1, 4096),
    "max_sessions_per_group": _int(1, 4096),
    "num_producers": _int(1, 256),
    "buffer_batches": _int(1, 1 << 20),
    "buffer_bytes": _bytes,
    "rpc_timeout": _seconds(0.0, 86400.0),
    "peer_timeout": _seconds(0.0, 86400.0, allow_zero=True),
    "join_timeout": _seconds(0.0, 86400.0),
    "colocated_reads": _flag,
    "peer_cache_bytes": _bytes_or_auto,
    "device": _device,
    "gpu_cache_bytes": _bytes,
    "gpu_topology": _choice(("auto", "gpu", "uva")),
    "call_timeout": _seconds(0.0, 86400.0),
    "worker_start_seconds": _seconds(0.0, 3600.0),
    "worker_starts": _int(0, 4096),
    "warm_workers": _int(0, 64),
    "max_hops": _int(1, 1000),
    "max_batch_nodes": _int(0),
    "max_batch_edges": _int(0),
    "max_batch_bytes": _bytes_or_auto,
    "max_message_bytes": _bytes,
    "loader_memory": _bytes_or_auto,
    "session_idle_seconds": _seconds(0.0, 7 * 86400.0, allow_zero=True),
    "log_format": _choice(LOG_FORMATS),
    "log_level": _choice(LOG_LEVELS),
    "tls_cert": _optional(_pem_file("certificate", b"CERTIFICATE-----")),
    "tls_key": _optional(_pem_file("private key", b"PRIVATE KEY-----")),
    "tls_client_ca": _optional(_pem_file("CA certificate", b"CERTIFICATE-----")),
    "tls_peer_ca": _optional(_pem_file("CA certificate", b"CERTIFICATE-----")),
    "token": _optional(_token),
    "token_file": _optional(_token_file),
    "admin_token": _optional(_token),
    "admin_token_file": _optional(_token_file),
    "tokens": _optional(_teams),
    "tokens_file": _optional(_token_file),
    "data_path": _choice(registry.choices()),
    "embedding_dir": _string(allow_empty=True),
    "embedding_bytes": _bytes_or_auto,
    "embedding_log": _flag,
    "data_handshake_timeout": _seconds(0.0, 3600.0),
    "data_handshakes": _int(1, 1 << 16),
    "data_handshakes_per_source": _int(1, 1 << 16),
    "data_connections": _int(1, 1 << 16),
    "data_call_bytes": _bytes,
}
KEYS = tuple(f.name for f in fields(ServerConfig))
REQUIRED = ("partition", "part")
assert set(PARSERS) == set(KEYS), "every ServerConfig field needs a parser"


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


# ---- sources --------------------------------------------------------------------------------------

def read_file(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a YAML config file (unparsed values); raises :class:`ConfigError`."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of key: value, got {type(data).__name__}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigError(f"config file {path}: unknown key {unknown[0]!r} (known keys: {', '.join(KEYS)})")
    return dict(data)


def read_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Values of ``GRAPHFEED_<KEY>`` for the known keys (other GRAPHFEED_* variables are not ours)."""
    return {k: environ[env_name(k)] for k in KEYS if env_name(k) in environ}


def _validate(raw: dict[str, Any], origin: dict[str, str]) -> ServerConfig:
    values = {}
    for key, value in raw.items():
        try:
            values[key] = PARSERS[key](value)
        except ValueError as exc:
            shown = "<redacted>" if key in SECRET_KEYS else repr(value)
            raise ConfigError(f"{origin[key]}: {key} = {shown} is invalid: {exc}") from None
    _check_security(values, origin)
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        k = missing[0]
        raise ConfigError(f"missing required setting {k!r}: set it in the config file, "
                          f"with {env_name(k)} or with --{k.replace('_', '-')}")
    _check_exposure(values, origin)
    _resolve_budget(values)
    return ServerConfig(**values)


def _check_exposure(values: dict[str, Any], origin: dict[str, str]) -> None:
    """A wildcard control host needs an explicit data address: the data path must not bind to whatever the
    host name happens to resolve to."""
    host = values.get("host", ServerConfig.host)
    if host.strip() in WILDCARD_HOSTS and not values.get("data_address", "").strip():
        raise ConfigError(f"{origin.get('host', 'host')}: host = {host!r} listens on every interface, so "
                          f"data_address must say which one the data path binds to and advertises: set "
                          f"data_address to this host's address on the trainers' network (e.g. 10.0.0.5)")


def memory_limit() -> int:
    """Bytes this process may use: its own cgroup's limit (v2, then v1; from ``/proc/self/cgroup``) when set,
    else the host's memory (:func:`graphfeed.server.worker.memory.memory_limit`)."""
    return memory.memory_limit().bytes


BATCH_BYTES_MIN, BATCH_BYTES_MAX = 256 << 20, 4 << 30
BATCH_TIME_SHARE = 0.75   # of rpc_timeout: how long producing one batch may take (WorkBudget.max_seconds)


def _resolve_budget(values: dict[str, Any]) -> None:
    """Fill the work caps left at 0 (auto): a batch at most 1/8 of the memory limit (256 MiB..4 GiB),
    1 node per 64 and 1 edge per 32 of its bytes (the sampler's working set per node / edge)."""
    if not values.get("max_batch_bytes"):
        values["max_batch_bytes"] = min(BATCH_BYTES_MAX, max(BATCH_BYTES_MIN, memory_limit() // 8))
    if not values.get("max_batch_nodes"):
        values["max_batch_nodes"] = values["max_batch_bytes"] // 64
    if not values.get("max_batch_edges"):
        values["max_batch_edges"] = values["max_batch_bytes"] // 32
    if not values.get("embedding_bytes"):   # a group's embedding tables on this server
        values["embedding_bytes"] = memory_limit() // 4


def _check_security(values: dict[str, Any], origin: dict[str, str]) -> None:
    """Cross-key rules of the TLS/token settings; reads ``token_file`` into ``token``."""
    cert, key = values.get("tls_cert"), values.get("tls_key")
    if (cert is None) != (key is None):
        have, lack = ("tls_cert", "tls_key") if cert is not None else ("tls_key", "tls_cert")
        raise ConfigError(f"{origin[have]}: {have} is set but {lack} is not: TLS needs both the certificate "
                          f"and its private key (set {lack}, or neither)")
    if values.get("tls_client_ca") is not None and cert is None:
        raise ConfigError(f"{origin['tls_client_ca']}: tls_client_ca (mTLS) needs TLS: set tls_cert and tls_key too")
    if values.get("tls_peer_ca") is not None and cert is None:
        raise ConfigError(f"{origin['tls_peer_ca']}: tls_peer_ca (checking the other daemons' data-path "
                          f"certificates) needs TLS: set tls_cert and tls_key too")
    for key in ("token", "admin_token"):
        _read_token_file(values, origin, key)
    _read_token_file(values, origin, "tokens", _teams)
    trainers = [values["token"]] if values.get("token") is not None else []
    trainers += list((values.get("tokens") or {}).values())
    if values.get("token") is not None and values["token"] in trainers[1:]:
        raise ConfigError(f"{origin['tokens']}: a team holds the trainers' token: its callers could not be told "
                          f"apart; give every team a token of its own")
    if values.get("admin_token") is not None:
        if not trainers:
            raise ConfigError(f"{origin['admin_token']}: admin_token needs token: without a trainers' token every "
                              f"caller is let in, so there is nothing for the admin token to see beyond; set token "
                              f"(or token_file, or tokens_file) too")
        if values["admin_token"] in trainers:
            raise ConfigError(f"{origin['admin_token']}: admin_token equals token (or a team's): every trainer "
                              f"holding it would see every job's groups; give the operators a token of their own")
    choice = values.get("data_path", registry.AUTO)
    if (choice != registry.AUTO and not registry.data_path(choice).authenticated
            and (cert is not None or values.get("token") is not None or values.get("tokens"))):
        raise ConfigError(f"{origin['data_path']}: data_path = {choice!r} with a token or TLS configured: "
                          f"{registry.data_path(choice).label} is not authenticated (it unpickles every request "
                          f"before any check), so it would undo them; use data_path {registry.AUTO!r} or "
                          f"{registry.SECURED_DEFAULT!r} (the authenticated data path), or drop the token and TLS "
                          f"on a trusted network")


def _read_token_file(values: dict[str, Any], origin: dict[str, str], key: str,
                     parse: Callable[[Any], Any] = _token) -> None:
    """``<key>_file`` read into ``key`` with ``parse`` (the two are exclusive)."""
    file_key = f"{key}_file"
    if values.get(key) is not None and values.get(file_key) is not None:
        raise ConfigError(f"both {key} ({origin[key]}) and {file_key} ({origin[file_key]}) are set: give only one")
    if values.get(file_key) is not None:
        path = values[file_key]
        try:
            values[key] = parse(Path(path).read_text(errors="replace"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{origin[file_key]}: {file_key} {path} holds no usable token: {exc}") from None
        origin[key] = origin[file_key]


def token_file_exposure(path: str | None) -> str | None:
    """A warning when the token file may be read by its group or by others (mode 0640, 0644, ...)."""
    if path is None:
        return None
    try:
        mode = Path(path).stat().st_mode & 0o777
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (f"token_file {path} has mode {mode:04o}: its group or other users can read the token; "
            f"run `chmod 600 {path}` (owned by the user the server runs as)")


def load_config(file: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None,
                flags: Mapping[str, Any] | None = None) -> ServerConfig:
    """Merge the sources (defaults < file < env < flags) and validate once.

    ``flags`` holds only the options given on the command line (``None`` values are
    ignored).  ``file`` defaults to ``$GRAPHFEED_CONFIG`` when set.
    """
    environ = os.environ if environ is None else environ
    file = file if file is not None else environ.get(CONFIG_ENV) or None
    raw: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if file is not None:
        for k, v in read_file(file).items():
            raw[k], origin[k] = v, f"config file {file}"
    for k, v in read_env(environ).items():
        raw[k], origin[k] = v, f"environment variable {env_name(k)}"
    for k, v in (flags or {}).items():
        if v is None:
            continue
        if k not in KEYS:
            raise ConfigError(f"unknown setting {k!r} (known keys: {', '.join(KEYS)})")
        raw[k], origin[k] = v, f"flag --{k.replace('_', '-')}"
    return _validate(raw, origin)
