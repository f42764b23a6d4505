"""`graphfeed bench channel`: the secure data path's channel alone, with TLS and with MACs, and its CLI errors."""
from __future__ import annotations

import json

import pytest

from graphfeed.bench.channel import ChannelBenchConfig, bench_channel
from graphfeed.cli.main import main as cli_main
from graphfeed.testing.hosts import unavailable


def test_tls_channel_figures_and_the_aes_bound():
    r = bench_channel(ChannelBenchConfig(megabytes=24, frame_mb=4, inflight=2, tls=True, repeats=2))
    assert r["tls"] is True and r["protocol"] in ("TLSv1.2", "TLSv1.3") and "GCM" in r["cipher"]
    assert r["gb"] == round(24 * (1 << 20) / 1e9, 3) and len(r["runs"]) == 2
    for key in ("gb_per_s", "send_cpu_s_per_gb", "recv_cpu_s_per_gb", "aead_seal_cpu_s_per_gb",
                "aead_open_cpu_s_per_gb"):
        assert r[key] > 0, key
    costs = [(run["send_cpu_s_per_gb"], run["recv_cpu_s_per_gb"]) for run in r["runs"]]
    assert (r["send_cpu_s_per_gb"], r["recv_cpu_s_per_gb"]) == min(costs, key=sum)   # the cheapest run
    bound = r["openssl_speed"]
    if bound is not None:   # the openssl command is the library Python's ssl links
        assert bound["cipher"] == ("aes-256-gcm" if "256" in r["cipher"] else "aes-128-gcm")
        assert bound["seal_cpu_s_per_gb"] > 0 and bound["open_cpu_s_per_gb"] > 0

def test_cli_prints_one_json_line_for_the_plain_channel(capsys):
    rc = cli_main(["bench", "channel", "--no-tls", "--mb", "8", "--frame-mb", "2", "--repeats", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1
    r = json.loads(out[0])
    assert r["tls"] is False and r["cipher"] is None and r["gmac_cpu_s_per_gb"] > 0 and r["recv_cpu_s_per_gb"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--mb", "0"], "--mb and --frame-mb must be positive"),
    (["--mb", "4", "--frame-mb", "8"], "--frame-mb <= --mb"),
    (["--inflight", "0"], "--inflight and --repeats"),
    (["--hosts", "3"], "--hosts takes 2"),
])
def test_cli_bad_arguments_are_one_line_errors(capsys, argv, message):
    rc = cli_main(["bench", "channel"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]


@pytest.mark.hosts
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
@pytest.mark.parametrize("tls", [False, True])
def test_channel_across_two_emulated_hosts(tls):
    r = bench_channel(ChannelBenchConfig(megabytes=64, frame_mb=8, inflight=2, tls=tls, repeats=2, hosts=2))
    assert r["hosts"] == 2 and r["tls"] is tls and len(r["runs"]) == 2
    assert (r["cipher"] is not None) is tls
    for run in r["runs"]:   # both sides' CPU read from /proc on their hosts: each moved 64 MiB, so each used some
        assert run["gb_per_s"] > 0 and run["send_cpu_s_per_gb"] > 0 and run["recv_cpu_s_per_gb"] > 0
