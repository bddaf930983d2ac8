"""Mounts kvchaos makes on the host (the filesystem L2's size-capped tmpfs) and their undoing.

    _mount_l2 (LocalStack, ComposeStack) ── journal "mount" ── mount -t tmpfs ... PATH
    down() / kvchaos cleanup ──> unmount_all(PATH): umount, where busy umount -l, until
                                 /proc/self/mounts lists nothing at PATH (mounts stacked on one
                                 path are undone one by one)

A mount is counted in ``/proc/self/mounts`` (this process's mount namespace), not with
``os.path.ismount``: that one answers False when the path cannot be stat'ed and cannot tell one
mount from two stacked on the same path.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["mounts_at", "mounts_under", "unmount_all"]


def _decode(field: str) -> str:
    """A path field of /proc/self/mounts: space, tab, newline and backslash are octal escapes."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mount_points() -> list[str]:
    """Every mount point of ``/proc/self/mounts`` (this process's mount namespace), decoded, one
    per mount (a path mounted twice is listed twice).

    Raises:
        OSError: the table cannot be read.
    """
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
        return [_decode(parts[1]) for line in f if len(parts := line.split()) > 1]


def mounts_at(path: str | Path) -> int:
    """How many mounts ``/proc/self/mounts`` lists at ``path`` (symlinks resolved): 0 when none,
    2 when a second mount was stacked on the first."""
    target = os.path.realpath(path)
    try:
        points = _mount_points()
    except OSError:
        return 1 if os.path.ismount(target) else 0
    return points.count(target)


def mounts_under(root: str | Path) -> list[str]:
    """The mount points at or under ``root`` (symlinks resolved), one per mount, in mount order:
    what a run left mounted in its folders.

    Raises:
        OSError: ``/proc/self/mounts`` cannot be read.
    """
    base = os.path.realpath(root)
    return [p for p in _mount_points() if p == base or p.startswith(base.rstrip("/") + "/")]


def unmount_all(path: str | Path) -> str | None:
    """Unmount every mount at ``path``: ``umount``, and when that fails (EBUSY: a process has a
    file open or its working directory there) ``umount -l``, which detaches it at once (the
    kernel frees it once unused); again while a mount stacked below is left.

    Returns:
        None when nothing is mounted at ``path`` any more, else what is left and why (umount's
        own message), for an error that names the path.
    """
    target = os.path.realpath(path)
    left = mounts_at(target)
    why = ""
    while left:
        r = subprocess.run(["umount", target], capture_output=True, text=True)
        if r.returncode != 0:
            lazy = subprocess.run(["umount", "-l", target], capture_output=True, text=True)
            why = (lazy.stderr or r.stderr or f"umount exited {lazy.returncode}").strip()
        now = mounts_at(target)
        if now >= left:  # no progress: this one does not go
            return f"{now} mount(s) still at {target}" + (f" ({why})" if why else "")
        left = now
    return None
