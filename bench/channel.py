"""The secure data path's channel alone (``graphfeed bench channel``): CPU per GB to send and to receive.

A :class:`~graphfeed.transport.secure.SecureServer` runs in a child process and answers ``blob(n)``
with a tensor of ``n`` bytes (made once per size); this process calls it with ``inflight`` calls
in flight until ``megabytes`` have arrived, over loopback, with or without TLS.  Each byte is
therefore sent (framed, MACed or encrypted) once by the child and received (read, checked or
decrypted) once here, as a batch travels from a worker to the trainer.

Figures (one JSON line):

* ``gb_per_s``: payload GB (1e9 bytes) per wall-clock second;
* ``send_cpu_s_per_gb`` / ``recv_cpu_s_per_gb``: CPU seconds (user + system, every thread) of the
  child / this process per payload GB, measured over the timed calls only (start-up, the TLS
  handshake and warm-up calls that fill the reused receive buffers excluded); the cheapest of
  ``repeats`` runs (each run's figures are in ``runs``: on a loaded machine they spread widely);
* ``cipher`` / ``protocol``: the suite of the TLS set-up (``None`` without TLS); the frames after it are
  sealed with AES-256-GCM (:mod:`graphfeed.transport.secure`);
* ``aead_seal_cpu_s_per_gb`` / ``aead_open_cpu_s_per_gb`` (TLS): AES-256-GCM alone, through the same
  library and in the same 1 MiB pieces as the frames -- the bound the channel's send / receive approach;
* ``openssl_speed`` (TLS): ``openssl speed`` of the TLS suite's AES-GCM in 16 KiB blocks (a TLS record)
  as CPU-s per GB, in the OpenSSL Python's :mod:`ssl` links -- what TLS records would pay for the cipher
  (``None`` when the ``openssl`` command is another version);
* ``gmac_cpu_s_per_gb`` (no TLS): AES-128-GMAC, the plain frames' body MAC.

Loopback puts the kernel's copy on both ends into the same machine's figures; a real link has it too.
``--hosts 2`` runs the server on one emulated host and the receiver on another
(:class:`graphfeed.testing.hosts.EmulatedHosts`: a veth link through a bridge), so the receive figure is the
one a trainer pays off its host (``bench remote --hosts``), without the sampling around it; the CPU figures
are then read from ``/proc`` for each host's process tree.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

RECORD = 16 << 10   # bytes of a TLS record's plaintext at most
CALL_TIMEOUT = 60.0   # seconds a blob call, and the server process's CPU reading, may take


@dataclass(frozen=True)
class ChannelBenchConfig:
    """What ``bench channel`` measures: ``megabytes`` (MiB) in frames of ``frame_mb`` MiB, ``inflight`` calls in
    flight, over TLS (a self-signed certificate made for the run) or the MAC'd plain channel."""

    megabytes: float = 1024.0
    frame_mb: float = 8.0
    inflight: int = 4
    tls: bool = True
    repeats: int = 3
    hosts: int = 0   # 0: loopback, the receiver in this process; 2: server and receiver on two emulated hosts

    def __post_init__(self):
        if self.megabytes <= 0 or self.frame_mb <= 0 or self.frame_mb > self.megabytes:
            raise ValueError(f"--mb and --frame-mb must be positive with --frame-mb <= --mb, got {self.megabytes} "
                             f"and {self.frame_mb}")
        if self.inflight < 1 or self.repeats < 1:
            raise ValueError(f"--inflight and --repeats must be >= 1, got {self.inflight} and {self.repeats}")
        if self.hosts not in (0, 2):
            raise ValueError(f"--hosts takes 2 (the server on one emulated host, the receiver on another), "
                             f"got {self.hosts}")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _blob_server(host: str, key: bytes, cert: str | None, keyfile: str | None):
    """A started secure-path server on ``host`` answering ``blob(n)``: ``n`` random bytes (made once per size)."""
    from graphfeed.transport.secure import Function, SecureServer, TlsServer

    torch.set_num_threads(1)
    blobs: dict[int, torch.Tensor] = {}

    def blob(n: int) -> torch.Tensor:
        if n not in blobs:
            blobs[n] = torch.randint(0, 256, (int(n),), dtype=torch.uint8)
        return blobs[n]

    tls = TlsServer(cert, keyfile) if cert and keyfile else None
    return SecureServer(host, key, {"blob": Function(blob)}, name="bench", tls=tls, threads=4).start()


