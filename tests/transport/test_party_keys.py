"""The secure data path's keys, in one process: a party proves who it is (a worker's pair key cannot pose as the
trainer or as another part, and a peer may call only peer functions), the group key alone opens nothing, TLS 1.2 is
refused and mTLS asks for a client certificate, and a connection rekeys at the same frame on both ends."""
from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest
import torch
from helpers.pki import make_pki

from graphfeed.transport import secure
from graphfeed.transport.secure import Function, PartyKeys, SecureCalls, SecureServer, TlsServer, client_tls, keys
from graphfeed.transport.secure.keys import TRAINER, group_root, pair_key
from graphfeed.transport.secure.path import Secure

ROOT = b"r" * 32
NUM_PARTS = 3


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _table() -> dict[str, Function]:
    return {"gather": Function(lambda *a: ("peer", *a), peers=True), "pull": Function(lambda *a: ("trainer", *a))}


def _wait(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:g} s")
        time.sleep(0.02)


@pytest.fixture
def part0():
    refused: list[tuple[str, str]] = []
    srv = SecureServer("127.0.0.1", PartyKeys.of_worker(ROOT, 0, NUM_PARTS), _table(), name="p0",
                       on_refused=lambda p, r: refused.append((p, r))).start()
    yield srv, refused
    srv.close()


def test_a_worker_ring_holds_only_its_own_pair_keys():
    ring = PartyKeys.of_worker(ROOT, 1, NUM_PARTS)
    assert not ring.root and set(ring.pairs) == {TRAINER, 0, 2}
    assert ring.key(TRAINER) == pair_key(ROOT, TRAINER, 1) == PartyKeys.of_root(ROOT).key(1)
    assert ring.key(0) == PartyKeys.of_worker(ROOT, 0, NUM_PARTS).key(1)
    assert ROOT not in ring.pairs.values() and len(set(ring.pairs.values())) == 3
    assert pair_key(ROOT, TRAINER, 2) not in ring.pairs.values()   # it cannot speak for the trainer to part 2
    assert group_root(ROOT, "tok-a") != group_root(ROOT, "tok-b") != group_root(ROOT, None)


def test_the_trainer_calls_everything_a_peer_only_peer_functions(part0):
    srv, refused = part0
    trainer = SecureCalls(ROOT, {0: srv.address})
    peer = SecureCalls(PartyKeys.of_worker(ROOT, 1, NUM_PARTS), {0: srv.address})
    try:
        assert trainer.call_sync(0, "pull", (1,), 10) == ("trainer", 1)
        assert trainer.call_sync(0, "gather", (2,), 10) == ("peer", 2)
        assert peer.call_sync(0, "gather", (3,), 10) == ("peer", 3)
        with pytest.raises(PermissionError, match="'pull' is the trainer's to call; part1 .* may call: gather"):
            peer.call_sync(0, "pull", (4,), 10)
        assert peer.call_sync(0, "gather", (5,), 10) == ("peer", 5)   # the connection stays
        assert not refused
    finally:
        trainer.close()
        peer.close()


def test_a_worker_cannot_pose_as_the_trainer_or_another_part(part0):
    """The listener proves first, under the pair key of the party the hello names: an impostor's check of that proof
    fails (it holds another pair key), so it never gets to send a call."""
    srv, refused = part0
    stolen = pair_key(ROOT, 1, 0)   # what a compromised part 1 holds for part 0
    for n, me in enumerate((TRAINER, 2), 1):
        impostor = SecureCalls(PartyKeys(me=me, pairs={0: stolen}), {0: srv.address})
        with pytest.raises(ConnectionError, match="failed the group proof: it is not part0 of this trainer group"):
            impostor.call_sync(0, "pull", (1,), 10)
        impostor.close()
        _wait(lambda n=n: len(refused) == n, "the listener's refusal")
    outsider = SecureCalls(PartyKeys(me=7, pairs={0: stolen}), {0: srv.address})   # no party of the group
    with pytest.raises(ConnectionError):
        outsider.call_sync(0, "gather", (1,), 10)
    outsider.close()
    _wait(lambda: any("part7, which is no party of this group" in r for _, r in refused), "the refusal of part7")


def test_the_group_key_without_the_token_opens_nothing():
    group_key = b"g" * 32
    ring = Secure().worker_key(group_key, "the-token", 0, 2)   # what the daemon hands its worker
    assert not ring.root and group_key not in ring.pairs.values() and set(ring.pairs) == {TRAINER, 1}
    srv = SecureServer("127.0.0.1", ring, _table(), name="p0").start()
    try:
        for guess in (group_key, group_root(group_key, None), group_root(group_key, "another-token")):
            outsider = SecureCalls(guess, {0: srv.address})
            with pytest.raises(ConnectionError, match="failed the group proof"):
                outsider.call_sync(0, "pull", (1,), 10)
            outsider.close()
        trainer = SecureCalls(Secure().trainer(group_key, "the-token").keys, {0: srv.address})
        assert trainer.call_sync(0, "pull", (1,), 10) == ("trainer", 1)
        trainer.close()
    finally:
        srv.close()


