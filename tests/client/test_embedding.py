"""Learnable embedding tables on real servers (the shared mag-tiny cluster: 2 daemons; authors have no features):
rows ride the batch and equal the local loader's, sparse steps on the owners equal the in-process table's,
two jobs' same-named tables stay apart, DDP ranks see the same rows, checkpoints survive a kill -9.
Run also with GRAPHFEED_TEST_DATA_PATH=secure (every call goes through DataCalls on either path)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest
import torch
from helpers.cluster import kill_server
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.core.embedding import EmbeddingSpec, SparseAdam
from graphfeed.server.embedding import LocalEmbedding, PartTable
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.testing.cluster import running_cluster, start_server

FANOUTS = {("author", "writes", "paper"): [3, 2], ("paper", "cites", "paper"): [3, 2],
           ("paper", "rev_writes", "author"): [2, 2]}
DIM = 8


def _local_graph(parts) -> PartitionedGraph:
    return PartitionedGraph.in_process(open_parts(parts)[1])


def _fanouts(graph) -> dict:
    return {e: f for e, f in FANOUTS.items() if e in graph.edge_types}


def _train(loader, opt, weight: torch.Tensor, batches: int, field: str = "x", every: int = 2) -> list:
    """``batches`` batches of a loss linear in the author rows (its gradient does not depend on the rows, so a
    prefetched batch's rows do not change the steps), one optimizer step per ``every`` batches (ids repeat
    across them: duplicates in a step).  The batches' author global ids."""
    seen = []
    for i, batch in enumerate(loader):
        rows = getattr(batch["author"], field)
        (rows * weight).sum().backward()
        seen.append(batch["author"].emb_gid)
        if (i + 1) % every == 0:
            opt.step()
        if i + 1 == batches:
            break
    return seen


def test_rows_ride_the_batch_equal_the_local_loader_and_train_on_both_servers(shared_mag, shared_mag_cluster,
                                                                             connect):
    parts, _ = shared_mag
    graph = _local_graph(parts)
    fanouts = _fanouts(graph)
    kwargs = dict(batch_size=64, shuffle=True, seed=2)
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        table = client.embedding("author", dim=DIM, seed=7, field="x")
        local = LocalEmbedding(EmbeddingSpec("author", "author", DIM, seed=7), graph.books["author"], field="x")
        assert table.num_rows == graph.books["author"].num_nodes
        remote_loader = client.neighbor_loader(("paper", "train"), fanouts, embeddings=[table], **kwargs)
        local_loader = LocalNeighborLoader(graph, fanouts, input_nodes=("paper", "train"), embeddings=[local],
                                           **kwargs)
        for a, b, _ in zip(remote_loader, local_loader, range(3)):   # no step yet: the same rows, every key
            assert a["author"].x.requires_grad and a["author"].x.is_leaf
            assert_same_batch(a, b)
        table.take_grads(), local.take_grads()
        owners = set((torch.searchsorted(table.bounds, a["author"].emb_gid, right=True) - 1).tolist())
        assert owners == {0, 1}, "the batch's authors are owned by both servers"

        weight = torch.randn(DIM)
        remote_opt, local_opt = SparseAdam([table], lr=0.05), gf.SparseAdam([local], lr=0.05)
        seen = _train(remote_loader, remote_opt, weight, 6)
        _train(local_loader, local_opt, weight, 6)
        every = torch.arange(table.num_rows)
        torch.testing.assert_close(table.rows(every), local.rows(every), rtol=1e-6, atol=1e-6)
        touched = torch.cat(seen).unique()
        untouched = torch.ones(table.num_rows, dtype=torch.bool)
        untouched[touched] = False
        start = LocalEmbedding(EmbeddingSpec("author", "author", DIM, seed=7), graph.books["author"])
        assert not torch.equal(table.rows(touched), start.rows(touched))
        assert torch.equal(table.rows(every[untouched]), start.rows(every[untouched]))
        table.close()
        with pytest.raises(RuntimeError, match="was closed"):
            table.rows(torch.tensor([0]))


