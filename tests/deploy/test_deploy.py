"""deploy/: every file parses, agrees with the code (ports, exit codes, metric names), and its
commands run as they would in production where that is feasible on a test box."""
from __future__ import annotations

import configparser
import copy
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, k8s
from helpers.cluster import SERVE_COMMAND, hermetic_env, running_cluster
from helpers.graphs import synthetic_parts

from graphfeed.cli.main import build_parser
from graphfeed.core import metric_names
from graphfeed.server.daemon import metrics
from graphfeed.server.daemon.config import KEYS, ConfigError, ServerConfig, load_config
from graphfeed.server.daemon.exitcodes import ExitCode
from graphfeed.server.daemon.registry import WORKER_STOP_GRACE
from graphfeed.server.worker.settings import DOC, WorkerSettings

DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "graphfeed-server@.service"
EXAMPLE_CONFIG = DEPLOY / "config" / "server.yaml"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
K8S = DEPLOY / "k8s" / "graphfeed.yaml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "graphfeed.json"
CONTROL_PORT = ServerConfig.__dataclass_fields__["port"].default   # 50051
UNIT_INSTALL_PATH = "/opt/graphfeed/bin/graphfeed"


@pytest.fixture(scope="module")
def example() -> dict:
    return yaml.safe_load(EXAMPLE_CONFIG.read_text())


@pytest.fixture(scope="module")
def metrics_port(example) -> int:
    return int(example["metrics_port"])


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("deploy") / "parts", nodes=1000, avg_degree=8, features=8,
                           classes=3, parts=2, name="deploy-1000")


# ---- example config ---------------------------------------------------------------------------------

def test_example_config_passes_check_config(example, parts_dir, tmp_path):
    assert example["port"] == CONTROL_PORT
    cfg = tmp_path / "server-1.yaml"
    cfg.write_text(EXAMPLE_CONFIG.read_text().replace(example["partition"], str(parts_dir)))
    # as the systemd unit runs it: --config server-%i.yaml --part %i
    run = subprocess.run([*SERVE_COMMAND, "--config", str(cfg), "--part", "1", "--check-config"],
                         env=hermetic_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"partition={parts_dir} part=1 host=0.0.0.0 port={CONTROL_PORT}" in run.stdout
    c = load_config(cfg, environ={})
    assert c.metrics_port == example["metrics_port"] and c.log_format == "json"


def test_example_config_names_every_key():
    text = EXAMPLE_CONFIG.read_text()
    for key in ServerConfig.__dataclass_fields__:
        if key in ("token", "admin_token", "tokens"):   # as *_file / GRAPHFEED_*: tokens do not belong in a file
            continue
        assert re.search(rf"^#? ?{key}:", text, re.M), f"deploy/config/server.yaml does not mention {key}"


def test_example_config_names_only_real_keys_each_documented():
    """The other direction: every key the example sets or shows commented out is a setting of the schema; and
    every worker setting carries its one-line doc (``setting(default, doc)``), as the example's comments do."""
    named = re.findall(r"^#? ?([a-z_]+):", EXAMPLE_CONFIG.read_text(), re.M)
    assert named and not set(named) - set(KEYS), f"not settings: {sorted(set(named) - set(KEYS))}"
    assert [f.name for f in fields(WorkerSettings) if not f.metadata.get(DOC)] == []


# ---- systemd ----------------------------------------------------------------------------------------

def _unit() -> configparser.ConfigParser:
    p = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    p.optionxform = str
    p.read_string(UNIT.read_text())
    return p


def test_unit_restart_policy_matches_exit_codes_and_drain(example):
    s = _unit()["Service"]
    assert s["Restart"] == "on-failure"
    assert {int(c) for c in s["RestartPreventExitStatus"].split()} == {ExitCode.CONFIG, ExitCode.PARTITION}
    stop = float(s["TimeoutStopSec"])
    assert stop > example["drain_grace_seconds"] + WORKER_STOP_GRACE + 5, "stop timeout shorter than the drain"
    assert s["KillMode"] == "mixed", "SIGTERM must reach only the daemon, which drains its session workers"
    assert s["User"] == "graphfeed" and s["NoNewPrivileges"] == "yes" and s["ProtectSystem"] == "strict"
    for key in ("ProtectHome", "PrivateTmp", "ReadOnlyPaths", "CapabilityBoundingSet", "RestrictAddressFamilies"):
        assert key in s, key
    argv = shlex.split(s["ExecStart"])
    assert argv[:2] == [UNIT_INSTALL_PATH, "serve"] and "/etc/graphfeed/server-%i.yaml" in argv and "%i" in argv


def _header_commands(path: Path) -> list[list[str]]:
    """The command lines a file's header comment shows (``#   command args  # comment``), split as a shell would."""
    lines = [line[1:].split("#")[0].strip() for line in path.read_text().splitlines() if line.startswith("#   ")]
    return [shlex.split(line) for line in lines if line]


def test_unit_header_shows_a_rolling_restart_with_a_status_wait_the_cli_accepts():
    """Replicas of a part restart one host at a time: ``systemctl restart graphfeed-server@K``, then ``graphfeed
    status --wait`` on that replica before the next host; the status line is one the command line parses."""
    commands = _header_commands(UNIT)
    restart = commands.index(["systemctl", "restart", "graphfeed-server@K"])
    wait = commands[restart + 1]
    assert wait[0] == "graphfeed", wait
    parser, _ = build_parser(wait[1:])
    args = parser.parse_args(wait[1:])
    assert args.command == "status" and args.wait > 0 and args.servers == ["HOST:PORT"], args


def test_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian package `systemd`; .ci/run installs it)")
    # verify checks that ExecStart exists: point it at this checkout's graphfeed instead of /opt.
    graphfeed = Path(sys.executable).with_name("graphfeed")
    assert graphfeed.exists(), graphfeed
    (tmp_path / UNIT.name).write_text(UNIT.read_text().replace(UNIT_INSTALL_PATH, str(graphfeed)))
    run = subprocess.run([tool, "verify", str(tmp_path / "graphfeed-server@0.service")], capture_output=True,
                         text=True, timeout=120)
    # verify exits 0 on unknown keys or bad values but prints them: both streams must be clean.
    assert run.returncode == 0 and not run.stdout.strip() and not run.stderr.strip(), run.stdout + run.stderr


