"""Port claims shared by every kvchaos process on the machine.

A stack's port variables are resolved when it is loaded, but some ports are bound only later
(the proxy binds a link's listen port when the link is created, after its health check), so two
stacks started at the same time could both find a default port free and pick it. Each stack
therefore claims the ports it picks in ``<state dir>/ports/`` (one file per port, holding the
claiming process id, created with O_EXCL); a port claimed by a live process is not picked again.
Claims of dead processes are taken over.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from chaos.journal import state_dir


def _claims_dir() -> Path:
    d = state_dir() / "ports"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _holder(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    return pid if pid and psutil.pid_exists(pid) else None


def claim(port: int, owner: int | None = None) -> bool:
    """Claim ``port`` for process ``owner`` (default: this process).

    Returns:
        True when the port is now ours (also when we held it already), False when a live
        process holds it.
    """
    owner = owner or os.getpid()
    path = _claims_dir() / str(port)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder == owner:
                return True
            if holder is not None:
                return False
            path.unlink(missing_ok=True)  # a dead process's claim
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(owner))
        return True
    return False


def release(ports: list[int], owner: int | None = None) -> None:
    """Drop the claims ``owner`` (default: this process) holds on ``ports``."""
    owner = owner or os.getpid()
    for port in ports:
        path = _claims_dir() / str(port)
        if _holder(path) == owner:
            path.unlink(missing_ok=True)