def _serve(key: bytes, cert: str | None, keyfile: str | None, pipe) -> None:
    """The child: answer ``blob(n)``; report the CPU seconds between the parent's "mark" messages."""
    server = _blob_server("127.0.0.1", key, cert, keyfile)
    pipe.send(server.address)
    try:
        while (msg := pipe.recv()) != "stop":
            assert msg == "mark"
            pipe.send(_cpu())
    finally:
        server.close()


def _gmac_cpu_s_per_gb(megabytes: int = 256) -> float:
    """CPU seconds per GB of AES-128-GMAC (the plain channel's body MAC, through ``cryptography``) in 1 MiB calls."""
    from graphfeed.transport.secure.frames import _body_tag

    block, key = os.urandom(1 << 20), os.urandom(16)
    t0 = time.process_time()
    for k in range(megabytes):
        _body_tag(key, k.to_bytes(8, "big"), [block])
    return (time.process_time() - t0) / (megabytes * (1 << 20) / 1e9)


def openssl_speed(cipher: str, seconds: int = 1) -> dict | None:
    """``openssl speed`` of ``cipher`` (e.g. ``aes-256-gcm``) in 16 KiB blocks, encrypt and decrypt, as CPU seconds
    per GB -- when the ``openssl`` command is the library Python's :mod:`ssl` uses (else None)."""
    import shutil
    import ssl
    import subprocess

    exe = shutil.which("openssl")
    if exe is None:
        return None
    version = subprocess.run([exe, "version"], capture_output=True, text=True).stdout.split()
    if len(version) < 2 or version[1] not in ssl.OPENSSL_VERSION:
        return None
    out: dict = {"library": ssl.OPENSSL_VERSION, "cipher": cipher}
    for label, extra in (("seal", []), ("open", ["-decrypt"])):
        run = subprocess.run([exe, "speed", "-seconds", str(seconds), "-bytes", str(RECORD), *extra,
                              "-evp", cipher], capture_output=True, text=True)
        rate = [line.split()[-1] for line in run.stdout.splitlines() if line.upper().startswith(cipher.upper())]
        if not rate or not rate[-1].endswith("k"):
            return None
        out[f"{label}_cpu_s_per_gb"] = round(1e9 / (float(rate[-1][:-1]) * 1000), 3)   # "k" = 1000 bytes/s
    return out