# ---- container --------------------------------------------------------------------------------------

def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined, comments dropped."""
    lines, out = [], []
    for raw in CONTAINERFILE.read_text().splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        lines.append(raw)
    text = "\n".join(lines).replace("\\\n", " ")
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _runtime_stage() -> list[tuple[str, str]]:
    ins = _instructions()
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last_from:]


def _env(stage) -> dict[str, str]:
    env = {}
    for word, rest in stage:
        if word == "ENV":
            env.update(dict(kv.split("=", 1) for kv in shlex.split(rest)))
    return env


def _healthcheck_argv(stage) -> list[str]:
    [rest] = [r for w, r in stage if w == "HEALTHCHECK"]
    return json.loads(rest[rest.index("CMD") + 3:].strip())


def test_containerfile_is_nonroot_pinned_and_consistent(metrics_port):
    ins = _instructions()
    runs = " ".join(r for w, r in ins if w == "RUN")
    assert "torch==2.13.0" in runs and "download.pytorch.org/whl/cpu" in runs
    stage = _runtime_stage()
    [user] = [r for w, r in stage if w == "USER"]
    assert user.split(":")[0] not in ("0", "root") and "useradd --system --uid 10001" in " ".join(
        r for w, r in stage if w == "RUN")
    words = [w for w, _ in stage]
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN"), "USER must follow every RUN"
    env = _env(stage)
    assert int(env["GRAPHFEED_PORT"]) == CONTROL_PORT and int(env["GRAPHFEED_METRICS_PORT"]) == metrics_port
    [expose] = [r for w, r in stage if w == "EXPOSE"]
    assert {int(p) for p in expose.split()} == {CONTROL_PORT, metrics_port}
    assert json.loads(dict(stage)["ENTRYPOINT"]) == [UNIT_INSTALL_PATH, "serve"]
    for src in re.findall(r"^COPY (\S+) \./\1$", CONTAINERFILE.read_text(), re.M):
        assert (DEPLOY.parent / src).is_dir(), f"Containerfile copies {src}, which does not exist"


def _image_command(argv: list[str]) -> list[str]:
    """The image's /opt/graphfeed/bin/X is this checkout's .venv/bin/X."""
    return [str(Path(sys.executable).with_name(Path(argv[0]).name)) if argv[0].startswith("/opt/graphfeed/bin/")
            else argv[0], *argv[1:]]


def test_container_entrypoint_and_healthcheck_run_as_in_the_image(parts_dir, tmp_path):
    stage = _runtime_stage()
    env = {k: v for k, v in _env(stage).items() if k.startswith("GRAPHFEED_")}
    env.update(GRAPHFEED_PARTITION=str(parts_dir), GRAPHFEED_PART="0", GRAPHFEED_HOST="127.0.0.1")
    entry = _image_command(json.loads(dict(stage)["ENTRYPOINT"]))
    run = subprocess.run([*entry, "--check-config"], env=hermetic_env(env), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    health = _image_command(_healthcheck_argv(stage))
    with running_cluster(parts_dir, parts=[0], log_dir=tmp_path) as [server]:
        ok = subprocess.run(health, env=hermetic_env({"GRAPHFEED_PORT": str(server.port)}), capture_output=True,
                            text=True, timeout=60)
        assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stdout + ok.stderr
    dead = subprocess.run(health, env=hermetic_env({"GRAPHFEED_PORT": str(server.port)}), capture_output=True,
                          text=True, timeout=60)
    assert dead.returncode == 1 and "unhealthy: UNAVAILABLE" in dead.stderr, dead.stdout + dead.stderr


# ---- compose, Kubernetes, Prometheus ----------------------------------------------------------------

def _compose_servers() -> dict[str, dict]:
    return {n: s for n, s in yaml.safe_load(COMPOSE.read_text())["services"].items() if n.startswith("server-")}


def test_compose_two_replicas_of_each_part_and_prometheus(metrics_port):
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    servers = _compose_servers()
    parts = [s["environment"]["GRAPHFEED_PART"] for s in servers.values()]
    assert sorted(set(parts)) == ["0", "1"] and all(parts.count(p) >= 2 for p in parts), parts
    published = []
    for name, s in servers.items():
        assert s["build"]["dockerfile"] == "deploy/container/Containerfile"
        assert (COMPOSE.parent / s["build"]["context"] / s["build"]["dockerfile"]).resolve() == CONTAINERFILE
        assert int(s["environment"]["GRAPHFEED_PORT"]) == CONTROL_PORT
        assert s["environment"]["GRAPHFEED_DATA_ADDRESS"] == name, "each replica's data path on its own address"
        targets = {int(p.rsplit(":", 1)[1]): p.rsplit(":", 1)[0] for p in s["ports"]}
        assert set(targets) == {CONTROL_PORT, metrics_port}, name
        published += targets.values()
        assert s["stop_grace_period"] == "60s" and s["read_only"] is True
    assert len(set(published)) == len(published), f"two servers publish one host port: {published}"
    # the trainers' addresses in the header are the published control ports: every replica of every part
    header = "".join(line for line in COMPOSE.read_text().splitlines() if line.startswith("#"))
    control = {p.rsplit(":", 1)[0] for s in servers.values() for p in s["ports"] if p.endswith(f":{CONTROL_PORT}")}
    assert set(re.findall(r'"(127\.0\.0\.1:\d+)"', header)) == control
    prom = services["prometheus"]
    mount = prom["volumes"][0].split(":")[0]
    assert (COMPOSE.parent / mount).resolve() == PROMETHEUS
    assert set(prom["depends_on"]) >= set(servers)
    scraped = _prometheus_targets()
    assert scraped == {f"{n}:{metrics_port}" for n in servers}


def _prometheus_targets() -> set[str]:
    doc = yaml.safe_load(PROMETHEUS.read_text())
    [job] = [j for j in doc["scrape_configs"] if j["job_name"] == "graphfeed-server"]
    return {t for sc in job["static_configs"] for t in sc["targets"]}


def test_k8s_a_statefulset_of_replicas_per_part_service_and_grpc_probes(metrics_port):
    """Parts 0..N-1 each have a StatefulSet of two or more replicas with GRAPHFEED_PART fixed to the part, its
    pods labelled with the part and selected by it alone; the headless Service names every pod; readiness is
    gRPC health of the control service (NOT_SERVING while a replica drains)."""
    docs = k8s.documents(K8S)
    [svc], [secret] = docs["Service"], docs["Secret"]
    sets = k8s.statefulsets_by_part(docs)
    assert sorted(sets) == list(range(len(sets))) and len(sets) >= 2, sorted(sets)
    assert svc["spec"]["clusterIP"] == "None" and {p["port"] for p in svc["spec"]["ports"]} == {
        CONTROL_PORT, metrics_port}
    for part, sts in sets.items():
        labels = k8s.pod_labels(sts)
        assert sts["metadata"]["name"] == f"graphfeed-server-part{part}"
        assert sts["spec"]["replicas"] >= 2, f"part {part}: one replica cannot restart while another serves"
        assert labels == {"app.kubernetes.io/name": "graphfeed-server", k8s.PART_LABEL: str(part)}
        assert k8s.selects(sts["spec"]["selector"], labels), f"part {part}: its selector misses its own pods"
        for other, other_sts in sets.items():   # overlapping StatefulSet selectors would fight over pods
            assert other == part or not k8s.selects(sts["spec"]["selector"], k8s.pod_labels(other_sts)), (part, other)
        assert sts["spec"]["serviceName"] == svc["metadata"]["name"] and k8s.selects(svc["spec"]["selector"], labels)
        # `kubectl rollout restart` replaces one pod at a time only with RollingUpdate (OnDelete: never)
        assert sts["spec"].get("updateStrategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
        _check_server_pod(sts, secret, metrics_port)


def _check_server_pod(sts: dict, secret: dict, metrics_port: int) -> None:
    pod, c, env = sts["spec"]["template"]["spec"], k8s.server_container(sts), k8s.env(sts)
    assert int(env["GRAPHFEED_PORT"]["value"]) == CONTROL_PORT
    assert int(env["GRAPHFEED_METRICS_PORT"]["value"]) == metrics_port
    assert env["GRAPHFEED_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == CONTROL_PORT, probe
    assert c["readinessProbe"]["grpc"]["service"] == "graphfeed.control.v1.Control"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"]
    grace = float(int(env["GRAPHFEED_DRAIN_GRACE_SECONDS"]["value"]))
    assert pod["terminationGracePeriodSeconds"] > grace + WORKER_STOP_GRACE + 5
    assert {p["containerPort"] for p in c["ports"]} == {CONTROL_PORT, metrics_port}
    assert env["GRAPHFEED_DATA_ADDRESS"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert {v["name"]: v for v in pod["volumes"]}["parts"]["persistentVolumeClaim"]["readOnly"] is True


def _as_part_k(sts: dict, part: int) -> dict:
    """``sts`` with its part written as K: its name, its part label and its GRAPHFEED_PART value."""
    text = json.dumps(sts)
    text = text.replace(f"graphfeed-server-part{part}", "graphfeed-server-partK")
    text = text.replace(f'"{k8s.PART_LABEL}": "{part}"', f'"{k8s.PART_LABEL}": "K"')
    text = text.replace(f'"name": "{k8s.PART_ENV}", "value": "{part}"', f'"name": "{k8s.PART_ENV}", "value": "K"')
    return json.loads(text)


def test_k8s_part_statefulsets_differ_only_in_their_part():
    """Each part's StatefulSet is a copy of part 0's with the part replaced (the header's way to add a part):
    a setting changed in one copy only (an image, a probe, a limit) fails here."""
    sets = k8s.statefulsets_by_part(k8s.documents(K8S))
    first = _as_part_k(sets[0], 0)
    assert first != sets[0] and "partK" in json.dumps(first)
    for part, sts in sets.items():
        assert _as_part_k(sts, part) == first, f"graphfeed-server-part{part} differs from part 0's beyond its part"
    changed = copy.deepcopy(sets[1])
    k8s.server_container(changed)["image"] = "graphfeed-server:0.0.9"
    assert _as_part_k(changed, 1) != first


def test_k8s_header_lists_every_replica_as_trainers_address_it():
    """The cluster YAML shown in the header names every pod of every part's StatefulSet by its stable DNS name
    (<StatefulSet>-<ordinal>.<headless Service>:<control port>), and nothing else."""
    lines = K8S.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#   servers:"))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("#     "):   # the list's continuation lines are indented deeper
            break
        block.append(line)
    shown = yaml.safe_load("\n".join(line[1:] for line in block))["servers"]
    docs = k8s.documents(K8S)
    pods = [f"{sts['metadata']['name']}-{ordinal}.{sts['spec']['serviceName']}:{CONTROL_PORT}"
            for sts in k8s.statefulsets_by_part(docs).values() for ordinal in range(sts["spec"]["replicas"])]
    assert sorted(shown) == sorted(pods)


def test_k8s_network_policy_admits_trainers_by_namespace_and_label():
    [policy] = [d for d in yaml.safe_load_all(K8S.read_text()) if d["kind"] == "NetworkPolicy"]
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    trainers = [p for p in peers if "graphfeed.io/trainer" in p.get("podSelector", {}).get("matchLabels", {})]
    assert trainers, "the policy admits no trainer pods"
    for peer in trainers:   # a label anyone can put on a pod is not enough: the namespace must match too
        assert peer.get("namespaceSelector", {}).get("matchLabels"), peer
    security = (DEPLOY.parent / "docs" / "how-to" / "security.md").read_text()
    assert "label alone" in security


def test_wildcard_host_needs_a_data_address_in_every_example(example):
    assert example["host"] == "0.0.0.0" and example["data_address"]
    with pytest.raises(ConfigError, match=r"host = '0.0.0.0' listens on every interface.*set data_address"):
        load_config(environ={}, flags={"partition": "p", "part": 0, "host": "0.0.0.0"})
    assert load_config(environ={}, flags={"partition": "p", "part": 0, "host": "::",
                                          "data_address": "10.0.0.5"}).effective_data_address == "10.0.0.5"
    for name, s in _compose_servers().items():
        assert s["environment"]["GRAPHFEED_HOST"] == "0.0.0.0" and s["environment"]["GRAPHFEED_DATA_ADDRESS"], name
    env = _env(_runtime_stage())
    assert env["GRAPHFEED_HOST"] == "0.0.0.0" and "GRAPHFEED_DATA_ADDRESS" in CONTAINERFILE.read_text()


# ---- Grafana ----------------------------------------------------------------------------------------

def _dashboard_metric_names() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in doc["templating"]["list"] if isinstance(v.get("query"), str)]
    assert exprs
    return {m for e in exprs for m in re.findall(r"\bgraphfeed_[a-z0-9_]+\b", e)}


def _known(name: str) -> bool:
    known = set(metrics.METRIC_NAMES) | set(metric_names.CLIENT_METRIC_NAMES)
    types = {**metrics.METRICS, **metric_names.CLIENT_METRICS}
    if name in known:
        return True
    for suffix, kinds in (("_bucket", ("histogram",)), ("_sum", ("histogram",)), ("_count", ("histogram",)),
                          ("_total", ("counter",))):
        base = name[:-len(suffix)] if name.endswith(suffix) else None
        if base in types and types[base].type in kinds:
            return True
    return False


def test_dashboard_names_only_existing_metrics_and_covers_the_topics():
    names = _dashboard_metric_names()
    unknown = sorted(n for n in names if not _known(n))
    assert not unknown, f"the dashboard uses metrics graphfeed does not export: {unknown}"
    for needed in ("graphfeed_batches_served_total", "graphfeed_stage_seconds_bucket",
                   "graphfeed_client_wait_seconds_total", "graphfeed_buffered_batches", "graphfeed_errors_total"):
        assert needed in names, needed
    titles = " ".join(p["title"].lower() for p in json.loads(DASHBOARD.read_text())["panels"])
    for topic in ("throughput", "latency", "stall", "buffer", "error"):
        assert topic in titles, topic


def test_dashboard_check_catches_a_made_up_metric():
    assert not _known("graphfeed_made_up_total") and not _known("graphfeed_uptime_seconds_bucket")
    assert _known("graphfeed_stage_seconds_count") and _known("graphfeed_errors_total")