def test_the_listener_refuses_tls_1_2_and_asks_the_trainer_for_a_certificate_with_mtls(pki):
    refused: list[str] = []
    tls = TlsServer(str(pki.server_cert), str(pki.server_key), client_ca=str(pki.ca))
    srv = SecureServer("127.0.0.1", PartyKeys.of_worker(ROOT, 0, NUM_PARTS), _table(), name="p0", tls=tls,
                       on_refused=lambda p, r: refused.append(r)).start()
    try:
        old = client_tls(str(pki.ca), str(pki.client_cert), str(pki.client_key))
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_2
        for ctx in (old, client_tls(str(pki.ca)),   # TLS 1.2; no client certificate; one a foreign CA signed
                    client_tls(str(pki.ca), str(pki.rogue_client_cert), str(pki.rogue_client_key))):
            calls = SecureCalls(ROOT, {0: srv.address}, tls=ctx)
            with pytest.raises(ConnectionError):
                calls.call_sync(0, "pull", (1,), 10)
            calls.close()
        _wait(lambda: len(refused) == 3, "three refusals (TLS 1.2, no client certificate, a foreign one)")
        assert "UNSUPPORTED_PROTOCOL" in refused[0]
        assert "the trainer showed no client certificate" in refused[1]
        assert "no group handshake" in refused[2]
        good = SecureCalls(ROOT, {0: srv.address}, tls=client_tls(str(pki.ca), str(pki.client_cert),
                                                                   str(pki.client_key)))
        assert good.call_sync(0, "pull", (1,), 10) == ("trainer", 1)
        assert good._client(0)._connection().tls_suite[1] == "TLSv1.3"
        good.close()
        # a peer shows no certificate (a daemon's is a server certificate): its pair key is its identity; it checks
        # the listener's certificate against the daemons' CA (tls_peer_ca)
        peer = SecureCalls(PartyKeys.of_worker(ROOT, 1, NUM_PARTS), {0: srv.address}, tls=client_tls(str(pki.ca)))
        assert peer.call_sync(0, "gather", (2,), 10) == ("peer", 2)
        peer.close()
        assert len(refused) == 3
    finally:
        srv.close()


def test_a_peer_checks_the_listeners_certificate_against_the_peer_ca(pki, tmp_path):
    from graphfeed.transport.path import WorkerPlace
    from graphfeed.transport.secure.path import peer_tls

    srv = SecureServer("127.0.0.1", PartyKeys.of_worker(ROOT, 0, NUM_PARTS), _table(), name="p0",
                       tls=TlsServer(str(pki.server_cert), str(pki.server_key))).start()
    try:
        place = dict(part_id=1, group_id="g", group_key=PartyKeys.of_worker(ROOT, 1, NUM_PARTS),
                     tls_cert=str(pki.server_cert), tls_key=str(pki.server_key))
        checked = SecureCalls(place["group_key"], {0: srv.address}, tls=peer_tls(WorkerPlace(**place,
                                                                                            tls_peer_ca=str(pki.ca))))
        assert checked.call_sync(0, "gather", (1,), 10) == ("peer", 1)
        checked.close()
        rogue_ca = tmp_path / "rogue-ca.crt"
        rogue_ca.write_bytes(pki.rogue_client_cert.read_bytes())   # a CA bundle that did not sign the listener's
        wrong = SecureCalls(place["group_key"], {0: srv.address}, tls=peer_tls(WorkerPlace(**place,
                                                                                          tls_peer_ca=str(rogue_ca))))
        with pytest.raises(ConnectionError, match="TLS .* failed"):
            wrong.call_sync(0, "gather", (1,), 10)
        wrong.close()
    finally:
        srv.close()


def test_a_connection_rekeys_at_the_same_frame_on_both_ends(monkeypatch):
    monkeypatch.setattr(secure.Connection, "rekey_frames", 3)
    monkeypatch.setattr(secure.Connection, "rekey_bytes", 1 << 16)
    a, b = socket.socketpair()
    k1, k2 = b"1" * 32, b"2" * 32
    out, into = (secure.Connection(a, k2, k1, mac=False, seal=True, where="a"),
                 secure.Connection(b, k1, k2, mac=False, seal=True, where="b"))
    first_key = out._send_seal
    values = [torch.arange(n, dtype=torch.int64) for n in (1, 5, 40_000, 2, 3, 100_000, 7, 8, 9, 10)]
    sender = threading.Thread(target=lambda: [out.send({"k": "ok", "id": i}, v) for i, v in enumerate(values)])
    sender.start()
    for i, v in enumerate(values):
        meta, got = into.recv()
        assert meta["id"] == i and torch.equal(got, v)
    sender.join(10)
    # a new key after frame 2 (its 320 KB pass 64 KiB), 5 (800 KB) and 8 (the third frame since)
    assert out.rekeys == [3, 0] and into.rekeys == [0, 3]
    assert out._send_seal != first_key and out._send_seal == into._recv_seal
    out.close()
    into.close()


def test_a_receiver_that_did_not_rekey_fails_the_next_frame(monkeypatch):
    a, b = socket.socketpair()
    k1, k2 = b"1" * 32, b"2" * 32
    out, into = (secure.Connection(a, k2, k1, mac=False, seal=True, where="a"),
                 secure.Connection(b, k1, k2, mac=False, seal=True, where="b"))
    out.rekey_frames = 1   # this end alone: the keys differ from the second frame on
    out.send({"k": "ok", "id": 1}, torch.ones(4))
    assert into.recv()[0]["id"] == 1
    out.send({"k": "ok", "id": 2}, torch.ones(4))
    with pytest.raises(secure.FrameError, match="failed its tag"):
        into.recv()
    out.close()
    into.close()


def test_rekey_limits_are_the_documented_ones():
    assert keys.REKEY_FRAMES == 1 << 20 and keys.REKEY_BYTES == 1 << 30
    assert secure.Connection.rekey_frames == keys.REKEY_FRAMES