def test_rows_travel_in_the_loaders_narrow_feature_dtype_and_still_train(shared_mag, shared_mag_cluster, connect):
    parts, _ = shared_mag
    graph = _local_graph(parts)
    fanouts = _fanouts(graph)
    kwargs = dict(batch_size=64, shuffle=True, seed=3, feature_dtype="bfloat16")
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        table = client.embedding("author", dim=DIM, seed=7, name="narrow")
        local = LocalEmbedding(EmbeddingSpec("narrow", "author", DIM, seed=7), graph.books["author"])
        remote_loader = client.neighbor_loader(("paper", "train"), fanouts, embeddings=[table], **kwargs)
        local_loader = LocalNeighborLoader(graph, fanouts, input_nodes=("paper", "train"), embeddings=[local],
                                           **kwargs)
        for a, b, _ in zip(remote_loader, local_loader, range(2)):   # peer rows too: bf16 end to end
            assert a["author"].emb.dtype == torch.bfloat16 and a["author"].emb.requires_grad
            assert_same_batch(a, b)
            gids = a["author"].emb_gid
            assert torch.equal(a["author"].emb, table.rows(gids).to(torch.bfloat16))
        table.take_grads(), local.take_grads()
        before = table.rows(torch.arange(table.num_rows))
        opt = SparseAdam([table], lr=0.05)
        seen = _train(remote_loader, opt, torch.randn(DIM), 2, field="emb", every=1)
        touched = torch.cat(seen).unique()
        after = table.rows(torch.arange(table.num_rows))
        assert after.dtype == torch.float32 and not torch.equal(after[touched], before[touched])
        remote_loader.close()
        table.close()


def test_bad_requests_are_one_line_and_the_servers_stay_up(shared_mag_cluster, connect):
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        with pytest.raises(ValueError, match="node type 'venue'"):
            client.embedding("venue", dim=4)
        with pytest.raises(ValueError, match="dim must be"):
            client.embedding("author", dim=0)
        table = client.embedding("author", dim=4, name="small")
        with pytest.raises(ValueError, match="already exists in this job with another spec"):
            client.embedding("author", dim=8, name="small")
        with pytest.raises(ValueError, match="id -1 is outside"):
            table.rows(torch.tensor([-1]))
        with pytest.raises(ValueError, match="set embedding_dir"):
            table.save("t1")
        with pytest.raises(ValueError, match="one table per node type"):
            client.neighbor_loader(("paper", "train"), [2], embeddings=[table, table])
        assert table.rows(torch.tensor([0, 1])).shape == (2, 4)   # still served
        table.close()


OTHER_JOB = textwrap.dedent("""
    import sys, torch
    import graphfeed.client as gf
    with gf.connect(sys.argv[1].split(","), timeout=60) as client:
        table = client.embedding("author", dim=%d, seed=7)
        ids = torch.arange(table.num_rows)
        gf.SparseSGD([table], lr=1.0)
        table.push(ids, torch.ones(ids.numel(), %d), gf.SparseSGD([table], lr=1.0).update)
        print(float(table.rows(ids).sum()))
""" % (DIM, DIM))


def test_two_jobs_with_a_table_of_the_same_name_do_not_interfere(shared_mag, shared_mag_cluster, connect):
    parts, _ = shared_mag
    graph = _local_graph(parts)
    start = LocalEmbedding(EmbeddingSpec("author", "author", DIM, seed=7), graph.books["author"])
    every = torch.arange(graph.books["author"].num_nodes)
    servers = ",".join(s.address for s in shared_mag_cluster)
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        mine = client.embedding("author", dim=DIM, seed=7)
        other = subprocess.run([sys.executable, "-c", OTHER_JOB, servers], capture_output=True, text=True,
                               timeout=240)
        assert other.returncode == 0, other.stderr[-2000:]
        their_sum = float(other.stdout.strip().splitlines()[-1])
        expected = float((start.rows(every) - 1.0).sum())
        assert their_sum == pytest.approx(expected, rel=1e-4)   # their step applied to their table
        assert torch.equal(mine.rows(every), start.rows(every))  # and not to this job's
        mine.close()


