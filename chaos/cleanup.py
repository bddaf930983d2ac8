"""``kvchaos cleanup``: undo what killed runs left behind, from their journals.

Order matters: faults are healed first (the proxy that holds a toxic must still be running to
remove it), then paused processes are resumed and every process group is ended, then mounts
and ballast files are removed, then compose projects are taken down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from chaos.journal import all_journals, open_entries


@dataclass
class CleanupReport:
    """What cleanup did (``undone``) and could not do (``errors``), one line each."""

    undone: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _same_process(entry: dict[str, Any]) -> psutil.Process | None:
    """The journal's process if it still runs and is the same one (pid reuse guard)."""
    try:
        p = psutil.Process(int(entry["pid"]))
        if abs(p.create_time() - float(entry.get("create_time", 0))) > 1.0:
            return None
        return p
    except (psutil.NoSuchProcess, KeyError, ValueError):
        return None


def _heal_fault(entry: dict[str, Any]) -> str:
    from chaos.faults import registry
    from chaos.faults.base import FaultContext
    from chaos.scenario.model import FaultSpec  # noqa: F401  (loads the fault modules)
    from pydantic import TypeAdapter

    params = TypeAdapter(registry.fault_union()).validate_python(entry["params"])
    fault = registry.build_fault(params)
    proxy = None
    if entry.get("proxy_api"):
        from chaos.proxy.client import ToxiproxyClient

        proxy = ToxiproxyClient(entry["proxy_api"])
    import httpx

    try:
        # The stack object is gone with the runner; its variables (ports) were journalled so a
        # hook's ${VARS} still resolve.
        stack = SimpleNamespace(env=dict(entry.get("stack_env") or {}), settings=None)
        fault.heal(FaultContext(proxy=proxy, stack=stack))
    except httpx.ConnectError:
        # The proxy process is gone, and its toxics with it.
        return f"fault {entry['key']} ({entry['fault_kind']}): its proxy is gone, nothing to heal"
    finally:
        if proxy is not None:
            proxy.close()
    return f"healed fault {entry['key']} ({entry['fault_kind']})"


def _end_group(entry: dict[str, Any]) -> str | None:
    p = _same_process(entry)
    pgid = int(entry.get("pgid", entry.get("pid")))
    if p is None:
        # The leader is gone; members of its group may not be.
        members = [q for q in psutil.process_iter() if _pgid(q.pid) == pgid]
        if not members:
            return None
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return f"ended process group {pgid} ({entry.get('service', '?')})"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_pgid(q.pid) == pgid and q.status() != psutil.STATUS_ZOMBIE
                                              for q in psutil.process_iter()):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return f"ended process group {pgid} ({entry.get('service', '?')})"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _unmount(entry: dict[str, Any]) -> str | None:
    path = entry["path"]
    if not os.path.ismount(path):
        return None
    r = subprocess.run(["umount", "-l", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"umount {path}: {r.stderr.strip()}")
    return f"unmounted {path}"


def _remove_file(entry: dict[str, Any]) -> str | None:
    p = Path(entry["path"])
    if p.exists():
        p.unlink()
        return f"removed {p}"
    return None


def _compose_down(entry: dict[str, Any]) -> str | None:
    from chaos.stack.compose import remove_project

    remove_project(entry["project"])
    return f"removed compose project {entry['project']}"


#: Undo order: faults, paused processes and processes, mounts, files, compose projects.
_ORDER = ["fault", "toxic", "proxy_disabled", "paused", "process", "mount", "file", "compose_project"]


def cleanup(directory: Path | None = None) -> CleanupReport:
    """Undo every open journal entry of every journal; journals left empty are deleted.

    Returns:
        What was undone and what failed (never raises for one entry).
    """
    report = CleanupReport()
    journals = list(all_journals(directory))
    entries = [(j, e) for j in journals for e in open_entries(j)]
    entries.sort(key=lambda je: _ORDER.index(je[1]["kind"]) if je[1]["kind"] in _ORDER else len(_ORDER))
    for _journal, e in entries:
        kind = e["kind"]
        try:
            if kind == "fault":
                msg = _heal_fault(e)
            elif kind in ("process", "paused"):
                msg = _end_group(e)
            elif kind == "mount":
                msg = _unmount(e)
            elif kind == "file":
                msg = _remove_file(e)
            elif kind == "compose_project":
                msg = _compose_down(e)
            else:
                report.errors.append(f"unknown journal entry kind {kind!r} in {_journal}")
                continue
        except Exception as exc:
            report.errors.append(f"{kind} {e.get('key')}: {type(exc).__name__}: {exc}")
            continue
        if msg:
            report.undone.append(msg)
    if not report.errors:
        for j in journals:
            j.unlink(missing_ok=True)
    return report
