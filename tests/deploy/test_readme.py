"""Every command block of the README and of the getting-started page, pasted as a newcomer would: in a fresh clone.

The pages' ```bash blocks, in order (README.md, then docs/getting-started.md: its quick start, then its
"Command line" tour), are one list of lines; a line that an earlier block already gave word for word is given
once (the quick start is on both pages).
Opt-in (``GRAPHFEED_README_TEST=1``; about 15 minutes on 2 cores plus the set-up): the test clones the
repository and checks out the commit at its HEAD (committed state only: uncommitted edits are not run,
and the blocks are read from the clone's pages), runs ``bash scripts/dev.sh setup`` there (the quick
start's venv; ``GRAPHFEED_README_VENV=/path/to/venv`` reuses an existing one instead, linked as the
clone's ``.venv`` -- its editable graphfeed then imports the checkout it was installed from, not the
clone) and then each line in one bash shell, in order, as written.
``GRAPHFEED_README_HOSTS_LOCK=FILE`` runs the emulated-hosts line under ``flock FILE`` (two emulated-host
runs on one machine must not overlap).  What
a user does in other shells is done here in the background: a ``graphfeed serve`` line is started
and waited on (gRPC health) before the next line, and stopped (SIGTERM, exit 0 expected) at the end.
A quick-start line ``bash scripts/dev.sh JOB`` is the set-up (done above) and then JOB: ``demo`` runs as
``graphfeed demo``; the tour's own ``graphfeed demo`` line runs it again in the same clone, as a newcomer
pasting both blocks does (the second reuses the first's graph and partition); ``test`` is
the suite this test belongs to, which CI runs itself (``.ci/run``), so it is not run again in here.
The GPU line is skipped without a CUDA device.  Every other line must exit 0.
The blocks' parsing and the checks below it always run (fast): every line is a ``graphfeed`` command,
a ``bash scripts/dev.sh`` job or the venv's activation (before the first ``graphfeed`` line), and the
inputs each line reads are made by an earlier line.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINE_BOUND_S = 1800.0     # one line (the demo: about 5 minutes on 2 idle cores, several times that on a busy host)
SERVE_BOUND_S = 120.0     # a daemon to SERVING


# The pages whose command blocks a newcomer pastes, in the order they read them.
PAGES = ("README.md", "docs/getting-started.md")
DEV_JOBS = ("demo", "test")   # the scripts/dev.sh jobs a page may ask a newcomer to run (see the docstring)


def block_lines(page: Path) -> list[str]:
    """The lines of every ```bash block of ``page``, in order, comments stripped."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
        for raw in block.splitlines():
            words = shlex.split(raw, comments=True)
            if words:
                lines.append(shlex.join(words))
    return lines


def _job(line: str) -> str:
    """The job a line runs: ``bash scripts/dev.sh demo ARGS`` is ``graphfeed demo ARGS`` after the set-up."""
    words = shlex.split(line)
    if words[:3] == ["bash", "scripts/dev.sh", "demo"]:
        return shlex.join(["graphfeed", "demo", *words[3:]])
    return line


def readme_commands(root: Path = ROOT) -> list[str]:
    """The command lines of every page in PAGES, in order; a line an earlier line gave word for word, once."""
    lines: list[str] = []
    for name in PAGES:
        page_lines = block_lines(root / name)
        assert page_lines, f"{name} has no ```bash block"
        lines += [line for line in page_lines if line not in lines]
    return lines


def _option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def test_every_readme_line_reads_only_what_an_earlier_line_made():
    lines = readme_commands()
    made: set[str] = set()
    activated = False
    for line in lines:
        words = shlex.split(line)
        if line == "source .venv/bin/activate":
            activated = True
            continue
        if words[:2] == ["bash", "scripts/dev.sh"]:
            assert words[2] in DEV_JOBS, f"`{line}`: scripts/dev.sh has no job {words[2]!r}"
            continue
        assert words[0] == "graphfeed", line
        assert activated, f"`{line}` comes before the block that says how the venv is used"
        reads = [w for w in (_option(words, "--graph"), _option(words, "--partition")) if w]
        if words[1] in ("partition", "info"):
            reads.append(words[2])
        for path in reads:
            assert path in made, f"`{line}` reads {path}, which no earlier command line creates"
        for flag in ("--out", "--output"):
            if _option(words, flag):
                made.add(_option(words, flag))
        if "--link" in words:
            assert any("--link-split" in w for w in lines), "the link bench needs a --link-split partition"


# Pages whose ```bash blocks this test does not run, each with the reason; every other page with a block must
# be in PAGES, so a new page's commands are run (or this table says why not).
NOT_RUN = {
    "docs/development.md": "the suite itself and its lint/docs steps: CI runs them as they are (.ci/run)",
    "docs/install.md": "installs torch from PyTorch's own index, which a CI machine does not reach; the quick "
                       "start's set-up (scripts/dev.sh) installs the same pins from PyPI and is run here",
    "docs/partition-scale.md": "the products-scale measurements (hours, OUT/NAME placeholders for the reader)",
    "docs/how-to/partition.md": "products-scale partitioning (hours) and a Dask scheduler at the reader's HOST",
    "docs/how-to/multi-host.md": "a rolling upgrade of the reader's servers: systemctl and kubectl on their hosts "
                                 "and cluster, graphfeed status at their HOST:PORT",
    "docs/how-to/operations.md": "operators' commands against the reader's running servers (graphfeed drain at "
                                 "their HOST:PORT, with their admin token)",
    "docs/how-to/replicas.md": "benchmarks over the reader's parts/small (minutes each); tests/bench/"
                               "test_bench_failover.py runs the same command on the tiny graph",
}


