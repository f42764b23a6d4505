"""The shared-memory channel's segments: files in ``/dev/shm`` named for their trainer, made private (0600) with
their pages reserved, mapped, and unlinked once both ends mapped them (:mod:`graphfeed.transport.shm`)."""
from __future__ import annotations

import mmap
import os
import re
import stat

from graphfeed.core.process import pid_alive

SHM_DIR = "/dev/shm"
PREFIX = "graphfeed-shm-"
NAME_RE = re.compile(r"^graphfeed-shm-(\d+)-[0-9a-f]+-p\d+-s\d+$")


def segment_path(name: str) -> str:
    """The file of segment ``name``; ValueError unless ``name`` is a graphfeed segment name."""
    if not NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a graphfeed shared-memory segment name")
    return os.path.join(SHM_DIR, name)


def create_segment(name: str, size: int) -> mmap.mmap:
    """A new segment of ``size`` bytes (mode 0600), its pages reserved, mapped.

    FileExistsError/OSError as the OS raises (the name is unlinked again): ENOSPC when ``/dev/shm``
    has no room for ``size`` bytes.  Reserving them now (``posix_fallocate``) is what keeps a later
    write into the mapping from dying of SIGBUS on a full tmpfs."""
    fd = os.open(segment_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size)
    except BaseException:
        os.unlink(segment_path(name))
        raise
    finally:
        os.close(fd)


def open_segment(name: str, size: int) -> mmap.mmap:
    """Map the existing segment ``name``; OSError (FileNotFoundError on another host) if it cannot."""
    fd = os.open(segment_path(name), os.O_RDWR | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.geteuid():
            raise PermissionError(f"segment {name} is not a private (0600) file of this user (uid {st.st_uid}, mode "
                                  f"{stat.S_IMODE(st.st_mode):o}): refusing to map it")
        if st.st_size != size:
            raise OSError(f"segment {name} has {st.st_size} bytes, expected {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unlink_segment(name: str) -> None:
    """Remove ``name`` from ``/dev/shm`` (mappings stay valid); a name already gone is fine."""
    try:
        os.unlink(segment_path(name))
    except FileNotFoundError:
        pass


def list_segments() -> list[str]:
    """Names of graphfeed segments in ``/dev/shm`` now."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if NAME_RE.match(n))
    except FileNotFoundError:
        return []


def sweep_stale() -> list[str]:
    """Unlink the segments of trainers that are no longer alive (killed during a ring set-up); returns them."""
    removed = []
    for name in list_segments():
        match = NAME_RE.match(name)
        if match and not pid_alive(int(match.group(1))):
            unlink_segment(name)
            removed.append(name)
    return removed
