"""Two jobs on the same daemons with the same token: neither can touch the other (issue 36, items 2 and 3).

A victim trains while an attacker -- holding the cluster token and its own group, as a second job would --
calls every group- and session-scoped RPC on the victim's ids with its own capability and without one, lists
the servers' groups, and loads and overwrites the victim's embedding checkpoint by name.  Every call is
refused with PERMISSION_DENIED whose text holds none of the victim's numbers, the victim's epoch equals a run
without the attacker, its checkpoint files keep their bytes, GetStats shows the attacker only its own group
and the admin token sees both.  The config rules of ``admin_token`` and the capability helpers are checked
without processes.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest
from helpers.graphs import synthetic_parts

import graphfeed.client as gf
from graphfeed.server.daemon.config import ConfigError, load_config
from graphfeed.server.daemon.registry import RequestError
from graphfeed.server.daemon.security import CAPABILITY_HEADER, Authority, check_capability, holds, new_capability
from graphfeed.testing.cluster import running_cluster

TOKEN = "gf-tenant-token-5f0c2a9e71d4b8"
ADMIN = "gf-admin-token-93be1d07c6a24f"
TEAM_A, TEAM_B = "gf-team-a-7c41e9d02b5f38", "gf-team-b-0d6a3f8e91c27b"
CALL_TIMEOUT = 20.0
FANOUTS = [4, 3]
LOADER = dict(batch_size=64, shuffle=True, seed=11)
DIM = 4
ATTACK_TIMEOUT = 240.0   # seconds: the attacker process connects, pulls a batch, makes ~40 calls


# ---- without processes ------------------------------------------------------------------------------

def test_a_capability_is_compared_whole_and_the_refusal_names_only_the_callers_input():
    cap = new_capability()
    assert len(cap) == 32 and cap != new_capability()
    assert holds(cap, [("authorization", "Bearer x"), (CAPABILITY_HEADER, new_capability()), (CAPABILITY_HEADER, cap)])
    assert not holds(cap, [(CAPABILITY_HEADER, cap[:-1])]) and not holds(cap, []) and not holds(cap, None)
    with pytest.raises(RequestError) as refused:
        check_capability(cap, [(CAPABILITY_HEADER, cap[:16])], "group 'mine'")
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert "group 'mine'" in refused.value.message and CAPABILITY_HEADER in refused.value.message


def test_the_admin_token_passes_and_sees_all_the_trainers_token_does_not():
    authority = Authority(TOKEN, ADMIN)
    trainer, admin, wrong = ([("authorization", f"Bearer {t}")] for t in (TOKEN, ADMIN, "nope-" + TOKEN))
    assert authority.reason(trainer) is None and authority.reason(admin) is None
    assert authority.reason(wrong) == "wrong bearer token"
    assert authority.sees_all(admin) and not authority.sees_all(trainer)
    assert Authority(None).sees_all([])   # no token: no tenants to tell apart


def test_admin_token_config_rules(tmp_path):
    base = {"partition": str(tmp_path), "part": 0}
    admin_file = tmp_path / "admin"
    admin_file.write_text(ADMIN + "\n")
    c = load_config(environ={}, flags={**base, "token": TOKEN, "admin_token_file": str(admin_file)})
    assert c.admin_token == ADMIN and ADMIN not in repr(c)
    with pytest.raises(ConfigError, match="admin_token needs token"):
        load_config(environ={}, flags={**base, "admin_token": ADMIN})
    with pytest.raises(ConfigError, match="admin_token equals token"):
        load_config(environ={}, flags={**base, "token": TOKEN, "admin_token": TOKEN})
    with pytest.raises(ConfigError, match="give only one"):
        load_config(environ={}, flags={**base, "token": TOKEN, "admin_token": ADMIN,
                                       "admin_token_file": str(admin_file)})


def test_team_tokens_config_rules(tmp_path):
    base = {"partition": str(tmp_path), "part": 0}
    teams = tmp_path / "teams"
    teams.write_text(f"# team: token\nvision: {TEAM_A}\nranking: {TEAM_B}\n")
    c = load_config(environ={}, flags={**base, "tokens_file": str(teams), "admin_token": ADMIN})
    assert c.tokens == {"vision": TEAM_A, "ranking": TEAM_B} and c.authenticates and c.data_transport.authenticated
    assert TEAM_A not in repr(c) and TEAM_A not in c.summary()
    authority = Authority.of(c)
    assert authority.team([("authorization", f"Bearer {TEAM_B}")]) == "ranking"
    assert authority.reason([("authorization", f"Bearer {TEAM_A}")]) is None and not authority.sees_all([])
    refusals = [({"tokens": {"vision": TEAM_A, "ranking": TEAM_A}}, "two teams hold the same token"),
                ({"tokens": {"a/b": TEAM_A}}, "team names"),
                ({"tokens": {"vision": "short"}}, "team 'vision'"),
                ({"tokens": {"vision": TEAM_A}, "token": TEAM_A}, "a team holds the trainers' token"),
                ({"tokens": {"vision": TEAM_A}, "admin_token": TEAM_A}, "admin_token equals token")]
    for extra, message in refusals:
        with pytest.raises(ConfigError, match=re.escape(message)) as refused:
            load_config(environ={}, flags={**base, **extra})
        assert TEAM_A not in str(refused.value), "a config error echoes a token"


# ---- two jobs on two daemons ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("tenancy") / "parts", nodes=1500, avg_degree=6, features=8,
                           classes=3, parts=2, name="tenancy-1500")


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    env = {"GRAPHFEED_TOKEN": TOKEN, "GRAPHFEED_ADMIN_TOKEN": ADMIN, "GRAPHFEED_EMBEDDING_DIR": str(tables)}
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs"), env=env) as servers:
        yield servers, tables


def _connect(servers, job: str):
    return gf.connect([s.address for s in servers], timeout=60, token=TOKEN, job=job, reconnect_timeout=0)


def _seeds(batches) -> list[list[int]]:
    return [b.n_id[:b.batch_size].tolist() for b in batches]


# The attacker: a second trainer process (one graphfeed client per process) of job "attacker" holding the same
# token.  It calls every group- and session-scoped RPC on the victim's ids with its own capability and without
# one, lists the servers, and tries the victim's table by name; it prints what each call got, as JSON.
ATTACKER = textwrap.dedent("""
    import json, sys
    import grpc
    import graphfeed.client as gf
    from graphfeed.proto import control_pb2 as pb
    from graphfeed.proto import control_pb2_grpc as pb_grpc
    from graphfeed.server.daemon.security import CAPABILITY_HEADER

    a = json.loads(sys.argv[1])

    def call(address, method, request, token, capability=b""):
        metadata = [("authorization", "Bearer " + token)] + ([(CAPABILITY_HEADER, capability)] if capability else [])
        with grpc.insecure_channel(address) as channel:
            try:
                return getattr(pb_grpc.ControlStub(channel), method)(request, timeout=20, metadata=metadata)
            except grpc.RpcError as exc:
                return exc

    def answer(reply):
        if isinstance(reply, grpc.RpcError):
            return [reply.code().name, reply.details()]
        return ["OK", str(reply)]

    def stats(reply):
        return dict(groups_open=reply.groups_open, opened_total=reply.sessions_opened_total,
                    served_total=reply.batches_served_total, groups=sorted({r.group_id for r in reply.sessions}))

    out = {"refusals": [], "stats": []}
    with gf.connect(a["servers"], timeout=60, token=a["token"], job="attacker", reconnect_timeout=0) as me:
        out["own_group"] = me.group.group_id
        out["own_batch"] = next(iter(me.neighbor_loader("train", a["fanouts"], batch_size=32))).batch_size
        gid, spec = a["group"], pb.SamplingSpec(num_neighbors=a["fanouts"])
        endpoints = [me.group.endpoints[p] for p in sorted(me.group.endpoints)]
        for s in me.servers:
            sid = a["sessions"][s.part]   # the victim's session on this server
            calls = [("Heartbeat", pb.HeartbeatRequest(group_id=gid)),
                     ("JoinGroup", pb.JoinGroupRequest(group_id=gid, endpoints=endpoints)),
                     ("OpenSession", pb.OpenSessionRequest(group_id=gid, spec=spec, split="train", batch_size=8)),
                     ("StartEpoch", pb.StartEpochRequest(session_id=sid, epoch=1, part_input_counts=[1, 2])),
                     ("CloseSession", pb.CloseSessionRequest(session_id=sid)),
                     ("CloseGroup", pb.CloseGroupRequest(group_id=gid))]
            for method, request in calls:
                for capability in (s.capability, b""):
                    out["refusals"].append([method, *answer(call(s.address, method, request, a["token"], capability))])
            out["refusals"].append(["CloseGroup as admin", *answer(call(
                s.address, "CloseGroup", pb.CloseGroupRequest(group_id=gid), a["admin"]))])
            ask = pb.StatsRequest()
            out["stats"].append(dict(own=stats(call(s.address, "GetStats", ask, a["token"], s.capability)),
                                     blind=stats(call(s.address, "GetStats", ask, a["token"])),
                                     admin=stats(call(s.address, "GetStats", ask, a["admin"]))))
        stolen = me.embedding(dim=a["dim"], seed=3)
        try:
            stolen.load("latest")
            out["load"] = "loaded"
        except FileNotFoundError as exc:
            out["load"] = "FileNotFoundError: " + str(exc)
        stolen.save("latest")
    print("RESULT " + json.dumps(out))
