"""Operators' and users' surface (issue 13): readiness, manifests, alert rules, JSON logs, the
implementation a server runs, the example config, and the client-only command line."""
from __future__ import annotations

import copy
import json
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, k8s
from helpers.cluster import SERVE_COMMAND, hermetic_env
from helpers.graphs import synthetic_parts

from graphfeed.core import metric_names
from graphfeed.server.daemon import metrics, sdnotify
from graphfeed.server.daemon.config import ConfigError, load_config

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s" / "graphfeed.yaml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
EXAMPLES = ROOT / "examples"
WAIT_S = 120.0     # bound on every wait for a daemon in these tests (shared, loaded CI machines)


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("ops") / "parts", nodes=600, avg_degree=6, features=4,
                           classes=3, parts=1, name="ops-600")


# ---- examples ---------------------------------------------------------------------------------------

def test_examples_readme_names_only_files_that_exist():
    text = (EXAMPLES / "README.md").read_text()
    named = set(re.findall(r"\b((?:examples|deploy|cli)/[\w./-]+\.\w+)", text))
    assert "examples/server.yaml" in named
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"examples/README.md names files that do not exist: {missing}"


def test_example_server_yaml_passes_the_daemon_config_loader(parts_dir):
    c = load_config(EXAMPLES / "server.yaml", environ={}, flags={"partition": str(parts_dir), "part": 0,
                                                                  "data_address": "127.0.0.1"})
    assert (c.host, c.port, c.metrics_port, c.log_format) == ("0.0.0.0", 50051, 9464, "json")
    assert c.effective_data_address == "127.0.0.1"
    run = subprocess.run([*SERVE_COMMAND, "--config", str(EXAMPLES / "server.yaml"), "--partition", str(parts_dir),
                          "--part", "0", "--check-config"], env=hermetic_env(), capture_output=True, text=True,
                         timeout=WAIT_S)
    assert run.returncode == 0, run.stderr
    assert "config ok:" in run.stdout


# ---- Kubernetes -------------------------------------------------------------------------------------

def _check_budgets(docs: dict[str, list[dict]]) -> None:
    """Every part has one PodDisruptionBudget (policy/v1, maxUnavailable 1) that selects that part's pods and no
    other part's, so a drain evicts at most one replica of a part and the others serve it; AssertionError naming
    the budget otherwise."""
    sets = k8s.statefulsets_by_part(docs)
    pods = {part: k8s.pod_labels(sts) for part, sts in sets.items()}
    budget_of: dict[int, str] = {}
    for pdb in docs.get("PodDisruptionBudget", []):
        name, spec = pdb["metadata"]["name"], pdb["spec"]
        assert pdb["apiVersion"] == "policy/v1", name
        assert spec.get("maxUnavailable") == 1 and "minAvailable" not in spec, f"{name}: {spec}"
        parts = [part for part, labels in pods.items() if k8s.selects(spec["selector"], labels)]
        assert len(parts) == 1, f"{name} selects the pods of parts {parts}: one budget per part"
        assert parts[0] not in budget_of, f"part {parts[0]} has two budgets: {budget_of.get(parts[0])}, {name}"
        budget_of[parts[0]] = name
        assert sets[parts[0]]["spec"]["replicas"] - spec["maxUnavailable"] >= 1, f"{name} may evict every replica"
    assert sorted(budget_of) == sorted(pods), f"parts without a budget: {sorted(set(pods) - set(budget_of))}"


def test_k8s_disruption_budget_and_network_policy_select_the_servers():
    docs = k8s.documents(K8S)
    _check_budgets(docs)
    pods = {part: k8s.pod_labels(sts) for part, sts in k8s.statefulsets_by_part(docs).items()}
    [netpol] = docs["NetworkPolicy"]
    assert netpol["spec"]["policyTypes"] == ["Ingress"]
    for part, labels in pods.items():
        assert k8s.selects(netpol["spec"]["podSelector"], labels), f"the policy leaves part {part}'s pods open"
    rules = netpol["spec"]["ingress"]
    # the rule without ports (any port: control plane and the torch RPC data path) admits trainers and servers
    [open_rule] = [r for r in rules if "ports" not in r]
    [trainers, servers] = open_rule["from"]
    assert trainers["podSelector"]["matchLabels"] == {"graphfeed.io/trainer": "true"}
    assert "namespaceSelector" in trainers
    for part, labels in pods.items():   # peer calls go between every part's and every replica's workers
        assert "namespaceSelector" not in servers and k8s.selects(servers["podSelector"], labels), part
    # every other rule names only ports the containers declare
    for sts in k8s.statefulsets_by_part(docs).values():
        container = k8s.server_container(sts)
        declared = {p["name"] for p in container["ports"]} | {p["containerPort"] for p in container["ports"]}
        for rule in rules:
            for port in rule.get("ports", []):
                assert port["port"] in declared, port


