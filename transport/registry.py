"""The data path's transports by name: the one place their names are spelled.

Two kinds of entry, each one module that the registry imports on first use (so naming them costs nothing:
``graphfeed serve --help`` and config checks list the names without loading torch or the ciphers):

* **data paths** (:class:`~graphfeed.transport.path.DataPath`): how a trainer group's workers and its trainer
  reach each other -- every call, and the pulls a pull channel does not carry.  Their names are the wire
  values of ``OpenGroup.data_path``, a daemon's ``data_path`` setting and ``--data-path``.
* **pull channels** (:class:`~graphfeed.transport.path.PullChannel`): a way to pull batches over a data
  path's calls (``shm``: shared memory with the servers on this host).

A daemon asks :func:`served` which data path it serves, a worker and a trainer ask :func:`data_path` for the
object of a name; :func:`route` reads a trainer's ``connect(transport=...)`` and :func:`agreed` what a trainer
on ``auto`` forms.  The authenticated path is the default on both ends; one that is not (torch RPC) runs only
when the daemon's ``data_path`` and the trainer's ``transport=`` both name it -- a trainer never follows a server
to it.  Adding a transport is one module exposing ``PATH`` (a :class:`DataPath`) or ``CHANNEL`` (a
:class:`PullChannel`), one :func:`register` line below, and its tests.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:   # the entries' classes; the modules are imported by name on first use (below)
    from graphfeed.transport.path import DataPath, PullChannel

AUTO = "auto"            # a daemon: the authenticated default; a trainer: the servers' authenticated path
TORCH_RPC = "torch-rpc"
SECURE = "secure"
SHM = "shm"

SECURED_DEFAULT = SECURE      # what "auto" serves and forms, with or without a token or TLS
TRUSTED_DEFAULT = TORCH_RPC   # the trusted-network path: served and formed only when named on both ends
PULLS_DEFAULT = SHM           # how a trainer pulls from the servers on its host unless it names a data path

_PATHS: dict[str, str] = {}      # data path name -> its module (holding PATH)
_CHANNELS: dict[str, str] = {}   # pull channel name -> its module (holding CHANNEL)


def register(name: str, module: str, *, pulls: bool = False) -> None:
    """Enter ``module``'s ``PATH`` (or, ``pulls``, its ``CHANNEL``) under ``name``."""
    if name == AUTO or name in _PATHS or name in _CHANNELS:
        raise ValueError(f"a transport named {name!r} is already registered")
    (_CHANNELS if pulls else _PATHS)[name] = module


register(TORCH_RPC, "graphfeed.transport.torch_rpc")
register(SECURE, "graphfeed.transport.secure.path")
register(SHM, "graphfeed.transport.shm", pulls=True)


def names() -> tuple[str, ...]:
    """The data paths' names (the values of ``OpenGroup.data_path``)."""
    return tuple(_PATHS)


def choices() -> tuple[str, ...]:
    """A daemon's ``data_path`` choices: ``auto`` and every data path."""
    return (AUTO, *_PATHS)


def connect_choices() -> tuple[str, ...]:
    """A trainer's ``connect(transport=...)`` choices: ``auto``, every data path and every pull channel."""
    return (AUTO, *_PATHS, *_CHANNELS)


def listed(values: Iterable[str]) -> str:
    """``'a', 'b' or 'c'`` for a message."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _entry(table: dict[str, str], name: str, attribute: str):
    try:
        module = table[name]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}: give {listed(table)}") from None
    entry = getattr(importlib.import_module(module), attribute)
    entry.name = name
    return entry


def data_path(name: str) -> DataPath:
    """The data path called ``name``; ValueError naming the known ones."""
    return _entry(_PATHS, name, "PATH")


def pull_channel(name: str) -> PullChannel:
    """The pull channel called ``name``; ValueError naming the known ones."""
    return _entry(_CHANNELS, name, "CHANNEL")


def served(choice: str) -> DataPath:
    """The data path a daemon serves for its ``data_path`` setting ``choice``: ``auto`` is the authenticated
    default whether or not the daemon has a token or TLS (without a token the group key from ``OpenGroup``
    still guards every connection, and nothing is unpickled); a path that is not authenticated only by name."""
    return data_path(SECURED_DEFAULT if choice == AUTO else choice)


class DowngradeRefused(RuntimeError):
    """A trainer on ``auto`` was offered a data path weaker than the authenticated one; ``server`` names who."""

    def __init__(self, server: str, message: str):
        super().__init__(message)
        self.server, self.message = server, message


def agreed(offers: Iterable[tuple[str, str]], *, credentials: bool = False) -> DataPath:
    """The data path a trainer on ``auto`` forms with servers that offer ``offers`` ((server name,
    ``ClusterInfo.data_path``) pairs; "" from older servers): the authenticated one.  A server that offers a
    path that is not authenticated is never followed (:class:`DowngradeRefused` names it, what it offered and
    how to ask for that path by name): whatever answers on a control port must not be able to make a trainer
    open unpickling listeners.  ``credentials``: the trainer holds a token or TLS material (said in the error)."""
    for server, asked in offers:
        if asked in _PATHS and not data_path(asked).authenticated:
            raise DowngradeRefused(server, _downgrade_message(asked, credentials))
    return data_path(SECURED_DEFAULT)


def _downgrade_message(asked: str, credentials: bool) -> str:
    path = data_path(asked)
    holder = ("this client holds a token or TLS material and never follows a server to a weaker transport"
              if credentials else f"a client on transport={AUTO!r} forms only {data_path(SECURED_DEFAULT).label}")
    return (f"the server offers data path {asked!r} ({path.label}: not authenticated, it unpickles every request "
            f"before any check), and {holder}; refused.  Serve the default (data_path: {AUTO} or "
            f"{SECURED_DEFAULT}) on the servers, or, on a trusted network only, ask for it by name: "
            f"connect(..., transport={asked!r})")


@dataclass(frozen=True)
class Route:
    """What a trainer asked for: a data path (``auto``: the authenticated one, :func:`agreed`) and how it pulls
    batches (a pull channel's name, or None: every pull over the data path)."""

    data_path: str = AUTO
    pulls: str | None = PULLS_DEFAULT

    def network_only(self) -> Route:
        """The same data path with every pull over it (no pull channel)."""
        return Route(self.data_path, None)


def route(transport: str) -> Route:
    """A trainer's ``transport=``: ``auto`` (the authenticated data path the servers serve), a data path (that
    one), or a pull channel (the servers' authenticated data path, pulls from servers on this host through that
    channel).  Pulls from servers on this host go through :data:`PULLS_DEFAULT` unless a pull channel is named
    (``connect(shm_slots=0)`` turns shared memory off: :meth:`Route.network_only`)."""
    if transport == AUTO:
        return Route()
    if transport in _CHANNELS:
        return Route(AUTO, transport)
    if transport in _PATHS:
        return Route(transport, PULLS_DEFAULT)
    raise ValueError(f"transport must be {listed(connect_choices())}, got {transport!r}")
