"""Run a command inside an emulated host's namespaces: ``python -m graphfeed.testing.enter_host PID -- ARGV``.

``PID`` is the host's first process (pid 1 of its PID namespace, see :mod:`graphfeed.testing.hosts`).
This process joins that process's network, UTS, PID and mount namespaces (``setns``), forks --
a PID namespace takes effect for children only -- and the child executes ``ARGV`` in the working
folder of the caller.  This process stays outside as the child's stand-in: it forwards the
signals a launcher sends (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2) and exits as the child did
(the same code, or killed by the same signal), so :mod:`graphfeed.testing.cluster` manages it
like the command itself.  Both are in one process group: a SIGKILL to the group reaches both.

Only the standard library is imported: it runs before every process of an emulated host.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

# the CLONE_NEW* flag setns takes for each /proc/PID/ns entry; mnt last: it changes / and the cwd
NAMESPACES = (("net", 0x40000000), ("uts", 0x04000000), ("pid", 0x20000000), ("mnt", 0x00020000))
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
EXIT_USAGE = 2
EXIT_ENTER_FAILED = 125


def enter(pid: int) -> None:
    """Join ``pid``'s namespaces (the PID one for children of this process); OSError if one cannot be joined."""
    libc = ctypes.CDLL(None, use_errno=True)
    fds = {name: os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY) for name, _ in NAMESPACES}
    try:
        for name, flag in NAMESPACES:
            if libc.setns(fds[name], flag) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({name} namespace of pid {pid}): {os.strerror(err)}")
    finally:
        for fd in fds.values():
            os.close(fd)


def _exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.WEXITSTATUS(status))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m graphfeed.testing.enter_host PID -- COMMAND [ARGS...]", file=sys.stderr)
        return EXIT_USAGE
    pid, command = int(argv[0]), argv[2:]
    cwd = os.getcwd()
    try:
        enter(pid)
    except OSError as exc:
        print(f"enter_host: cannot enter the namespaces of pid {pid}: {exc} (is the emulated host still up?)",
              file=sys.stderr)
        return EXIT_ENTER_FAILED
    child = os.fork()
    if child == 0:
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir("/")
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"enter_host: cannot run {command[0]}: {exc}", file=sys.stderr)
            os._exit(127)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _frame: os.kill(child, s))
    _, status = os.waitpid(child, 0)   # retried by Python across the forwarded signals (PEP 475)
    _exit_like(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