def test_every_page_with_commands_is_run_or_says_why_not():
    pages = {p.relative_to(ROOT).as_posix() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
             if block_lines(p)}
    unlisted = pages - set(PAGES) - set(NOT_RUN)
    assert not unlisted, f"{sorted(unlisted)} have ```bash blocks this test neither runs (PAGES) nor exempts " \
                         f"with a reason (NOT_RUN): add each to one of them"
    stale = set(NOT_RUN) - pages
    assert not stale, f"NOT_RUN names {sorted(stale)}, which have no ```bash block (any more): remove them"


def test_the_demo_runs_twice_in_one_clone():
    """The quick start's demo, then the tour's: a second demo in the same clone must work (it once failed)."""
    demos = [line for line in readme_commands() if shlex.split(_job(line))[:2] == ["graphfeed", "demo"]]
    assert demos == ["bash scripts/dev.sh demo", "graphfeed demo"], demos


def test_status_after_serve_waits_for_the_servers():
    """A newcomer pastes ``status`` right after starting the servers: it must wait for them, boundedly."""
    lines = readme_commands()
    serve = max(i for i, line in enumerate(lines) if line.startswith("graphfeed serve"))
    status = next(line for line in lines[serve:] if line.startswith("graphfeed status"))
    assert _option(shlex.split(status), "--wait"), status


def test_readme_quick_start_is_the_two_commands():
    """The README's first block: the demo and the suite, each making the venv on first use."""
    assert block_lines(ROOT / "README.md")[:2] == ["bash scripts/dev.sh demo", "bash scripts/dev.sh test"]


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _fresh_clone(tmp: Path) -> Path:
    """A clone of ROOT at the commit of ROOT's HEAD (whatever branch or worktree ROOT has checked out)."""
    clone = tmp / "clone"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True, timeout=300)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", "--detach", head], check=True, timeout=300)
    venv = os.environ.get("GRAPHFEED_README_VENV")
    if venv:
        (clone / ".venv").symlink_to(Path(venv).resolve())
    else:
        subprocess.run(["bash", "scripts/dev.sh", "setup"], cwd=clone, check=True, timeout=3600)
    return clone


def _wait_serving(clone: Path, port: str, proc: subprocess.Popen) -> None:
    probe = (f"import sys, time\nfrom graphfeed.testing.cluster import wait_for_health\n"
             f"wait_for_health('127.0.0.1:{port}', timeout={SERVE_BOUND_S})\n")
    res = subprocess.run([str(clone / ".venv/bin/python"), "-c", probe], cwd=clone, timeout=SERVE_BOUND_S + 30,
                         capture_output=True, text=True)
    assert res.returncode == 0 and proc.poll() is None, f"server on port {port} did not serve:\n{res.stderr}"


@pytest.mark.slow
@pytest.mark.timeout(7200)   # the suite's 600 s would end it during the link bench: every step has its own bound
@pytest.mark.skipif(os.environ.get("GRAPHFEED_README_TEST") != "1",
                    reason="long (about 15 min + set-up): GRAPHFEED_README_TEST=1 runs the README in a fresh clone")
def test_readme_command_lines_run_in_a_fresh_clone(tmp_path):
    started = time.monotonic()
    clone = _fresh_clone(tmp_path)
    print(f"{time.monotonic() - started:6.0f} s  clone and set-up", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}   # a fresh shell
    servers: list[subprocess.Popen] = []
    logs = []
    try:
        for line in readme_commands(clone):
            words = shlex.split(_job(line))
            if line == "source .venv/bin/activate" or words[:3] == ["bash", "scripts/dev.sh", "test"]:
                continue   # every line runs in the venv (below); the suite is CI's own step
            if words[:2] == ["bash", "scripts/dev.sh"]:
                raise AssertionError(f"`{line}`: this test runs no scripts/dev.sh job but demo and test")
            if "--device" in words and _option(words, "--device") == "cuda" and not _cuda():
                continue
            lock = os.environ.get("GRAPHFEED_README_HOSTS_LOCK")
            run = f"flock {shlex.quote(lock)} {_job(line)}" if lock and "--hosts" in words else _job(line)
            shell = f"set -euo pipefail; source .venv/bin/activate; {run}"
            if words[1] == "serve":
                logs.append(log := open(tmp_path / f"serve-{_option(words, '--port')}.log", "w"))
                servers.append(subprocess.Popen(["bash", "-c", shell], cwd=clone, env=env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True))
                _wait_serving(clone, _option(words, "--port"), servers[-1])
                continue
            started = time.monotonic()
            res = subprocess.run(["bash", "-c", shell], cwd=clone, env=env, capture_output=True, text=True,
                                 timeout=LINE_BOUND_S)
            print(f"{time.monotonic() - started:6.0f} s  exit {res.returncode}  {line}", flush=True)
            assert res.returncode == 0, f"`{line}` exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    finally:
        for proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        codes = [proc.wait(60) for proc in servers]
        for log in logs:
            log.close()
    assert codes == [0] * len(servers), f"servers' exit codes after SIGTERM: {codes}"


if __name__ == "__main__":
    print("\n".join(readme_commands()), file=sys.stdout)