def aead_cpu_s_per_gb(megabytes: int = 256) -> tuple[float, float]:
    """CPU seconds per GB of AES-256-GCM through ``cryptography`` in
    :data:`~graphfeed.transport.secure.frames.SEAL_CHUNK` pieces, encrypt and decrypt (into a buffer, as sealed frames
    do): the cipher alone that TLS frames pay."""
    from graphfeed.transport.secure.frames import SEAL_CHUNK, SEAL_SLACK, _gcm

    key, piece = os.urandom(32), memoryview(os.urandom(SEAL_CHUNK))
    out = memoryview(bytearray(SEAL_CHUNK + SEAL_SLACK))
    frames = max(1, megabytes // 8)
    costs = []
    for decrypt in (False, True):
        t0 = time.process_time()
        for f in range(frames):
            cipher = _gcm(key, f.to_bytes(12, "big"))
            ctx = cipher.decryptor() if decrypt else cipher.encryptor()
            for _ in range(8):
                ctx.update_into(piece, out)
        costs.append(time.process_time() - t0)
    gb = frames * 8 * SEAL_CHUNK / 1e9
    return costs[0] / gb, costs[1] / gb


def _certificate(folder: str) -> tuple[str, str]:
    from graphfeed.bench.hosts import hosts_certificate

    return hosts_certificate(folder, ["127.0.0.1"])


def _pull(calls, frame: int, frames: int, inflight: int) -> None:
    """``frames`` calls of ``blob(frame)`` with ``inflight`` in flight; checks every answer's size."""
    pending: list = []
    sent = 0
    while sent < frames or pending:
        while sent < frames and len(pending) < inflight:
            pending.append(calls.call(0, "blob", (frame,), CALL_TIMEOUT))
            sent += 1
        got = pending.pop(0).result(CALL_TIMEOUT + 10)
        if got.numel() != frame:
            raise RuntimeError(f"bench channel: a frame of {got.numel()} bytes, expected {frame}")


def bench_channel(cfg: ChannelBenchConfig) -> dict:
    if cfg.hosts:
        from graphfeed.testing.hosts import unavailable

        reason = unavailable()
        if reason:
            raise RuntimeError(f"--hosts: {reason}")
    with tempfile.TemporaryDirectory(prefix="graphfeed-bench-channel-") as folder:
        if cfg.hosts:
            result = _measure_hosts(cfg, folder)
        else:
            cert, keyfile = _certificate(folder) if cfg.tls else (None, None)
            result = _measure(cfg, cert, keyfile)
        if cfg.tls:
            seal, open_ = aead_cpu_s_per_gb()
            result.update(aead_seal_cpu_s_per_gb=round(seal, 3), aead_open_cpu_s_per_gb=round(open_, 3))
            result["openssl_speed"] = openssl_speed("aes-256-gcm" if "256" in str(result["cipher"]) else "aes-128-gcm")
        else:
            result["gmac_cpu_s_per_gb"] = round(_gmac_cpu_s_per_gb(), 3)
    return result


def _frames(cfg: ChannelBenchConfig) -> tuple[int, int]:
    """(bytes per frame, frames per timed run)."""
    frame = int(cfg.frame_mb * (1 << 20))
    return frame, max(1, int(cfg.megabytes * (1 << 20)) // frame)


def _summary(cfg: ChannelBenchConfig, cipher, frame: int, frames: int, runs: list[dict]) -> dict:
    best = min(runs, key=lambda r: r["recv_cpu_s_per_gb"] + r["send_cpu_s_per_gb"])
    return {"tls": cfg.tls, "cipher": cipher[0] if cipher else None, "protocol": cipher[1] if cipher else None,
            "frame_mb": cfg.frame_mb, "inflight": cfg.inflight, "gb": round(frames * frame / 1e9, 3),
            "repeats": cfg.repeats, "hosts": cfg.hosts, **best,
            "runs": [{k: r[k] for k in ("gb_per_s", "send_cpu_s_per_gb", "recv_cpu_s_per_gb")} for r in runs]}


def _measure(cfg: ChannelBenchConfig, cert: str | None, keyfile: str | None) -> dict:
    """The channel's figures: the server in a child process, ``cfg.repeats`` timed runs, the cheapest reported."""
    from graphfeed.transport.secure import SecureCalls, client_tls, new_group_key

    key = new_group_key()
    frame, frames = _frames(cfg)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(key, cert, keyfile, child), daemon=True)
    proc.start()
    calls = None
    try:
        if not parent.poll(60):
            raise RuntimeError("bench channel: the server process did not start within 60 s")
        address = parent.recv()
        calls = SecureCalls(key, {0: address}, tls=client_tls(cert) if cert else None)
        _pull(calls, frame, min(frames, 2 * cfg.inflight + 4), cfg.inflight)   # connect; fill the reused buffers
        cipher = calls._client(0)._connection().tls_suite if cert else None
        runs = [_timed(calls, parent, frame, frames, cfg.inflight) for _ in range(cfg.repeats)]
    finally:
        if calls is not None:
            calls.close()
        parent.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    return _summary(cfg, cipher, frame, frames, runs)


def _server_cpu(pipe) -> float:
    """The server process's CPU seconds so far (it answers a "mark"); RuntimeError when it does not answer."""
    pipe.send("mark")
    if not pipe.poll(CALL_TIMEOUT):
        raise RuntimeError(f"bench channel: the server process did not answer within {CALL_TIMEOUT:g} s")
    return pipe.recv()


def _timed(calls, pipe, frame: int, frames: int, inflight: int) -> dict:
    send0 = _server_cpu(pipe)
    recv0, t0 = _cpu(), time.perf_counter()
    _pull(calls, frame, frames, inflight)
    wall, recv1 = time.perf_counter() - t0, _cpu()
    send1 = _server_cpu(pipe)
    gb = frames * frame / 1e9
    return {"gb_per_s": round(gb / wall, 3), "send_cpu_s_per_gb": round((send1 - send0) / gb, 3),
            "recv_cpu_s_per_gb": round((recv1 - recv0) / gb, 3)}


# ---- across two emulated hosts ------------------------------------------------------------------------

HOST_COMMAND = (sys.executable, "-m", "graphfeed.bench.channel")


def _measure_hosts(cfg: ChannelBenchConfig, folder: str) -> dict:
    """The figures with the server on host1 and the receiver on host0; CPU of each side's process tree from /proc."""
    from graphfeed.bench.hosts import hosts_certificate
    from graphfeed.bench.remote import tree_cpu_s
    from graphfeed.testing.hosts import EmulatedHosts
    from graphfeed.transport.secure import new_group_key

    key, (frame, frames) = new_group_key(), _frames(cfg)
    with EmulatedHosts(2) as em:
        cert, keyfile = hosts_certificate(folder, [em[1].address]) if cfg.tls else (None, None)
        server = _start_side(em[1], "serve", {"key": key.hex(), "host": em[1].address, "cert": cert,
                                              "keyfile": keyfile})
        address = _side_line(server, "address ").split()[1]
        receiver = _start_side(em[0], "pull", {"key": key.hex(), "address": address, "ca": cert, "frame": frame,
                                               "warm": min(frames, 2 * cfg.inflight + 4), "inflight": cfg.inflight})
        runs = []
        for _ in range(cfg.repeats):
            _side_line(receiver, "ready")
            send0, recv0, t0 = tree_cpu_s([server.pid]), tree_cpu_s([receiver.pid]), time.perf_counter()
            _send_line(receiver, str(frames))
            _side_line(receiver, "done", CALL_TIMEOUT * frames)   # CALL_TIMEOUT per frame, as the calls
            wall = time.perf_counter() - t0
            send1, recv1 = tree_cpu_s([server.pid]), tree_cpu_s([receiver.pid])
            gb = frames * frame / 1e9
            runs.append({"gb_per_s": round(gb / wall, 3), "send_cpu_s_per_gb": round((send1 - send0) / gb, 3),
                         "recv_cpu_s_per_gb": round((recv1 - recv0) / gb, 3)})
        _side_line(receiver, "ready")
        _send_line(receiver, "0")
        cipher = json.loads(_side_line(receiver, "cipher ").split(" ", 1)[1])
        for side in (receiver, server):
            assert side.stdin is not None
            side.stdin.close()
            try:
                code = side.wait(CALL_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"bench channel: a host's process did not exit within {CALL_TIMEOUT:g} s "
                                   f"of its end") from None
            if code != 0:
                raise RuntimeError(f"bench channel: a host's process exited with code {code}")
    return _summary(cfg, cipher, frame, frames, runs)


def _start_side(host, role: str, spec: dict) -> subprocess.Popen:
    from graphfeed.testing.hosts import LineReader

    proc = host.popen([*HOST_COMMAND, role], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.reader = LineReader(proc.stdout)   # type: ignore[attr-defined]
    _send_line(proc, json.dumps(spec))      # the group key on a pipe, not on the command line
    return proc


def _send_line(proc: subprocess.Popen, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _side_line(proc: subprocess.Popen, prefix: str, timeout: float = CALL_TIMEOUT) -> str:
    """The side's next line, which must start with ``prefix`` (within ``timeout`` s: else RuntimeError)."""
    line = proc.reader.readline(timeout)   # type: ignore[attr-defined]
    if not line or not line.startswith(prefix):
        raise RuntimeError(f"bench channel: a host's process said {line!r} where {prefix!r} was due within "
                           f"{timeout:g} s (exit code {proc.poll()}; its error is above)")
    return line.strip()


def _host_serve(spec: dict) -> None:
    """host1: answer ``blob(n)`` on the host's address until stdin closes."""
    server = _blob_server(spec["host"], bytes.fromhex(spec["key"]), spec["cert"], spec["keyfile"])
    print(f"address {server.address}", flush=True)
    try:
        sys.stdin.read()
    finally:
        server.close()


def _host_pull(spec: dict) -> None:
    """host0: warm up, then one timed run per "N" line (N frames; 0 ends), saying "ready" and "done" around it."""
    from graphfeed.transport.secure import SecureCalls, client_tls

    calls = SecureCalls(bytes.fromhex(spec["key"]), {0: spec["address"]},
                        tls=client_tls(spec["ca"]) if spec["ca"] else None)
    try:
        _pull(calls, spec["frame"], spec["warm"], spec["inflight"])
        while True:
            print("ready", flush=True)
            frames = int(sys.stdin.readline() or 0)
            if frames <= 0:
                break
            _pull(calls, spec["frame"], frames, spec["inflight"])
            print("done", flush=True)
        suite = calls._client(0)._connection().tls_suite if spec["ca"] else None
        print(f"cipher {json.dumps(suite)}", flush=True)
    finally:
        calls.close()


def _host_main(role: str) -> None:
    """One side on an emulated host; it leaves with ``os._exit`` once its work is done and its output flushed: an
    interpreter shutdown with the connection's daemon threads still in native code can abort ("terminate called
    without an active exception", exit -6), which would fail a run whose figures are already in."""
    code = 0
    try:
        {"serve": _host_serve, "pull": _host_pull}[role](json.loads(sys.stdin.readline()))
    except BaseException:  # noqa: BLE001 -- printed, and the exit code says it failed
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _host_main(sys.argv[1])
