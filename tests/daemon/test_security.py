"""Control-plane security through real daemons: TLS/mTLS, bearer token, session secrets; config keys.

Certificates are generated per module (tests/helpers/pki.py).  Every rejection is checked
for its gRPC status, its log line (token rejections) and that the daemon still serves.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.cluster import hermetic_env
from helpers.graphs import synthetic_parts
from helpers.pki import make_pki

import graphfeed.client as gf
from graphfeed.client.security import ClientSecurity
from graphfeed.client.security import resolve as resolve_client
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.daemon import healthcheck
from graphfeed.server.daemon.config import ConfigError, load_config
from graphfeed.server.daemon.exitcodes import ExitCode
from graphfeed.testing.cluster import SERVE_COMMAND, ServerProcess, start_server

TOKEN = "gf-test-token-0123456789abcdef"
CALL_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("security") / "parts", nodes=2000, avg_degree=8, features=16,
                           classes=4, parts=1, name="security-2000")


@pytest.fixture(scope="module")
def mtls_server(pki, parts_dir, tmp_path_factory):
    """mTLS (client certificates from the test CA) + token (from GRAPHFEED_TOKEN); health probed over mTLS."""
    server = start_server(parts_dir, 0, log_dir=tmp_path_factory.mktemp("logs"),
                          args=["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                                "--tls-client-ca", str(pki.ca)], env={"GRAPHFEED_TOKEN": TOKEN},
                          tls=_good(pki).credentials())
    yield server
    server.stop(expect=0)


def _good(pki, token: str | None = TOKEN) -> ClientSecurity:
    return ClientSecurity(token=token, tls_ca=str(pki.ca), tls_cert=str(pki.client_cert), tls_key=str(pki.client_key))


def _info(security: ClientSecurity, address: str) -> pb.ClusterInfo:
    with security.channel(address) as ch:
        return pb_grpc.ControlStub(ch).GetClusterInfo(pb.ClusterInfoRequest(), timeout=CALL_TIMEOUT)


def _code(security: ClientSecurity, address: str) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        _info(security, address)
    return err.value.code()


def _assert_still_serving(pki, server: ServerProcess) -> None:
    assert server.proc.poll() is None, f"the daemon exited: {server.log_tail()}"
    assert _info(_good(pki), server.address).part_id == 0
    args = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
    assert healthcheck.main([server.address, *args]) == 0


def _rejections(server: ServerProcess) -> list[str]:
    return [line for line in server.logs().splitlines() if "event=auth_rejected" in line]


# ---- the happy path ---------------------------------------------------------------------------------

def test_tls_token_happy_path_epoch_and_session_secret(pki, mtls_server, tmp_path):
    import torch.distributed.rpc as rpc

    cluster = tmp_path / "cluster.yaml"
    (tmp_path / "token").write_text(TOKEN + "\n")
    cluster.write_text(f"servers: [{mtls_server.address}]\ntoken_file: token\n"
                       f"tls: {{ca: {pki.ca}, cert: {pki.client_cert}, key: {pki.client_key}}}\n")
    with gf.connect(str(cluster), timeout=60) as client:
        loader = client.neighbor_loader("train", [4, 2], batch_size=32, shuffle=True, seed=1)
        batches = list(loader)
        assert len(batches) == len(loader) > 0
        seeds = torch.cat([b.n_id[:b.batch_size] for b in batches])
        assert seeds.numel() == client.split_sizes["train"] == seeds.unique().numel()
        # a server with a token and TLS serves the secure data path: no torch RPC agent in this process
        assert client.group.data_path == "secure" and not rpc.api._is_current_rpc_agent_set()
        # Another holder of the group's key knowing the session id but not its secret cannot take batches.
        session_id = loader.sessions[0]
        calls = client.group.calls
        for bad in (b"\0" * 32, b""):
            with pytest.raises(PermissionError, match="PermissionError.*wrong session secret"):
                calls.call_sync(0, "pull", (session_id, 1, 0, bad), 20)
        with pytest.raises(PermissionError, match="PermissionError.*wrong session secret"):
            calls.call_sync(0, "pull", (session_id, 1, 0), 20)
        assert len(list(loader)) == len(loader)  # the right secret still works afterwards
    assert not _rejections(mtls_server)
    assert TOKEN not in mtls_server.logs()


# ---- rejections -------------------------------------------------------------------------------------

def test_token_rejections_are_unauthenticated_logged_and_harmless(pki, mtls_server):
    before = len(_rejections(mtls_server))
    assert _code(_good(pki, token=None), mtls_server.address) is grpc.StatusCode.UNAUTHENTICATED
    assert _code(_good(pki, token="x" * len(TOKEN)), mtls_server.address) is grpc.StatusCode.UNAUTHENTICATED
    with _good(pki, token=None).channel(mtls_server.address) as ch:  # not a Bearer header
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.ControlStub(ch).GetStats(pb.StatsRequest(), metadata=[("authorization", f"Basic {TOKEN}")],
                                             timeout=CALL_TIMEOUT)
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(gf.ClusterError, match="UNAUTHENTICATED.*bearer token"):
        gf.connect([mtls_server.address], timeout=20, token="y" * 20, tls_ca=pki.ca, tls_cert=pki.client_cert,
                   tls_key=pki.client_key)
    _assert_still_serving(pki, mtls_server)
    lines = _rejections(mtls_server)[before:]
    assert len(lines) == 4, lines
    reasons = [re.search(r'reason="([^"]*)"', line).group(1) for line in lines]
    assert reasons[0].startswith("no authorization metadata") and reasons[1] == "wrong bearer token"
    assert reasons[2].startswith("authorization metadata is not") and reasons[3] == "wrong bearer token"
    assert all("peer=ipv4:127.0.0.1:" in line and "method=/graphfeed.control.v1.Control/" in line for line in lines)
    assert TOKEN not in mtls_server.logs()


def test_health_needs_no_token_but_reflection_does(pki, mtls_server):
    with _good(pki, token=None).channel(mtls_server.address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stream = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=CALL_TIMEOUT)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_and_foreign_client_certificates_fail_the_handshake(pki, mtls_server):
    address = mtls_server.address
    assert _code(ClientSecurity(token=TOKEN), address) is grpc.StatusCode.UNAVAILABLE          # plain text
    assert _code(ClientSecurity(token=TOKEN, tls_ca=str(pki.ca)), address) is grpc.StatusCode.UNAVAILABLE  # no cert
    rogue = ClientSecurity(token=TOKEN, tls_ca=str(pki.ca), tls_cert=str(pki.rogue_client_cert),
                           tls_key=str(pki.rogue_client_key))
    assert _code(rogue, address) is grpc.StatusCode.UNAVAILABLE                                   # wrong CA
    assert healthcheck.main([address]) == 1  # the plain-text probe fails too
    _assert_still_serving(pki, mtls_server)


def test_expired_server_certificate_is_refused_by_the_client(pki, parts_dir, tmp_path):
    # no client completes a handshake with an expired certificate: ready = the port file (written once SERVING)
    server = start_server(parts_dir, 0, log_dir=tmp_path, args=["--tls-cert", str(pki.expired_server_cert),
                                                                "--tls-key", str(pki.expired_server_key)],
                          check_health=False)
    try:
        sec = ClientSecurity(token=None, tls_ca=str(pki.ca))
        assert _code(sec, server.address) is grpc.StatusCode.UNAVAILABLE
        assert healthcheck.main([server.address, "--tls-ca", str(pki.ca)]) == 1
        with pytest.raises(gf.ClusterError, match="cannot reach graphfeed server"):
            gf.connect([server.address], timeout=3, tls_ca=pki.ca)
        assert server.proc.poll() is None
    finally:
        server.stop(expect=0)


def test_mismatched_key_is_a_config_error_exit(pki, parts_dir, tmp_path):
    proc = subprocess.run([*SERVE_COMMAND, "--partition", str(parts_dir), "--part", "0", "--port", "0",
                           "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.client_key)],
                          env=hermetic_env(), capture_output=True, text=True, timeout=120)
    # gRPC may accept the pair at bind time and fail each handshake instead; either way it must not serve TLS
    # with a key that does not match.  We require the clear startup failure.
    assert proc.returncode == ExitCode.CONFIG, proc.stderr[-2000:]
    assert "does the key belong to the certificate" in proc.stderr


# ---- configuration ----------------------------------------------------------------------------------

def test_config_tls_keys_validation(pki, tmp_path):
    base = dict(partition="p", part=0)
    c = load_config(environ={}, flags={**base, "tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key),
                                       "tls_client_ca": str(pki.ca), "tls_peer_ca": str(pki.ca), "token": TOKEN})
    assert c.tls and c.tls_client_ca == str(pki.ca) == c.tls_peer_ca and "tls=mtls token=on" in c.summary()
    assert TOKEN not in repr(c) and TOKEN not in c.summary()
    bad = [
        ({"tls_cert": str(pki.server_cert)}, "tls_cert is set but tls_key is not"),
        ({"tls_key": str(pki.server_key)}, "tls_key is set but tls_cert is not"),
        ({"tls_client_ca": str(pki.ca)}, "tls_client_ca .mTLS. needs TLS"),
        ({"tls_peer_ca": str(pki.ca)}, "tls_peer_ca .checking the other daemons' data-path certificates. needs TLS"),
        ({"tls_peer_ca": str(pki.server_key), "tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key)},
         "tls_peer_ca .* is not a PEM CA certificate"),
        ({"tls_cert": str(tmp_path / "nope.crt"), "tls_key": str(pki.server_key)}, "does not exist"),
        ({"tls_cert": str(pki.server_key), "tls_key": str(pki.server_key)}, "is not a PEM certificate"),
        ({"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_cert)}, "is not a PEM private key"),
        ({"token": "short"}, "at least 16 printable ASCII"),
        ({"token": "has space " * 3}, "at least 16 printable ASCII"),
        ({"token": TOKEN, "token_file": str(pki.ca)}, "give only one"),
    ]
    for extra, message in bad:
        with pytest.raises(ConfigError, match=message) as err:
            load_config(environ={}, flags={**base, **extra})
        assert "short" not in str(err.value) or extra.get("token") != "short"  # token values are never echoed
    if os.geteuid() != 0:  # root reads any file
        unreadable = tmp_path / "unreadable.crt"
        unreadable.write_bytes(pki.server_cert.read_bytes())
        unreadable.chmod(0)
        with pytest.raises(ConfigError, match="cannot be read"):
            load_config(environ={}, flags={**base, "tls_cert": str(unreadable), "tls_key": str(pki.server_key)})


def test_config_token_file_and_env_precedence(pki, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("file-token-0123456789\n")
    other = tmp_path / "other.crt"
    other.write_bytes(pki.client_cert.read_bytes())
    cfg = tmp_path / "server.yaml"
    cfg.write_text(f"partition: p\npart: 0\ntoken_file: {token_file}\ntls_cert: {pki.server_cert}\n"
                   f"tls_key: {pki.server_key}\n")
    c = load_config(cfg, environ={})
    assert c.token == "file-token-0123456789" and c.token_file == str(token_file)
    env = {"GRAPHFEED_TLS_CERT": str(other), "GRAPHFEED_TOKEN_FILE": "", "GRAPHFEED_TOKEN": "env-token-0123456789"}
    c = load_config(cfg, environ=env)       # env beats the file; "" switches token_file off
    assert (c.tls_cert, c.token, c.token_file) == (str(other), "env-token-0123456789", None)
    c = load_config(cfg, environ=env, flags={"tls_cert": str(pki.server_cert)})   # flags beat env
    assert c.tls_cert == str(pki.server_cert)
    with pytest.raises(ConfigError, match=r"both token \(environment variable GRAPHFEED_TOKEN\) and token_file "
                                          r"\(config file"):
        load_config(cfg, environ={"GRAPHFEED_TOKEN": "env-token-0123456789"})
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="holds no usable token"):
        load_config(environ={}, flags={"partition": "p", "part": 0, "token_file": str(empty)})
    cfg.write_text("partition: p\npart: 0\ntls_certificate: x\n")
    with pytest.raises(ConfigError, match="unknown key 'tls_certificate'"):
        load_config(cfg, environ={})


def test_check_config_cli_good_and_bad_tls(pki, parts_dir, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(f"partition: {parts_dir}\npart: 0\ntls_cert: {pki.server_cert}\ntls_key: {pki.server_key}\n"
                    f"tls_client_ca: {pki.ca}\n")
    run = subprocess.run([*SERVE_COMMAND, "--config", str(good), "--check-config"], env=hermetic_env(
        {"GRAPHFEED_TOKEN": TOKEN}), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "config ok:" in run.stdout and "tls=mtls token=on" in run.stdout and TOKEN not in run.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"partition: {parts_dir}\npart: 0\ntls_cert: {pki.server_cert}\n")
    run = subprocess.run([*SERVE_COMMAND, "--config", str(bad), "--check-config"], env=hermetic_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == ExitCode.CONFIG
    assert run.stderr.count("\n") == 1 and "tls_cert is set but tls_key is not" in run.stderr


def test_client_security_sources(pki, tmp_path, monkeypatch):
    doc = {"token_file": "tok", "tls": {"ca": "ca.crt"}}
    (tmp_path / "tok").write_text("yaml-token-0123\n")
    (tmp_path / "ca.crt").write_bytes(pki.ca.read_bytes())
    env = {"GRAPHFEED_TOKEN": "env-token"}
    sec = resolve_client(cluster_doc=doc, cluster_path=tmp_path / "c.yaml", environ=env)
    assert sec.token == "yaml-token-0123" and sec.tls_ca == str(tmp_path / "ca.crt") and sec.tls
    assert resolve_client(environ=env).token == "env-token"
    assert resolve_client(token="arg-token", cluster_doc=doc, cluster_path=tmp_path / "c.yaml",
                          environ=env).token == "arg-token"
    assert "env-token" not in repr(resolve_client(environ=env))
    with pytest.raises(gf.ClusterError, match="tls_cert and tls_key"):
        resolve_client(tls_ca=pki.ca, tls_cert=pki.client_cert, environ={})
    with pytest.raises(gf.ClusterError, match="cannot read tls_ca"):
        resolve_client(tls_ca=tmp_path / "missing.crt", environ={})
    with pytest.raises(gf.ClusterError, match="tls must be a mapping"):
        resolve_client(cluster_doc={"tls": {"cafile": "x"}}, environ={})