def _with_budget_selector(docs: dict[str, list[dict]], part: int, selector: dict) -> dict[str, list[dict]]:
    changed = copy.deepcopy(docs)
    [pdb] = [p for p in changed["PodDisruptionBudget"] if p["metadata"]["name"].endswith(f"part{part}")]
    pdb["spec"]["selector"] = selector
    return changed


def test_k8s_budget_check_catches_a_budget_over_every_part_or_a_part_without_one():
    docs = k8s.documents(K8S)
    _check_budgets(docs)
    every_server = {"matchLabels": {"app.kubernetes.io/name": "graphfeed-server"}}
    with pytest.raises(AssertionError, match=r"selects the pods of parts \[0, 1\]"):
        _check_budgets(_with_budget_selector(docs, 0, every_server))
    with pytest.raises(AssertionError, match=r"selects the pods of parts \[\]"):
        _check_budgets(_with_budget_selector(docs, 0, {"matchLabels": {k8s.PART_LABEL: "7"}}))
    by_expression = {"matchExpressions": [{"key": k8s.PART_LABEL, "operator": "In", "values": ["1"]}]}
    with pytest.raises(AssertionError, match="part 1 has two budgets"):
        _check_budgets(_with_budget_selector(docs, 0, by_expression))
    lax = copy.deepcopy(docs)
    lax["PodDisruptionBudget"][0]["spec"]["maxUnavailable"] = 2
    with pytest.raises(AssertionError, match="maxUnavailable"):
        _check_budgets(lax)
    missing = copy.deepcopy(docs)
    del missing["PodDisruptionBudget"][-1]
    with pytest.raises(AssertionError, match="parts without a budget"):
        _check_budgets(missing)


def test_k8s_placeholder_token_fails_the_daemon_config_validation(parts_dir):
    [secret] = k8s.documents(K8S)["Secret"]
    placeholder = secret["stringData"]["token"]
    env = {"GRAPHFEED_PARTITION": str(parts_dir), "GRAPHFEED_PART": "0", "GRAPHFEED_TOKEN": placeholder}
    with pytest.raises(ConfigError, match="placeholder") as err:
        load_config(environ=env)
    assert "GRAPHFEED_TOKEN" in str(err.value) and placeholder not in str(err.value)   # the secret is not echoed
    assert load_config(environ={**env, "GRAPHFEED_TOKEN": secrets.token_hex(32)}).token   # a real one passes
    run = subprocess.run([*SERVE_COMMAND, "--check-config"], env=hermetic_env(env), capture_output=True, text=True,
                         timeout=WAIT_S)
    assert run.returncode == 3 and "placeholder" in run.stderr, run.stderr


# ---- container ----------------------------------------------------------------------------------------

def test_containerfile_copies_every_package_and_documents_the_healthcheck_format():
    text = (DEPLOY / "container" / "Containerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) \./\1$", text, re.M))
    packages = {init.parent.name for init in ROOT.glob("*/__init__.py")}
    assert packages <= copied, f"the image would lack graphfeed.{sorted(packages - copied)}"
    assert "HEALTHCHECK" in text and "podman build --format docker" in text


# ---- Prometheus alert rules ---------------------------------------------------------------------------

def _exported(name: str) -> bool:
    return name in metrics.series_names() | metrics.series_names(metric_names.CLIENT_METRICS) | {"up"}


def _rule_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers before ``{``, ``[``, ``)`` or a comparison."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_labels = re.sub(r"\{[^}]*\}", "{}", no_strings)
    # label lists of aggregations and of vector matching name labels, not metrics
    no_by = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", no_labels)
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", no_by))
    functions = {"sum", "rate", "increase", "irate", "max", "min", "avg", "count", "histogram_quantile", "on",
                 "ignoring", "and", "or", "unless", "bool", "offset", "max_over_time", "min_over_time",
                 "avg_over_time", "sum_over_time", "count_over_time", "absent", "absent_over_time", "changes",
                 "resets", "delta", "deriv", "group_left", "group_right"}
    return {w for w in words if w not in functions and not re.fullmatch(r"\d+[smhd]?", w)}


def test_alert_rules_parse_cover_the_topics_and_name_exported_metrics():
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    for wanted in ("GraphfeedServerDown", "GraphfeedDataStallHigh", "GraphfeedWorkerReaped", "GraphfeedErrorsRising"):
        assert wanted in names, wanted
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        used = _rule_metrics(r["expr"])
        assert used, r["alert"]
        unknown = sorted(n for n in used if not _exported(n))
        assert not unknown, f"{r['alert']} names metrics graphfeed does not export: {unknown}"
    stall = next(r for r in rules if r["alert"] == "GraphfeedDataStallHigh")["expr"]
    assert "graphfeed_client_wait_seconds_total" in stall and "graphfeed_client_wall_seconds_total" in stall
    assert "alerts.yml" in yaml.safe_load(PROMETHEUS.read_text())["rule_files"]
    promtool = shutil.which("promtool")
    if promtool is not None:
        run = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr


