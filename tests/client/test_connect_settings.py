"""connect()'s settings record and its deprecated ``channel=`` (mapped to a route of the transport registry)."""
from __future__ import annotations

import warnings

import pytest

from graphfeed.client.client import _route
from graphfeed.client.settings import ConnectSettings
from graphfeed.transport import registry


@pytest.mark.parametrize("transport, channel, route", [
    (registry.AUTO, "rpc", registry.Route(registry.AUTO, None)),
    (registry.SECURE, "auto", registry.Route(registry.SECURE, registry.SHM)),
    (registry.TORCH_RPC, "rpc", registry.Route(registry.TORCH_RPC, None)),
])
def test_the_deprecated_channel_keeps_its_meaning_and_warns(transport, channel, route):
    with pytest.warns(DeprecationWarning, match=f"connect\\(channel='{channel}'\\) is deprecated"):
        assert _route(transport, channel) == route
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _route(transport, None) == registry.route(transport)   # no channel: no warning
    with pytest.raises(ValueError, match="channel must be"):
        _route(transport, "carrier-pigeon")


def test_connect_settings_take_the_keywords_by_name_and_check_them_once():
    base = ConnectSettings(timeout=5.0)
    merged = ConnectSettings.of(base, {"rpc_timeout": 7.0, "token": "t" * 20}, "connect")
    assert (merged.timeout, merged.rpc_timeout, merged.shm_slots) == (5.0, 7.0, 8)
    assert "t" * 20 not in repr(merged)
    with pytest.raises(TypeError, match="connect\\(\\) got an unexpected keyword argument 'timout'"):
        ConnectSettings.of(None, {"timout": 1.0}, "connect")
    with pytest.raises(ValueError, match="reconnect_timeout must be >= 0"):
        ConnectSettings(reconnect_timeout=-1)
    with pytest.raises(ValueError, match="shm_slots must be >= 0"):
        ConnectSettings(shm_slots=-1)
    assert ConnectSettings(shm_slots=0).shm_slots == 0   # no shared memory: every pull over the data path
    with pytest.raises(ValueError, match="shm_max_slot_mb must be > 0"):
        ConnectSettings(shm_max_slot_mb=0)
