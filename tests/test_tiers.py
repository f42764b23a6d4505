"""The fast tier's rule (``helpers.tiers``): a test that starts a process is ``slow``, others are not."""
from __future__ import annotations

from types import SimpleNamespace

from helpers.tiers import starts_processes

import graphfeed.client as gf
from graphfeed.testing.cluster import running_cluster


def _unit():
    assert sum([1, 2]) == 3


def _daemons(parts):
    with running_cluster(parts):
        pass


def _helper_connects(addresses):
    return gf.connect(addresses)


def _calls_a_helper(addresses):
    with _helper_connects(addresses):
        pass


def _item(fn):
    return SimpleNamespace(function=fn, _fixtureinfo=None)


def test_a_test_that_starts_servers_or_connects_is_slow_and_a_unit_test_is_not():
    assert starts_processes(_item(_daemons))
    assert starts_processes(_item(_calls_a_helper)), "through a module function it calls"
    assert not starts_processes(_item(_unit))


def test_the_collected_tiers(request):
    """This module's own tests are fast; a daemon test of the tree is slow when it is collected too."""
    items = {item.nodeid: item for item in request.session.items}
    assert not items[request.node.nodeid].get_closest_marker("slow")
    daemon = [i for i in items.values() if i.nodeid.startswith("tests/client/test_client_remote.py::")]
    assert all(i.get_closest_marker("slow") for i in daemon)


def test_test_file_names_are_unique_across_the_layer_folders():
    """pytest imports test modules by basename (rootdir mode): two ``test_x.py`` in two layer folders make the
    second one a collection error of the whole run."""
    from collections import Counter
    from pathlib import Path

    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], "rename the duplicates: " + str(
        sorted(n for n, k in names.items() if k > 1))
