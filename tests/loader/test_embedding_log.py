"""The embedding tables' update log without servers (graphfeed.server.embedding.log and the store's use of it):
records append and replay bit for bit (rows and Adam state), one fsync per push, a torn tail is dropped and the
log continues, damage in the middle is an error, a save starts a new log and a restarted owner restores
checkpoint + log, a load that goes back to a checkpoint starts a new log, creation reports what it made."""
from __future__ import annotations

import os

import pytest
import torch

from graphfeed.core.embedding import EmbeddingSpec, SparseUpdate
from graphfeed.server.embedding import EmbeddingStore, PartTable
from graphfeed.server.embedding import log as update_log
from graphfeed.server.embedding.log import LogReader, UpdateLog
from graphfeed.server.partition.format.book import RangePartitionBook

BOOK = RangePartitionBook([0, 50, 90])
SPEC = EmbeddingSpec("t", "n", 6, seed=3)
ADAM = SparseUpdate("adam", 0.05)


def _pushes(n: int, seed: int = 0, lo: int = 0, hi: int = 50):
    """``n`` pushes of ids with duplicates in ``lo..hi-1`` and their gradient rows."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(lo, hi, (20,), generator=gen)
        out.append((ids, torch.randn(20, SPEC.dim, generator=gen)))
    return out


def _same(a: PartTable, b: PartTable) -> None:
    assert a.seq == b.seq
    assert torch.equal(a.rows, b.rows)
    assert sorted(a.state) == sorted(b.state)
    for key in a.state:
        assert torch.equal(a.state[key], b.state[key]), key


def _logged_table(path, pushes, update=ADAM) -> PartTable:
    table = PartTable(SPEC, 0, 0, 50)
    table.log = UpdateLog.start(path)
    for ids, grads in pushes:
        table.apply(ids, grads, update)
    table.log.close()
    return table


def test_replay_gives_back_rows_and_adam_state_bit_for_bit(tmp_path):
    path = tmp_path / "part_0.r.log"
    live = _logged_table(path, _pushes(7))
    restored = PartTable(SPEC, 0, 0, 50)
    reader = LogReader(path)
    assert restored.replay(reader) == 7 and not reader.torn and reader.size == path.stat().st_size
    _same(live, restored)
    assert set(live.state) == {"exp_avg", "exp_avg_sq", "step"}
    for rule in ("sgd", "adagrad"):   # every rule, and its hyper-parameters, come back from the record
        other = _logged_table(tmp_path / f"{rule}.log", _pushes(3, 1), SparseUpdate(rule, 0.3, eps=1e-7))
        again = PartTable(SPEC, 0, 0, 50)
        again.replay(LogReader(tmp_path / f"{rule}.log"))
        _same(other, again)


def test_one_fsync_per_push_whatever_its_rows(tmp_path, monkeypatch):
    table = PartTable(SPEC, 0, 0, 50)
    table.log = UpdateLog.start(tmp_path / "part_0.r.log")
    synced = []
    real = os.fsync
    monkeypatch.setattr(update_log.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    for ids, grads in _pushes(4):
        table.apply(ids, grads, ADAM)
    table.apply(torch.arange(50), torch.ones(50, SPEC.dim), ADAM)   # a push of every row: still one
    assert len(synced) == 5


def test_a_torn_tail_is_dropped_and_the_log_continues(tmp_path):
    path = tmp_path / "part_0.r.log"
    pushes = _pushes(5)
    _logged_table(path, pushes)
    whole = path.stat().st_size
    with open(path, "r+b") as f:   # the last record cut short, as a kill -9 during its write leaves it
        f.truncate(whole - 17)
    reader = LogReader(path)
    table = PartTable(SPEC, 0, 0, 50)
    assert table.replay(reader) == 4 and reader.torn
    expected = _logged_table(tmp_path / "four.log", pushes[:4])
    _same(table, expected)
    table.log = UpdateLog.resume(path, reader.size)   # cut back to the last whole record, then appended to
    assert path.stat().st_size == reader.size
    ids, grads = pushes[4]
    table.apply(ids, grads, ADAM)
    table.log.close()
    again = PartTable(SPEC, 0, 0, 50)
    reader = LogReader(path)
    assert again.replay(reader) == 5 and not reader.torn
    _same(again, _logged_table(tmp_path / "five.log", pushes))
    with open(path, "r+b") as f:   # a torn frame header alone
        f.seek(0, 2)
        f.write(b"\x07\x00")
    reader = LogReader(path)
    assert sum(1 for _ in reader) == 5 and reader.torn


def test_damage_before_the_last_record_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "part_0.r.log"
    _logged_table(path, _pushes(3))
    with open(path, "r+b") as f:
        f.seek(len(update_log.MAGIC) + 40)   # inside the first record's payload
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ValueError, match=r"part_0\.r\.log: the record at byte 10 fails its checksum"):
        list(LogReader(path))
    (tmp_path / "other").write_bytes(b"not a log at all")
    with pytest.raises(ValueError, match="is not an embedding update log"):
        list(LogReader(tmp_path / "other"))


def test_a_failed_write_applies_nothing_and_leaves_the_log_whole(tmp_path, monkeypatch):
    path = tmp_path / "part_0.r.log"
    pushes = _pushes(3)
    table = _logged_table(path, pushes[:2])
    table.log = UpdateLog.resume(path, path.stat().st_size)
    before, size = table.rows.clone(), path.stat().st_size
    real = os.writev

    def half_then_full(fd, views):   # part of the record reaches the file, then the disk is full
        real(fd, [bytes(views[0])[:5]])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(update_log.os, "writev", half_then_full)
    with pytest.raises(RuntimeError, match=r"cannot write its update log .*part_0\.r\.log .*No space left.*"
                                           r"free space under embedding_dir"):
        table.apply(*pushes[2], ADAM)
    assert torch.equal(table.rows, before) and table.seq == 2 and path.stat().st_size == size
    monkeypatch.setattr(update_log.os, "writev", real)
    table.apply(*pushes[2], ADAM)
    again = PartTable(SPEC, 0, 0, 50)
    again.replay(LogReader(path))
    _same(again, table)


def _store(tmp_path, part: int = 0, **kw) -> EmbeddingStore:
    return EmbeddingStore(part, {"n": BOOK}, save_dir=str(tmp_path / "tables"), **kw)


def _logs(tmp_path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path / "tables" / "t")) for p in (tmp_path / "tables").rglob("*.log"))


def test_a_restarted_owner_restores_checkpoint_and_log_and_a_save_starts_a_new_log(tmp_path):
    store = _store(tmp_path)
    assert store.create(SPEC, "r1") == (0, 50, True, 0)
    assert store.create(SPEC, "r1") == (0, 50, False, 0)   # a retry with the same spec: accepted, nothing made
    pushes = _pushes(9)
    for ids, grads in pushes[:3]:
        store.push("t", ids, grads, ADAM)
    # never saved: a restarted owner replays the log of the initial rows when the table is made again
    early = _store(tmp_path)
    early.create(SPEC, "r1")
    _same(early.table("t"), store.table("t"))
    store.save("t", "a")
    assert _logs(tmp_path) == [".initial/part_0.r1.log", "a/part_0.r1.log"]   # the one before is kept
    for ids, grads in pushes[3:6]:
        store.push("t", ids, grads, ADAM)
    store.save("t", "b")
    assert _logs(tmp_path) == ["a/part_0.r1.log", "b/part_0.r1.log"]
    assert sum(1 for _ in LogReader(tmp_path / "tables/t/b/part_0.r1.log")) == 0
    for ids, grads in pushes[6:]:
        store.push("t", ids, grads, ADAM)
    restarted = _store(tmp_path)   # the trainer makes the table again and loads its last tag
    restarted.create(SPEC, "r1")
    restarted.load("t", "b")
    _same(restarted.table("t"), store.table("t"))
    ids, grads = pushes[0]   # and the restored owner goes on logging where the log ended
    restarted.push("t", ids, grads, ADAM)
    store.push("t", ids, grads, ADAM)
    third = _store(tmp_path)
    third.create(SPEC, "r1")
    third.load("t", "b")
    _same(third.table("t"), store.table("t"))


def test_a_load_that_goes_back_starts_a_new_log_and_close_deletes_the_replicas_logs(tmp_path):
    store = _store(tmp_path)
    store.create(SPEC, "r1")
    pushes = _pushes(4)
    store.push("t", *pushes[0], ADAM)
    store.save("t", "a")
    saved = store.table("t").rows.clone()
    store.push("t", *pushes[1], ADAM)
    store.load("t", "a")   # the trainer goes back to "a": the pushes after it are not replayed later
    assert torch.equal(store.table("t").rows, saved)
    store.push("t", *pushes[2], ADAM)
    restarted = _store(tmp_path)
    restarted.create(SPEC, "r1")
    restarted.load("t", "a")
    _same(restarted.table("t"), store.table("t"))
    other = _store(tmp_path)   # another replica (a DDP rank, a later job) loads the checkpoint alone
    other.create(SPEC, "r2")
    other.load("t", "a")
    assert torch.equal(other.table("t").rows, saved)
    assert store.close("t") and not store.close("t")
    assert _logs(tmp_path) == [".initial/part_0.r2.log", "a/part_0.r2.log"]
    assert (tmp_path / "tables/t/a/part_0.pt").is_file()   # checkpoints stay


def test_no_log_without_a_dir_a_replica_or_with_the_setting_off(tmp_path):
    for store in (EmbeddingStore(0, {"n": BOOK}), _store(tmp_path, log_updates=False)):
        store.create(SPEC, "r1")
        store.push("t", *_pushes(1)[0], ADAM)
        assert store.table("t").log is None
    plain = _store(tmp_path)
    plain.create(SPEC)
    assert plain.table("t").log is None
    assert not (tmp_path / "tables").exists() or _logs(tmp_path) == []
    with pytest.raises(ValueError, match="table replica id"):
        _store(tmp_path).create(SPEC, "../x")


def test_a_checkpoint_keeps_its_push_number_and_an_older_one_reads_as_zero(tmp_path):
    table = _logged_table(tmp_path / "l.log", _pushes(3))
    table.log = None
    path = table.save(tmp_path, "c")
    assert PartTable.load(tmp_path, "t", "c", 0).seq == 3
    payload = torch.load(path, weights_only=True)
    del payload["seq"]
    torch.save(payload, path)
    assert PartTable.load(tmp_path, "t", "c", 0).seq == 0


def test_a_numbered_push_the_owner_holds_already_is_acknowledged_not_applied_again(tmp_path):
    """A push sent again after its answer was lost with the group: the restarted owner replayed it from its log,
    so its number is at or below the table's seq and it changes nothing; the next number applies."""
    store = _store(tmp_path)
    store.create(SPEC, "r1")
    pushes = _pushes(3)
    for k, (ids, grads) in enumerate(pushes[:2], start=1):
        assert store.push("t", ids, grads, ADAM, number=k) > 0
    restarted = _store(tmp_path)   # killed after push 2 was logged, before its answer left
    assert restarted.create(SPEC, "r1") == (0, 50, True, 2)   # the replayed log: 2 pushes
    before = restarted.table("t").rows.clone()
    assert restarted.push("t", *pushes[1], ADAM, number=2) == 0   # sent again: held already
    assert torch.equal(restarted.table("t").rows, before) and restarted.table("t").seq == 2
    assert restarted.table("t").duplicates == 1
    assert restarted.push("t", *pushes[2], ADAM, number=3) > 0
    store.push("t", *pushes[2], ADAM, number=3)
    _same(restarted.table("t"), store.table("t"))   # as if the push had been applied once
    store.save("t", "a")
    assert store.load("t", "a") == 3   # a load says where the owner's sequence goes on from
