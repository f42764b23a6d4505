"""The transport registry: names, what a daemon serves, what a trainer forms, and what connect(transport=) means."""
from __future__ import annotations

import pytest

from graphfeed.transport import registry


def test_every_registered_name_resolves_to_an_entry_of_that_name():
    assert registry.choices() == (registry.AUTO, *registry.names())
    for name in registry.names():
        path = registry.data_path(name)
        assert path.name == name and path.label
    shm = registry.pull_channel(registry.SHM)
    assert shm.name == registry.SHM
    with pytest.raises(ValueError, match="unknown transport 'carrier-pigeon'"):
        registry.data_path("carrier-pigeon")


def test_a_daemon_serves_the_authenticated_path_when_secured_and_refuses_nothing_else_by_name():
    assert registry.served(registry.AUTO, secured=False).name == registry.TRUSTED_DEFAULT
    assert registry.served(registry.AUTO, secured=True).name == registry.SECURED_DEFAULT
    assert registry.served(registry.AUTO, secured=True).authenticated
    assert not registry.served(registry.AUTO, secured=False).authenticated
    assert registry.data_path(registry.TRUSTED_DEFAULT).needs_rendezvous
    assert registry.data_path(registry.SECURED_DEFAULT).joins_peers


def test_a_trainer_forms_the_authenticated_path_when_any_server_asks_for_it():
    assert registry.agreed(["", registry.TORCH_RPC]).name == registry.TRUSTED_DEFAULT
    assert registry.agreed([registry.TORCH_RPC, registry.SECURE]).name == registry.SECURE
    assert registry.agreed([]).name == registry.TRUSTED_DEFAULT


def test_connect_transport_names_a_route():
    assert registry.route(registry.AUTO) == registry.Route(registry.AUTO, registry.SHM)
    assert registry.route(registry.SHM) == registry.Route(registry.AUTO, registry.SHM)
    for name in registry.names():
        assert registry.route(name) == registry.Route(name, registry.SHM)   # same-host pulls: shared memory
    with pytest.raises(ValueError, match="transport must be 'auto', "):
        registry.route("rpc")
    assert registry.route(registry.SECURE).network_only() == registry.Route(registry.SECURE, None)
