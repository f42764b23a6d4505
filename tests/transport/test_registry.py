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


def test_a_daemon_serves_the_authenticated_path_by_default_and_torch_rpc_only_by_name():
    assert registry.served(registry.AUTO).name == registry.SECURED_DEFAULT == registry.SECURE
    assert registry.served(registry.AUTO).authenticated
    assert registry.served(registry.TORCH_RPC).name == registry.TORCH_RPC
    assert not registry.served(registry.TORCH_RPC).authenticated
    assert registry.data_path(registry.TRUSTED_DEFAULT).needs_rendezvous
    assert registry.data_path(registry.SECURED_DEFAULT).joins_peers


def test_a_trainer_on_auto_forms_the_authenticated_path():
    assert registry.agreed([("a:1 part 0", registry.SECURE), ("a:2 part 1", "")]).name == registry.SECURE
    assert registry.agreed([("a:1 part 0", "")]).name == registry.SECURE     # an older server: ask for secure
    assert registry.agreed([]).name == registry.SECURE


@pytest.mark.parametrize("credentials, holder", [
    (True, "this client holds a token or TLS material and never follows a server to a weaker transport"),
    (False, "a client on transport='auto' forms only"),
])
def test_a_trainer_on_auto_never_follows_a_server_to_torch_rpc(credentials, holder):
    offers = [("10.0.0.1:50051 part 0", registry.SECURE), ("10.0.0.2:50051 part 1", registry.TORCH_RPC)]
    with pytest.raises(registry.DowngradeRefused) as caught:
        registry.agreed(offers, credentials=credentials)
    assert caught.value.server == "10.0.0.2:50051 part 1"
    text = str(caught.value)
    assert "offers data path 'torch-rpc'" in text and holder in text
    assert "connect(..., transport='torch-rpc')" in text and "data_path: auto" in text


def test_connect_transport_names_a_route():
    assert registry.route(registry.AUTO) == registry.Route(registry.AUTO, registry.SHM)
    assert registry.route(registry.SHM) == registry.Route(registry.AUTO, registry.SHM)
    for name in registry.names():
        assert registry.route(name) == registry.Route(name, registry.SHM)   # same-host pulls: shared memory
    with pytest.raises(ValueError, match="transport must be 'auto', "):
        registry.route("rpc")
    assert registry.route(registry.SECURE).network_only() == registry.Route(registry.SECURE, None)