def test_alert_rule_check_catches_a_made_up_metric():
    used = _rule_metrics('sum by (instance) (rate(graphfeed_made_up_total{kind="x"}[5m])) > 0')
    assert used == {"graphfeed_made_up_total"} and not _exported("graphfeed_made_up_total")
    matched = _rule_metrics("(count by (part) (up) == 1) and on (part) max_over_time(graphfeed_made_up_info[1h])")
    assert matched == {"up", "graphfeed_made_up_info"}
    assert _exported("graphfeed_groups_reaped_total") and _exported("graphfeed_client_batch_wait_seconds_bucket")


# ---- systemd readiness --------------------------------------------------------------------------------

def test_sd_notify_sends_to_path_and_abstract_sockets(tmp_path, monkeypatch):
    for address in (str(tmp_path / "notify.sock"), f"@graphfeed-test-{secrets.token_hex(4)}"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(address.replace("@", "\0", 1) if address.startswith("@") else address)
            sock.settimeout(10)
            monkeypatch.setenv("NOTIFY_SOCKET", address)
            assert sdnotify.notify("READY=1\nSTATUS=ok")
            assert sock.recv(4096) == b"READY=1\nSTATUS=ok"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert sdnotify.notify("READY=1") is False       # not under systemd: nothing to do


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_pid(monkeypatch):
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    assert sdnotify.watchdog_interval() == 2.0
    monkeypatch.setenv("WATCHDOG_PID", "1" if __import__("os").getpid() != 1 else "2")
    assert sdnotify.watchdog_interval() is None       # meant for another process
    monkeypatch.setenv("WATCHDOG_PID", "x")
    monkeypatch.setenv("WATCHDOG_USEC", "junk")
    assert sdnotify.watchdog_interval() is None


def _recv_until(sock: socket.socket, wanted: str, deadline: float) -> list[str]:
    got = []
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            msg = sock.recv(4096).decode()
        except TimeoutError:
            break
        got.append(msg)
        if wanted in msg.split("\n"):
            return got
    raise AssertionError(f"no {wanted!r} from the daemon within the wait; got {got}")


def test_daemon_notifies_ready_watchdog_and_stopping(parts_dir, tmp_path):
    address = str(tmp_path / "notify.sock")
    port_file = tmp_path / "port"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        env = hermetic_env({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000", "GRAPHFEED_LOG_FORMAT": "json"})
        proc = subprocess.Popen([*SERVE_COMMAND, "--partition", str(parts_dir), "--part", "0", "--port", "0",
                                 "--port-file", str(port_file)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            first = _recv_until(sock, "READY=1", time.monotonic() + WAIT_S)
            assert port_file.exists(), "READY=1 came before the port was announced"
            ready = next(m for m in first if "READY=1" in m)
            assert f"MAINPID={proc.pid}" in ready and "STATUS=serving part 0" in ready
            _recv_until(sock, "WATCHDOG=1", time.monotonic() + 10)          # every 0.5 s
            proc.send_signal(signal.SIGTERM)
            _recv_until(sock, "STOPPING=1", time.monotonic() + WAIT_S)
            _, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert all(json.loads(line) for line in err.splitlines()), err


# ---- the implementation a server runs, JSON logs ---------------------------------------------------

def test_forced_fallback_is_logged_once_shown_in_status_and_metrics_and_logs_stay_json(parts_dir, tmp_path):
    """GRAPHFEED_SAMPLER=reference: one sampler_fallback warning, native="false", status says reference;
    every stderr line of the daemon and its worker (which serves a real epoch) is JSON; the worker's
    data path listens on the configured data_address only."""
    import urllib.request

    import grpc
    import psutil
    from prometheus_client.parser import text_string_to_metric_families

    import graphfeed.client as gf
    from graphfeed.cli.status import probe
    from graphfeed.server.daemon.app import READY_PREFIX
    from graphfeed.testing.cluster import start_server

    server = start_server(parts_dir, 0, log_dir=tmp_path, args=("--log-format", "json", "--metrics-port", "0",
                                                                "--data-address", "127.0.0.1"),
                          env={"GRAPHFEED_SAMPLER": "reference"}, start_timeout=WAIT_S)
    try:
        with gf.connect([server.address], timeout=WAIT_S) as client:
            loader = client.neighbor_loader("train", [3, 2], batch_size=64, shuffle=True, seed=1, prefetch=2)
            assert sum(b.batch_size for b in loader) == loader_size(parts_dir)
            # the data path (the worker's listener) binds the configured data_address only
            worker = psutil.Process(client.servers[0].extra["worker_pid"])
            listening = {c.laddr.ip for c in worker.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
            assert listening == {"127.0.0.1"}, listening
        row = probe(server.address, grpc.insecure_channel, 30.0)
        assert row.sampler == "reference" and row.health == "SERVING", row
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as reply:
            text = reply.read().decode()
        build = [s.labels for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "graphfeed_build_info"]
        assert len(build) == 1 and build[0]["native"] == "false", build
    finally:
        assert server.stop(timeout=WAIT_S) == 0
    # the log file holds stderr and the one stdout line (the ready line)
    lines = [line for line in server.logs().splitlines() if not line.startswith(READY_PREFIX)]
    not_json = [line for line in lines if not _is_json_object(line)]
    assert not not_json, f"stderr lines that are not JSON: {not_json[:5]}"
    events = [json.loads(line) for line in lines]
    fallback = [e for e in events if e.get("event") == "sampler_fallback"]
    assert len(fallback) == 1 and fallback[0]["level"] == "warning", fallback
    assert "GRAPHFEED_SAMPLER=reference" in fallback[0]["cause"]
    assert any(e.get("event") == "serving" and e.get("sampler") == "reference" for e in events)


def loader_size(parts_dir: Path) -> int:
    from graphfeed.server.partition.format.layout import read_meta

    return int(read_meta(parts_dir).split_sizes["train"])


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


# ---- the command line without the server extras -------------------------------------------------------

BLOCK_SERVER_EXTRAS = """
import sys
from importlib.abc import MetaPathFinder
from graphfeed.cli.main import SERVER_EXTRA_MODULES, main

class Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in SERVER_EXTRA_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

for name in list(sys.modules):
    if name.split(".")[0] in SERVER_EXTRA_MODULES:
        del sys.modules[name]
sys.meta_path.insert(0, Missing())
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv", [["serve", "--partition", "PARTS", "--part", "0"],
                                  ["partition", "PARTS", "--num-parts", "2", "--output", "OUT"],
                                  ["status", "127.0.0.1:1"]])
def test_server_commands_in_a_client_only_install_say_what_to_install(argv, parts_dir, tmp_path):
    argv = [a.replace("PARTS", str(parts_dir)).replace("OUT", str(tmp_path / "out")) for a in argv]
    run = subprocess.run([sys.executable, "-c", BLOCK_SERVER_EXTRAS, *argv], env=hermetic_env(),
                         capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [run.stderr.strip()], run.stderr      # one line
    assert "pip install 'graphfeed[server]'" in run.stderr and f"graphfeed {argv[0]}:" in run.stderr


def test_version_flag():
    run = subprocess.run([*SERVE_COMMAND[:-1], "--version"], capture_output=True, text=True, timeout=WAIT_S)
    from importlib import metadata

    assert run.returncode == 0 and run.stdout.strip() == f"graphfeed {metadata.version('graphfeed')}", run


# ---- the trainer's close() ------------------------------------------------------------------------------

def test_leave_group_drops_only_the_closing_pipe_warnings(monkeypatch, capfd):
    import os

    import torch.distributed.rpc as rpc

    from graphfeed.transport import rpc_group

    def fake_shutdown(graceful):
        assert graceful is False
        os.write(2, b"[W tensorpipe_agent.cpp:723] RPC agent for trainer encountered error when reading incoming "
                    b"request from part0: pipe closed (this error originated at pipe_impl.cc:356)\n")
        os.write(2, b"something else went wrong\n")

    monkeypatch.setattr(rpc, "shutdown", fake_shutdown)
    rpc_group.leave_group()
    err = capfd.readouterr().err
    assert err == "something else went wrong\n"


TRAINER_CLOSE = """
import sys, graphfeed.client as gf
with gf.connect(sys.argv[1].split(","), timeout=120, transport="torch-rpc") as client:
    n = sum(b.batch_size for b in client.neighbor_loader("train", [3, 2], batch_size=32))
print(n, flush=True)
"""


@pytest.mark.slow
def test_a_normal_close_prints_no_tensorpipe_warning(tmp_path):
    from graphfeed.testing.cluster import running_cluster

    parts = synthetic_parts(tmp_path / "parts", nodes=400, avg_degree=4, features=4, classes=3, parts=2,
                            name="close-400")
    with running_cluster(parts, log_dir=tmp_path / "logs", env={"GRAPHFEED_DATA_PATH": "torch-rpc"}) as servers:
        run = subprocess.run([sys.executable, "-c", TRAINER_CLOSE, ",".join(s.address for s in servers)],
                             capture_output=True, text=True, timeout=WAIT_S, env=hermetic_env())
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == loader_size(parts)
    assert run.stderr == "", run.stderr
