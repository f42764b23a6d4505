"""rpc_group.pin_interfaces: graphfeed's own interface pins follow the group's address; the operator's stay."""
import pytest

from graphfeed.transport import rpc_group

VARS = rpc_group.IFNAME_VARIABLES


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(rpc_group, "_OUR_PINS", {})


def test_a_pin_for_loopback_is_not_carried_to_a_group_elsewhere():
    import os

    assert rpc_group.pin_interfaces("127.0.0.1") == "lo"
    assert all(os.environ[v] == "lo" for v in VARS)
    # the next group's address is on no interface of this host: graphfeed's own pins are dropped, not kept
    assert rpc_group.pin_interfaces("198.18.255.254") is None
    assert not any(v in os.environ for v in VARS)


def test_the_operators_pins_win(monkeypatch):
    import os

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    rpc_group.pin_interfaces("127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
    assert os.environ["TP_SOCKET_IFNAME"] == "lo"
