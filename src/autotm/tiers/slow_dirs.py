"""The file tier's private slow directories: each one locked (flock) by the process using
it, so the next start can tell a dead owner's directory from a live one's and remove it."""

from __future__ import annotations

import os
import shutil
import stat
import time

from autotm.tiers.base import make_private_dir

DIR_PREFIX = "autotm-file-"
_NEW_PREFIX = ".autotm-file-new-"  # (made, not yet locked and renamed: another's to remove only once abandoned)
ABANDONED_NEW_SECONDS = 60.0
"""A `.autotm-file-new-*` directory this old is one whose maker died between making and
locking it (a window of microseconds): the next start removes it."""


def owned_private_dir(base: str | None, resources) -> str:
    """A private directory `autotm-file-*` under `base`, locked (flock on the directory)
    while this process uses it: when the process dies, even by SIGKILL, the kernel drops the
    lock, and the next start removes the directory (remove_orphaned_dirs). It is created
    under another name and renamed once locked, so no one sees it unlocked."""
    import fcntl

    made = make_private_dir(base, _NEW_PREFIX, resources)
    fd = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(os.path.dirname(made), DIR_PREFIX + os.path.basename(made)[len(_NEW_PREFIX):])
        os.rename(made, path)
    except BaseException:
        os.close(fd)
        raise
    resources.add(lambda: os.close(fd))  # (released last: the directory goes first)
    resources.add(lambda: shutil.rmtree(path, ignore_errors=True))
    return path


def remove_orphaned_dirs(base: str) -> list[str]:
    """Remove this user's `autotm-file-*` directories under `base` whose owning process is
    gone (no process holds their lock), and `.autotm-file-new-*` ones abandoned before they
    were locked; return their paths. Live ones are left alone."""
    import fcntl

    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        new = name.startswith(_NEW_PREFIX)
        if not (new or name.startswith(DIR_PREFIX)):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            if new and time.time() - st.st_mtime < ABANDONED_NEW_SECONDS:
                continue  # (its maker may be about to lock and rename it)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed
