"""The client's one recovery path (``Client.call_with_recovery``) and what the embedding table builds on it,
over scripted data paths: a lost peer is waited for and the call made again; every other failure is raised as
it is; past the bound one ServerError names the setting; a step's pushes an owner did not take are sent again
to the re-formed group (only those), never dropped."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphfeed.client.client import MAX_RECOVERIES, Client
from graphfeed.client.embedding import RemoteEmbedding
from graphfeed.client.errors import InvalidRequest, ServerError
from graphfeed.core.embedding import EmbeddingSpec, SparseUpdate
from graphfeed.transport.calls import DataCalls, PeerLost
from graphfeed.transport.pending import Pending

ROWS = (0, 10, 20)   # two parts' id ranges


class ScriptedCalls(DataCalls):
    """Every call recorded; ``lose`` names (part, function) pairs whose calls lose their peer."""

    kind, label = "scripted", "a scripted data path"

    def __init__(self, lose: set[tuple[int, str]] = frozenset(),   # type: ignore[assignment]
                 seqs: tuple[int, int] = (0, 0)):
        super().__init__()
        self.lose, self.log = set(lose), []
        self.seqs = seqs   # each owner's push sequence number once its table is made or loaded (a replayed log)

    def call(self, part: int, name: str, args: tuple, timeout: float) -> Pending:
        self._check_open()
        self.log.append((part, name, args))
        if (part, name) in self.lose:
            return Pending.failed(PeerLost(part, "EOF", self.label))
        if name == "emb_create":
            return Pending.completed((ROWS[part], ROWS[part + 1], True, self.seqs[part]))
        if name == "emb_load":
            return Pending.completed(self.seqs[part])
        return Pending.completed(None)


class FakeClient:
    """The parts of a Client the recovery path uses; :meth:`recover` re-forms onto the next scripted group."""

    call_with_recovery = Client.call_with_recovery
    _lost_where = Client._lost_where
    server_name = Client.server_name

    def __init__(self, *groups: ScriptedCalls, dead: dict | None = None):
        self.groups = list(groups)
        self.group = SimpleNamespace(calls=self.groups.pop(0), probe=lambda: dict(dead or {}))
        self.servers = [SimpleNamespace(part=p, name=f"h:{7000 + p} part {p}") for p in (0, 1)]
        self.generation, self.rpc_timeout, self.reconnect_timeout = 0, 5.0, 30.0
        self.recovered: list[tuple[str, str]] = []

    def recover(self, where, cause, generation):
        assert generation == self.generation
        self.recovered.append(where)
        self.group.calls.close()
        self.group = SimpleNamespace(calls=self.groups.pop(0), probe=lambda: {})
        self.generation += 1
        return self.generation


def test_a_lost_peer_is_waited_for_and_the_call_made_again():
    client = FakeClient(ScriptedCalls(), ScriptedCalls())
    attempts = []

    def call():
        attempts.append(client.generation)
        if len(attempts) == 1:
            raise PeerLost(1, "EOF", "torch RPC")
        return "answer"

    assert client.call_with_recovery("node_rows", call) == "answer"
    assert attempts == [0, 1]
    assert client.recovered == [("h:7001 part 1", "node_rows failed: part 1's worker is lost (torch RPC): EOF")]


def test_other_failures_are_raised_as_they_are_and_nothing_is_re_formed():
    client = FakeClient(ScriptedCalls())
    for error in (InvalidRequest("h:7000 part 0: node id 99 is outside 0..19"), RuntimeError("the batch is bad"),
                  ServerError("h:7000 part 0", "OpenSession failed (INTERNAL)")):   # no server is down
        with pytest.raises(type(error)) as caught:
            client.call_with_recovery("sample", lambda e=error: (_ for _ in ()).throw(e))
        assert caught.value is error
    assert client.recovered == []


def test_a_control_error_while_a_server_is_down_recovers_too():
    client = FakeClient(ScriptedCalls(), ScriptedCalls(), dead={"h:7001 part 1": "UNAVAILABLE"})
    calls = []

    def call():
        calls.append(1)
        if len(calls) == 1:
            raise ServerError("h:7001 part 1", "OpenSession failed (UNAVAILABLE: connection refused)")
        return 5

    assert client.call_with_recovery("sample", call) == 5
    assert client.recovered[0][0] == "h:7001 part 1"


def test_past_the_bound_one_server_error_names_the_server_and_the_setting():
    client = FakeClient(*(ScriptedCalls() for _ in range(MAX_RECOVERIES + 1)))

    def always_lost():
        raise PeerLost(0, "connection reset by peer", "the secure data path")

    with pytest.raises(ServerError) as caught:
        client.call_with_recovery("emb_push of embedding table 'author'", always_lost)
    text = str(caught.value)
    assert "h:7000 part 0" in text and "emb_push of embedding table 'author' failed" in text
    assert "reconnect_timeout=30 s" in text and isinstance(caught.value.__cause__, PeerLost)
    assert len(client.recovered) == MAX_RECOVERIES


def test_a_push_an_owner_lost_is_sent_again_to_the_re_formed_group_only_to_that_owner():
    old, new = ScriptedCalls(lose={(1, "emb_push")}), ScriptedCalls(seqs=(1, 0))   # part 0's log holds push 1
    client = FakeClient(old, new)
    table = RemoteEmbedding(client, EmbeddingSpec("author", "author", 4))   # type: ignore[arg-type]
    table.checkpoint = "ckpt"
    gids, grads = torch.tensor([3, 15, 3]), torch.ones(3, 4)
    table.push(gids, grads, SparseUpdate("adam", 0.1))
    table.flush()   # part 1 lost its worker: wait, re-form, make the table again, send part 1's share again
    assert len(client.recovered) == 1 and client.generation == 1
    pushed_old = [(p, a) for p, n, a in old.log if n == "emb_push"]
    assert [p for p, _ in pushed_old] == [0, 1]
    assert [(p, n) for p, n, _ in new.log] == [(0, "emb_create"), (1, "emb_create"), (0, "emb_load"),
                                               (1, "emb_load"), (1, "emb_push")]
    again = new.log[-1][2]
    assert torch.equal(again[1], torch.tensor([15])) and again[1] is pushed_old[1][1][1]   # the same push, resent
    assert again[-1] == pushed_old[1][1][-1] == 1   # as push 1 of part 1's sequence
    table.flush()   # nothing owed any more
    assert len(new.log) == 5


def test_a_push_both_owners_lost_the_answer_of_is_sent_again_only_where_the_restored_log_lacks_it():
    """Both answers lost with the group; part 0 had applied and logged the push (its restored sequence says 1),
    part 1 had not (0): only part 1 gets it again, so no owner applies a step twice."""
    old = ScriptedCalls(lose={(0, "emb_push"), (1, "emb_push")})
    new = ScriptedCalls(seqs=(1, 0))
    client = FakeClient(old, new)
    table = RemoteEmbedding(client, EmbeddingSpec("author", "author", 4))   # type: ignore[arg-type]
    table.push(torch.tensor([3, 15]), torch.ones(2, 4), SparseUpdate("adam", 0.1))
    table.flush()
    assert [(p, n) for p, n, _ in new.log] == [(0, "emb_create"), (1, "emb_create"), (1, "emb_push")]
    assert new.log[-1][2][-1] == 1
    table.push(torch.tensor([4, 16]), torch.ones(2, 4), SparseUpdate("adam", 0.1))   # the next step: push 2 on both
    table.flush()
    assert [(p, a[-1]) for p, n, a in new.log[3:] if n == "emb_push"] == [(0, 2), (1, 2)]