""")


def _attack(servers, victim, loader) -> dict:
    args = dict(servers=[s.address for s in servers], token=TOKEN, admin=ADMIN, group=victim.group.group_id,
                sessions=loader.sessions, fanouts=FANOUTS, dim=DIM)
    run = subprocess.run([sys.executable, "-c", ATTACKER, json.dumps(args)], capture_output=True, text=True,
                         timeout=ATTACK_TIMEOUT, env=dict(os.environ))
    assert run.returncode == 0, f"the attacker process failed (exit {run.returncode}): {run.stderr[-3000:]}"
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the attacker printed no result: {run.stdout[-2000:]} {run.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _assert_refused_without_the_victims_data(refusal: list, victim, loader) -> None:
    method, code, text = refusal
    assert code == "PERMISSION_DENIED", f"{method} on the victim's ids answered {code}: {text}"
    secrets = [*map(str, loader.counts), *(str(s.extra["worker_pid"]) for s in victim.servers)]
    # a number on its own, not digits inside a hex id (a session id may begin with the same digits)
    leaked = [n for n in secrets if re.search(rf"(?<![0-9A-Za-z]){n}(?![0-9A-Za-z])", text)]
    assert not leaked, f"{method}'s refusal names the victim's numbers {leaked}: {text}"
    if method in ("StartEpoch", "CloseSession"):   # the caller gave a session id only: its group stays unnamed
        assert victim.group.group_id not in text, text


def _checkpoint_bytes(folder: Path) -> dict[str, bytes]:
    files = sorted(folder.rglob("*.pt"))
    assert files, f"no checkpoint under {folder}"
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


def test_a_second_job_with_the_same_token_cannot_touch_the_first(cluster):
    servers, tables = cluster
    with _connect(servers, "victim") as alone:   # the victim's epoch without an attacker
        reference = _seeds(alone.neighbor_loader("train", FANOUTS, **LOADER))
    with _connect(servers, "victim") as victim:
        table = victim.embedding(dim=DIM, seed=3)
        table.save("latest")
        saved = _checkpoint_bytes(tables / "victim")
        loader = victim.neighbor_loader("train", FANOUTS, **LOADER)
        it = iter(loader)
        first = [next(it) for _ in range(2)]
        got = _attack(servers, victim, loader)   # mid-epoch
        rest = list(it)
        assert got["own_batch"] > 0, "the attacker's own job works"
        assert len(got["refusals"]) == len(servers) * (1 + 2 * 6)
        for refusal in got["refusals"]:
            _assert_refused_without_the_victims_data(refusal, victim, loader)
        for seen in got["stats"]:   # its own group only, no server-wide counts; the admin token sees both
            assert seen["own"] == dict(groups_open=1, opened_total=0, served_total=0, groups=[got["own_group"]])
            assert seen["blind"] == dict(groups_open=0, opened_total=0, served_total=0, groups=[])
            assert seen["admin"]["groups"] == sorted([got["own_group"], victim.group.group_id])
            assert seen["admin"]["groups_open"] == 2 and seen["admin"]["opened_total"] >= 2
        # the victim's table by its name and tag is not in the attacker's namespace; the attacker's save stays there
        assert got["load"].startswith("FileNotFoundError") and "/attacker/" in got["load"], got["load"]
        assert _checkpoint_bytes(tables / "attacker").keys() == saved.keys()
        assert _checkpoint_bytes(tables / "victim") == saved, "the victim's checkpoint changed"
        table.load("latest")   # the victim's own checkpoint still loads
        assert victim.reconnects == 0
    assert _seeds(first + rest) == reference, "the victim's epoch differs from its run without the attacker"


def test_a_job_name_that_is_no_folder_name_is_refused_and_a_process_is_one_job(cluster):
    servers, _ = cluster
    with pytest.raises(ValueError, match=r"job = '\.\./victim' is not a job name"):
        _connect(servers, "../victim")
    with _connect(servers, "one") as client:
        with _connect(servers, "one") as again:   # the same job: the open client (a module imported twice)
            assert again is client
        with pytest.raises(RuntimeError, match="for job 'one', not 'two'"):
            _connect(servers, "two")


def test_a_team_cannot_reach_another_teams_checkpoints_by_claiming_its_job_name(parts_dir, tmp_path):
    """Per-team tokens: the token proves the team, so a second team that names itself after the victim's job
    still gets its own namespace (``@<team>/<job>``)."""
    tables = tmp_path / "tables"
    env = {"GRAPHFEED_TOKENS": f"vision: {TEAM_A}\nranking: {TEAM_B}", "GRAPHFEED_EMBEDDING_DIR": str(tables)}
    with running_cluster(parts_dir, log_dir=tmp_path / "logs", env=env) as servers:
        addresses = [s.address for s in servers]
        with gf.connect(addresses, timeout=60, token=TEAM_A, job="victim", reconnect_timeout=0) as victim:
            victim.embedding(dim=DIM, seed=3).save("latest")
        saved = _checkpoint_bytes(tables / "@vision" / "victim")
        with gf.connect(addresses, timeout=60, token=TEAM_B, job="victim", reconnect_timeout=0) as other:
            table = other.embedding(dim=DIM, seed=5)
            with pytest.raises(FileNotFoundError, match="@ranking"):
                table.load("latest")
            table.save("latest")
        assert _checkpoint_bytes(tables / "@ranking" / "victim").keys() == saved.keys()
        assert _checkpoint_bytes(tables / "@vision" / "victim") == saved
        with pytest.raises(gf.ClusterError, match="UNAUTHENTICATED"):   # a token of no team
            gf.connect(addresses, timeout=30, token=TOKEN, reconnect_timeout=0)