DDP_RANK = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    import graphfeed.client as gf
    rank, store, out, servers = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    weight = torch.randn(%d)
    with gf.connect(servers, timeout=60) as client:
        table = client.embedding("author", dim=%d, seed=3, field="x")
        loader = client.neighbor_loader(("paper", "train"), {("author", "writes", "paper"): [3, 2]},
                                        batch_size=40, shuffle=True, seed=1, embeddings=[table])
        opt = gf.SparseAdagrad([table], lr=0.1)
        sums, every = [], torch.arange(table.num_rows)
        for i, batch in enumerate(loader):
            ((batch["author"].x * weight).sum() * (rank + 1)).backward()
            opt.step()
            rows = table.rows(every)
            sums.append(float(rows.double().sum()))
            gathered = [torch.empty_like(rows) for _ in range(2)]
            dist.all_gather(gathered, rows)
            assert torch.equal(gathered[0], gathered[1]), f"step {i}: the ranks' rows differ"
            if i == 3:
                break
    dist.barrier()
    dist.destroy_process_group()
    json.dump({"sums": sums}, open(out, "w"))
""" % (DIM, DIM))


@pytest.mark.slow
def test_two_ddp_ranks_see_identical_rows_after_every_step(shared_mag_cluster, tmp_path):
    servers = ",".join(s.address for s in shared_mag_cluster)
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    procs = []
    for r in range(2):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-c", DDP_RANK, str(r), str(tmp_path / "store"),
                                           str(tmp_path / f"rank{r}.json"), servers], stderr=log))
    try:
        codes = [p.wait(300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    sums = [json.loads((tmp_path / f"rank{r}.json").read_text())["sums"] for r in range(2)]
    assert len(sums[0]) == 4 and sums[0] == sums[1]
    assert len(set(sums[0])) == 4, "every step changed the rows"


def scrape(server) -> dict:
    """``{(sample name, sorted label items): value}`` of one scrape of ``server``'s metrics endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{server.host}:{server.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.slow
def test_checkpoint_round_trip_and_a_kill_9_restart_restore_rows_and_state(shared_mag, tmp_path):
    parts, _ = shared_mag
    graph = _local_graph(parts)
    fanouts = _fanouts(graph)
    env = {"GRAPHFEED_EMBEDDING_DIR": str(tmp_path / "tables"), "GRAPHFEED_EMBEDDING_BYTES": "4MiB"}
    kwargs = dict(batch_size=48, shuffle=True, seed=5)
    weight = torch.randn(DIM)
    local = LocalEmbedding(EmbeddingSpec("author", "author", DIM, seed=1), graph.books["author"], field="x")
    local_loader = LocalNeighborLoader(graph, fanouts, input_nodes=("paper", "train"), embeddings=[local], **kwargs)
    with running_cluster(parts, log_dir=tmp_path / "logs", env=env, args=("--metrics-port", "0")) as servers:
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            with pytest.raises(ValueError) as refused:   # over the servers' embedding_bytes: one line, nothing made
                client.embedding("author", dim=1024, name="huge")
            assert "\n" not in str(refused.value) and "embedding budget 4.0 MiB (embedding_bytes)" in str(refused.value)
            table = client.embedding("author", dim=DIM, seed=1, field="x")
            loader = client.neighbor_loader(("paper", "train"), fanouts, prefetch=2, embeddings=[table], **kwargs)
            opt, local_opt = gf.SparseAdam([table], lr=0.05), gf.SparseAdam([local], lr=0.05)
            every = torch.arange(table.num_rows)
            it, local_it = iter(loader), iter(local_loader)
            for _ in range(2):   # two steps, then a checkpoint of the table and the loader
                for source, o in ((it, opt), (local_it, local_opt)):
                    (next(source)["author"].x * weight).sum().backward()
                    o.step()
            state = {"table": table.state_dict("ckpt"), "loader": loader.state_dict()}
            saved = table.rows(every)
            # each owner wrote its own part, under the job's namespace, and started its update log there
            ckpt = tmp_path / "tables" / "default" / "author" / "ckpt"
            assert sorted(p.name for p in ckpt.glob("*.pt")) == ["part_0.pt", "part_1.pt"]
            assert sorted(p.name for p in ckpt.glob("*.log")) == \
                [f"part_{k}.{table.replica}.log" for k in (0, 1)]
            (next(it)["author"].x * weight).sum().backward()
            opt.step()
            assert not torch.equal(table.rows(every), saved)
            table.load_state_dict(state["table"])          # round trip: back to the checkpoint
            assert torch.equal(table.rows(every), saved)
            samples = scrape(servers[0])
            rows = int(table.bounds[1] - table.bounds[0])
            assert samples[("graphfeed_embedding_rows", (("table", "author"),))] == rows
            assert samples[("graphfeed_embedding_bytes", (("table", "author"),))] == rows * DIM * 4 * 3 + rows * 4
            assert samples[("graphfeed_embedding_pushes_total", (("table", "author"),))] == 3
            assert samples[("graphfeed_embedding_rows_applied_total", (("table", "author"),))] > 0
            assert ("graphfeed_embedding_rows", (("table", "huge"),)) not in samples

            victim = servers[1]
            kill_server(victim)
            restarted: list = []

            def restart():
                time.sleep(1.0)
                restarted.append(start_server(parts, 1, log_dir=tmp_path / "restart", env=env,
                                              args=("--port", str(victim.port))))

            thread = threading.Thread(target=restart, daemon=True)
            thread.start()
            rest = list(it)   # the epoch resumes on the new group; the table comes back from "ckpt"
            thread.join(60)
            servers[1] = restarted[0]
            assert client.reconnects == 1 and rest
            table.take_grads()
            assert torch.equal(table.rows(every), saved)   # rows and (below) Adam state as checkpointed
            # the loader's resume path from the same checkpoint: the next steps equal the in-process table's from
            # its own step 2 on, so Adam's moments and step counts came back with the rows
            loader.load_state_dict(state["loader"])
            resumed = iter(loader)
            for _ in range(2):
                (next(resumed)["author"].x * weight).sum().backward()
                opt.step()
                (next(local_it)["author"].x * weight).sum().backward()
                local_opt.step()
            torch.testing.assert_close(table.rows(every), local.rows(every), rtol=1e-6, atol=1e-6)
            resumed.close()
        with gf.connect([s.address for s in servers], timeout=60) as later:   # a later job: the table kept by name
            again = later.embedding("author", dim=DIM, seed=9)
            assert not torch.equal(again.rows(every), saved)
            again.load("ckpt")
            assert torch.equal(again.rows(every), saved)



