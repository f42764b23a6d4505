"""``graphfeed bench remote --hosts N [--link-rate 1gbit]``: the remote figures across emulated hosts.

One-host figures are not cross-host figures: on one host the shared-memory ring carries the
batches and same-host peers read each other's files.  Here the trainer runs on ``host0`` and part
*K*'s server on ``host{K+1}`` (:class:`graphfeed.testing.hosts.EmulatedHosts`: own network, PID,
mount and UTS namespaces, own ``/dev/shm``, own copy of its part), so every batch and every peer
call crosses a veth link, shaped to ``--link-rate`` when given.

The trainer process (this module's :func:`main`, on ``host0``) runs :func:`graphfeed.bench.remote.measure`
and stops before and after the measured epochs until this process has read its counters:

* ``seeds_per_s`` ... ``cpu_s_per_epoch_trainer``: as ``bench remote`` (trainer's own view);
* ``cpu_s_per_epoch_each``: CPU seconds per measured epoch of the trainer and of each server
  (daemon + session workers), read from here (``/proc``), and ``cpu_s_per_epoch`` their sum;
* ``links``: per host, MB sent and received per batch and bytes per seed (its veth's byte counters over
  the measured epochs / their batches or seeds), the rate in Gbit/s and, with ``--link-rate``, the
  utilisation of the busier direction (1.0 = the link is the limit);
* ``server_to_server_mb_per_batch`` / ``server_to_server_bytes_per_seed``: what the servers sent each
  other (all the servers sent less what the trainer received: every link ends at the one bridge).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

from graphfeed.bench.remote import RemoteBenchConfig, measure, server_logs, tree_cpu_s
from graphfeed.testing.hosts import EmulatedHosts, Host, LineReader, LinkCounters, unavailable
from graphfeed.transport import registry

PHASE_TIMEOUT_S = 3600.0   # a warm-up or the measured epochs
TRAINER_COMMAND = (sys.executable, "-m", "graphfeed.bench.hosts")


def bench_remote_hosts(cfg: RemoteBenchConfig, hosts: int, link_rate: str | None = None, tls: bool = False) -> dict:
    """Measure ``cfg`` with the trainer on host0 and one server per part on the other hosts; the JSON result.
    ``tls``: TLS on the servers with a self-signed certificate made for the hosts' addresses (the client's CA)."""
    from graphfeed.server.partition.format.layout import read_meta

    parts = read_meta(cfg.graph_folder).num_parts
    if hosts != parts + 1:
        raise ValueError(f"--hosts {hosts}: the trainer takes one host and each of the {parts} part(s) of "
                         f"{cfg.graph_folder} another: use --hosts {parts + 1}")
    emulated = EmulatedHosts(hosts, link_rate=link_rate)   # ValueError for a bad rate, before anything starts
    reason = unavailable()
    if reason:
        raise RuntimeError(f"--hosts: {reason}")
    with server_logs("graphfeed-bench-hosts-") as log_dir, emulated as em:
        probe = None
        if tls:
            import grpc

            cert, key = hosts_certificate(log_dir, [h.address for h in em.hosts])
            cfg = dataclasses.replace(cfg, tls_cert=cert, tls_key=key, transport=registry.SECURED_DEFAULT)
            with open(cert, "rb") as f:   # the health probe trusts the servers' certificate
                probe = grpc.ssl_channel_credentials(root_certificates=f.read())
        for k, host in enumerate(em.hosts[1:]):
            em.start_server(host, em.copy_parts(host, cfg.graph_folder, [k]), k, log_dir=log_dir,
                            env=cfg.server_env(), tls=probe)
        result = _run_trainer(em, cfg)
    result.update(hosts=hosts, link_rate=link_rate, servers=parts, peer_path="rpc (across hosts)",
                  graph=cfg.graph_folder, peer_cache_mb=cfg.peer_cache_mb)
    return result


def hosts_certificate(folder: str, addresses: list[str]) -> tuple[str, str]:
    """A self-signed certificate (EC P-256, valid 2 days) naming ``addresses``, and its key: PEM paths in ``folder``."""
    import datetime as dt
    import ipaddress
    import os

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key, now = ec.generate_private_key(ec.SECP256R1()), dt.datetime.now(dt.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "graphfeed emulated hosts")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = os.path.join(folder, "hosts.crt"), os.path.join(folder, "hosts.key")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cert_path, key_path


def _run_trainer(em: EmulatedHosts, cfg: RemoteBenchConfig) -> dict:
    spec = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    spec.update(servers=[s.address for s in em.servers], compare=False, graph=cfg.graph_folder)
    trainer = em[0].popen([*TRAINER_COMMAND, json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
    procs = {"trainer": [trainer.pid], **{f"part{s.part}": [s.pid] for s in em.servers}}
    reader = LineReader(trainer.stdout)
    _expect(trainer, reader, "warm")
    counters0, cpu0 = _counters(em), {k: tree_cpu_s(p) for k, p in procs.items()}
    _go(trainer)
    _expect(trainer, reader, "measured")
    counters1, cpu1 = _counters(em), {k: tree_cpu_s(p) for k, p in procs.items()}
    _go(trainer)
    result = json.loads(_expect(trainer, reader, "{"))
    if trainer.wait(60) != 0:
        raise RuntimeError(f"the trainer on {em[0].name} exited with code {trainer.returncode}")
    epochs = cfg.epochs
    each = {k: round((cpu1[k] - cpu0[k]) / epochs, 3) for k in procs}
    result["cpu_s_per_epoch_each"] = each
    result["cpu_s_per_epoch"] = round(sum(each.values()), 3)
    batches = max(1, result["batches_per_epoch"] * epochs)
    seeds = max(1, result["seeds_per_epoch"] * epochs)
    moved = {host.name: counters1[host.name] - counters0[host.name] for host in em.hosts}
    result["links"] = [_link(host, moved[host.name], batches, seeds, em.rate_bits) for host in em.hosts]
    between = max(0, sum(moved[h.name].sent for h in em.hosts[1:]) - moved[em.hosts[0].name].received)
    result["server_to_server_mb_per_batch"] = round(between / batches / 1e6, 3)
    result["server_to_server_bytes_per_seed"] = round(between / seeds, 1)
    return result


def _counters(em: EmulatedHosts) -> dict[str, LinkCounters]:
    return {host.name: host.counters() for host in em.hosts}


def _link(host: Host, moved: LinkCounters, batches: int, seeds: int, rate_bits: float | None) -> dict:
    role = "trainer" if host.index == 0 else f"part {host.index - 1}"
    gbit_out, gbit_in = (8 * b / max(moved.at, 1e-9) / 1e9 for b in (moved.sent, moved.received))
    return {"host": host.name, "role": role,
            "sent_mb_per_batch": round(moved.sent / batches / 1e6, 3),
            "received_mb_per_batch": round(moved.received / batches / 1e6, 3),
            "sent_bytes_per_seed": round(moved.sent / seeds, 1),
            "received_bytes_per_seed": round(moved.received / seeds, 1),
            "gbit_s_out": round(gbit_out, 3), "gbit_s_in": round(gbit_in, 3),
            "utilisation": None if rate_bits is None else round(max(gbit_out, gbit_in) * 1e9 / rate_bits, 3)}


def _expect(proc: subprocess.Popen, reader: LineReader, prefix: str) -> str:
    """The trainer's next line, which must start with ``prefix`` (bounded; RuntimeError with what it said)."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while time.monotonic() < deadline:
        line = reader.readline(deadline - time.monotonic())
        if not line:
            break
        if line.startswith(prefix):
            return line.strip()
    raise RuntimeError(f"the trainer on host0 did not report {prefix!r} within {PHASE_TIMEOUT_S:g} s "
                       f"(exit code {proc.poll()}; its error is above)")


def _go(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _handshake(phase: str) -> None:
    print(phase, flush=True)
    sys.stdin.readline()


def main(argv: list[str]) -> int:
    """The trainer on host0: ``measure`` with the config ``argv[0]`` (JSON), stopping at each phase."""
    spec = json.loads(argv[0])
    cfg = RemoteBenchConfig(**{**spec, "servers": tuple(spec["servers"]),
                               "num_neighbors": tuple(spec["num_neighbors"])})
    result = measure(cfg.servers, cfg, mark=_handshake)   # type: ignore[arg-type]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