def _steps(it, opt, tables, weight: torch.Tensor, count: int) -> None:
    """``count`` optimizer steps of one batch each, the loss linear in every table's rows (its gradients do not
    depend on the rows, so prefetched batches push the same steps in every run)."""
    for _ in range(count):
        batch = next(it)
        sum((getattr(batch[t.spec.ntype], t.field) * weight).sum() for t in tables).backward()
        opt.step()


def _train_through(servers, parts, fanouts, weight, tag: str, kill_at=None) -> None:
    """Two tables (authors saved at step 2 as "mid", papers never saved), 8 SparseAdam steps, then both saved as
    ``tag``.  With ``kill_at(servers)``: called after step 4 once every push was acknowledged."""
    with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
        authors = client.embedding("author", dim=DIM, seed=1, field="x")
        papers = client.embedding("paper", dim=DIM, seed=2)
        loader = client.neighbor_loader(("paper", "train"), fanouts, batch_size=24, shuffle=True, seed=5,
                                        prefetch=2, embeddings=[authors, papers])
        assert len(loader) >= 9
        opt = gf.SparseAdam([authors, papers], lr=0.05)
        it = iter(loader)
        _steps(it, opt, [authors, papers], weight, 2)
        authors.save("mid")
        _steps(it, opt, [authors, papers], weight, 2)
        if kill_at is not None:
            authors.flush(), papers.flush()   # the last push acknowledged by every owner
            kill_at(servers, client)   # the next push or pull to the dead owner waits for it and re-forms the group
        _steps(it, opt, [authors, papers], weight, 4)
        assert client.reconnects == (0 if kill_at is None else 1)
        authors.save(tag), papers.save(tag)
        it.close()


def _tables_env(tmp_path) -> dict[str, str]:
    """The daemons' shared embedding_dir (one folder: every daemon of the test sees it)."""
    return {"GRAPHFEED_EMBEDDING_DIR": str(tmp_path / "tables")}


def _killed_run_equals_an_uninterrupted_one(shared_mag, tmp_path, served, kill_at) -> None:
    """Train the two tables through 8 steps on daemons of parts ``served`` twice -- uninterrupted, then with
    ``kill_at(servers, client)`` after step 4 -- and check both parts' saved rows, step numbers and Adam state are
    bit-equal between the two runs."""
    parts, _ = shared_mag
    fanouts = _fanouts(_local_graph(parts))
    weight = torch.randn(DIM)
    with running_cluster(parts, served, log_dir=tmp_path / "logs", env=_tables_env(tmp_path)) as servers:
        _train_through(servers, parts, fanouts, weight, "uninterrupted")
        _train_through(servers, parts, fanouts, weight, "killed", kill_at=kill_at)
    for name in ("author", "paper"):
        for part in (0, 1):
            want = PartTable.load(tmp_path / "tables" / "default", name, "uninterrupted", part)
            got = PartTable.load(tmp_path / "tables" / "default", name, "killed", part)
            assert got.seq == want.seq == 8, (name, part)
            assert torch.equal(got.rows, want.rows), (name, part)
            assert sorted(got.state) == ["exp_avg", "exp_avg_sq", "step"]
            for key in want.state:
                assert torch.equal(got.state[key], want.state[key]), (name, part, key)


@pytest.mark.slow
def test_a_kill_9_between_pushes_loses_no_step_rows_and_adam_state_equal_an_uninterrupted_run(shared_mag,
                                                                                               tmp_path):
    def kill_and_restart(servers, client) -> None:
        victim = servers[1]
        kill_server(victim)
        servers[1] = start_server(shared_mag[0], 1, log_dir=tmp_path / "restart", env=_tables_env(tmp_path),
                                  args=("--port", str(victim.port)))

    _killed_run_equals_an_uninterrupted_one(shared_mag, tmp_path, None, kill_and_restart)
    assert (tmp_path / "restart").is_dir()


@pytest.mark.slow
def test_a_killed_replica_hands_its_tables_to_another_with_every_acknowledged_step(shared_mag, tmp_path):
    """Part 1 served twice over one embedding_dir (shared storage): kill -9 of the replica in use, never
    restarted; the other restores checkpoint and update log, and the tables end equal to an uninterrupted run."""
    def kill_in_use(servers, client) -> None:
        kill_server(next(s for s in servers if s.address == client.servers[1].address))

    _killed_run_equals_an_uninterrupted_one(shared_mag, tmp_path, [0, 1, 1], kill_in_use)


@pytest.mark.slow
def test_a_table_refused_on_one_part_is_left_on_none_and_a_smaller_one_then_fits(shared_mag, tmp_path):
    parts, _ = shared_mag
    book = _local_graph(parts).books["author"]
    rows0 = int(book.range(0)[1] - book.range(0)[0])
    fits = EmbeddingSpec("t", "author", 4).nbytes(rows0)   # part 0's budget: dim 4 fits, dim 64 does not
    small = {"GRAPHFEED_EMBEDDING_BYTES": str(fits)}
    with running_cluster(parts, [0], log_dir=tmp_path / "l0", env=small) as s0, \
            running_cluster(parts, [1], log_dir=tmp_path / "l1", args=("--metrics-port", "0")) as s1:
        with gf.connect([s0[0].address, s1[0].address], timeout=60) as client:
            with pytest.raises(ValueError) as refused:
                client.embedding("author", dim=64, name="wide")
            text = str(refused.value)
            assert "\n" not in text and "on part 0" in text and "(embedding_bytes)" in text, text
            assert f"embedding budget {fits / (1 << 20):,.1f} MiB" in text, text
            assert not any(k[0] == "graphfeed_embedding_rows" and ("table", "wide") in k[1] for k in scrape(s1[0]))
            table = client.embedding("author", dim=4, name="wide")   # the retry: no half-made table in the way
            assert table.num_rows == book.num_nodes
            assert table.rows(torch.tensor([0, book.num_nodes - 1])).shape == (2, 4)
            assert scrape(s1[0])[("graphfeed_embedding_rows", (("table", "wide"),))] == book.num_nodes - rows0
            again = client.embedding("author", dim=4, name="wide")   # the same spec again: accepted
            assert torch.equal(again.bounds, table.bounds)
            table.close()
