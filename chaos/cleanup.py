"""``kvchaos cleanup``: undo what killed runs left behind, from their journals.

Only journals whose runner is gone are undone (chaos/journal.py records each writer's pid and
start time): a run still going is skipped and named, and so is a stack left up on purpose by
``kvchaos stack up`` (``kvchaos stack down FILE`` takes it down); ``force`` (``--force RUN_ID``)
undoes one anyway, with every other journal of the same runner.

Order matters: faults are healed first (the proxy that holds a toxic must still be running to
remove it), then paused processes are resumed and every process group is ended, then mounts
and ballast files are removed, then compose projects are taken down.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from chaos.journal import all_journals, live_owner, open_entries, state_dir
from chaos.procid import same_process


@dataclass
class CleanupReport:
    """What cleanup did (``undone``), could not do (``errors``) and left alone on purpose
    (``skipped``: live runs and detached stacks), one line each."""

    undone: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _same_process(entry: dict[str, Any]) -> psutil.Process | None:
    """The journal's process if it still runs and is the same one (pid reuse guard)."""
    try:
        if not same_process(int(entry["pid"]), entry):
            return None
        return psutil.Process(int(entry["pid"]))
    except (psutil.NoSuchProcess, KeyError, ValueError, TypeError):
        return None


#: Keys of a heal's answer that say whether it undid something (True) or found nothing (False).
_ACTED = ("removed", "restarted", "resumed", "restored", "enabled")


def _heal_message(entry: dict[str, Any], done: Any) -> str:
    """What a heal from the journal did, from its answer: "healed ..." only when it acted."""
    what = f"fault {entry['key']} ({entry.get('fault_kind', '?')})"
    if isinstance(done, dict):
        acted = [k for k in _ACTED if isinstance(done.get(k), bool)]
        if done.get("absent"):
            return f"{what}: already gone, nothing to heal"
        if any(done[k] for k in acted):
            return f"healed {what}"
        if acted or done.get("reason") or done.get("heal", "") is None:
            why = done.get("reason") or ("no heal step" if done.get("heal", "") is None else "nothing was in place")
            return f"{what}: nothing to heal ({why}); what it left is undone by the entries below"
    return f"healed {what}"


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

    from chaos.proxy.client import ToxiproxyError

    try:
        # The stack object is gone with the runner; its variables (ports) were journalled so a
        # hook's ${VARS} still resolve.
        stack = SimpleNamespace(env=dict(entry.get("stack_env") or {}), settings=None)
        done = fault.heal(FaultContext(proxy=proxy, stack=stack))
    except (httpx.ConnectError, ToxiproxyError) as exc:
        # Refused: nothing listens on the proxy's API port, so the proxy process is gone, and
        # its toxics with it (Toxiproxy keeps toxics in memory only). ToxiproxyClient wraps the
        # transport error (status 0, the httpx error as __cause__). Any other failure (an HTTP
        # answer; a timeout, httpx's ConnectTimeout being no ConnectError) may leave the toxic
        # in place: an error.
        cause = exc.__cause__ if isinstance(exc, ToxiproxyError) and exc.status == 0 else exc
        if not isinstance(cause, httpx.ConnectError):
            raise
        return f"fault {entry['key']} ({entry['fault_kind']}): its proxy is gone, nothing to heal"
    finally:
        if proxy is not None:
            proxy.close()
    return _heal_message(entry, done)


def _service(entry: dict[str, Any]) -> str:
    """The service a process entry is about: its ``service`` field, else the key's
    ``<service>:<pid>`` prefix."""
    if entry.get("service"):
        return str(entry["service"])
    key = str(entry.get("key", ""))
    return key.rsplit(":", 1)[0] if ":" in key else "unknown service"


def _resume(entry: dict[str, Any]) -> str | None:
    """A paused service: SIGCONT its group (its ``process`` entry then ends it)."""
    pgid = int(entry.get("pgid", entry.get("pid")))
    if _same_process(entry) is None and not any(_pgid(q.pid) == pgid for q in psutil.process_iter()):
        return None
    try:
        os.killpg(pgid, signal.SIGCONT)
    except ProcessLookupError:
        return None
    return f"resumed paused service {_service(entry)} (process group {pgid})"


def _end_group(entry: dict[str, Any]) -> str | None:
    p = _same_process(entry)
    pgid = int(entry.get("pgid", entry.get("pid")))
    if p is None:
        # The leader is gone; members of its group may not be.
        members = [q for q in psutil.process_iter() if _pgid(q.pid) == pgid]
        if not members:
            return None
    name = _service(entry)
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return f"ended process group {pgid} ({name})"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_live_member(q, pgid) for q in psutil.process_iter()):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return f"ended process group {pgid} ({name})"


def _live_member(proc: psutil.Process, pgid: int) -> bool:
    """Whether ``proc`` is in process group ``pgid`` and not a zombie; False once it has gone
    (a member just sent SIGTERM is reaped between the group read and the status read)."""
    try:
        return _pgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _unmount(entry: dict[str, Any]) -> str | None:
    """Every mount at the entry's path (a busy one lazily; chaos/stack/mounts.py).

    Raises:
        RuntimeError: a mount is still there (umount's answer in the message).
    """
    from chaos.stack.mounts import mounts_at, unmount_all

    path = entry["path"]
    if not mounts_at(path):
        return None
    left = unmount_all(path)
    if left is not None:
        raise RuntimeError(f"umount {path}: {left}")
    return f"unmounted {path}"


def _remove_file(entry: dict[str, Any]) -> str | None:
    p = Path(entry["path"])
    if p.is_dir() and not p.is_symlink():  # a stack's socket folder (chaos/stack/spec.py socket_dir)
        shutil.rmtree(p)
        return f"removed {p}"
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


def _detached(journal_dir: Path) -> dict[Path, str]:
    """Journals of stacks left up by ``kvchaos stack up`` -> that stack file (from the
    ``state.json`` each keeps under the state directory's ``stacks/``)."""
    out: dict[Path, str] = {}
    for state in sorted((journal_dir.parent / "stacks").glob("*/state.json")):
        try:
            data = json.loads(state.read_text())
            out[Path(data["journal"]).resolve()] = str(data.get("stack_file", state.parent))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _owner_key(owner: dict[str, Any]) -> tuple:
    if owner.get("start_ticks") is not None:
        return (owner.get("host"), owner.get("pid"), owner.get("boot_id"), owner.get("start_ticks"))
    return (owner.get("host"), owner.get("pid"), round(float(owner.get("create_time") or 0), 0))


def cleanup(directory: Path | None = None, *, force: Iterable[str] = (),
            only: Iterable[str] | None = None) -> CleanupReport:
    """Undo the open entries of every journal whose runner is gone; journals left empty are
    deleted.

    Args:
        directory: the journal folder (default ``<state dir>/journal``).
        force: run ids (journal names) to undo even though their runner still runs or they
            belong to a detached stack; forcing one journal of a live runner forces every
            journal of that runner (its faults and its stacks).
        only: run ids: look at these journals only (a campaign undoing what one dead worker
            left, not every dead run of the state directory).

    Returns:
        What was undone, what failed, and what was skipped (live runs, detached stacks), one
        line each (never raises for one entry). A ``force`` id with no journal is an error.
    """
    report = CleanupReport()
    journal_dir = Path(directory) if directory else state_dir() / "journal"
    journals = list(all_journals(journal_dir))
    if only is not None:
        wanted = set(only)
        journals = [j for j in journals if j.stem in wanted]
    forced = set(force)
    known = {j.stem for j in journals}
    for rid in sorted(forced - known):
        report.errors.append(f"--force {rid}: no journal of that run in {journal_dir}")
    live = {j: live_owner(j) for j in journals}
    forced_owners = {_owner_key(o) for j, o in live.items() if o is not None and j.stem in forced}
    detached = _detached(journal_dir)
    chosen: list[Path] = []
    skipped: dict[tuple, list[Path]] = {}
    for j in journals:
        owner = live[j]
        if j.stem in forced or (owner is not None and _owner_key(owner) in forced_owners):
            chosen.append(j)
        elif owner is not None:
            skipped.setdefault(_owner_key(owner), []).append(j)
        elif j.resolve() in detached:
            if open_entries(j):
                report.skipped.append(f"stack {detached[j.resolve()]} left up by `kvchaos stack up` (journal "
                                      f"{j.stem}): `kvchaos stack down` it, or `kvchaos cleanup --force {j.stem}`")
        else:
            chosen.append(j)
    for key, js in skipped.items():
        if not any(open_entries(j) for j in js):
            continue
        owner = live[js[0]] or {}
        report.skipped.append(
            f"live run: pid {owner.get('pid')} ({owner.get('argv') or 'kvchaos'}) still runs; its journals "
            f"{', '.join(j.stem for j in js)} are left alone (`kvchaos cleanup --force {js[0].stem}` to undo them)")
    entries = [(j, e) for j in chosen for e in open_entries(j)]
    entries.sort(key=lambda je: _ORDER.index(je[1]["kind"]) if je[1]["kind"] in _ORDER else len(_ORDER))
    failed: set[Path] = set()
    for journal, e in entries:
        kind = e["kind"]
        try:
            if kind == "fault":
                msg = _heal_fault(e)
            elif kind == "paused":
                msg = _resume(e)
            elif kind == "process":
                msg = _end_group(e)
            elif kind == "mount":
                msg = _unmount(e)
            elif kind == "file":
                msg = _remove_file(e)
            elif kind == "compose_project":
                msg = _compose_down(e)
            else:
                report.errors.append(f"unknown journal entry kind {kind!r} in {journal}")
                failed.add(journal)
                continue
        except Exception as exc:
            report.errors.append(f"{kind} {e.get('key')}: {type(exc).__name__}: {exc}")
            failed.add(journal)
            continue
        if msg:
            report.undone.append(msg)
    for j in chosen:
        if j not in failed:
            j.unlink(missing_ok=True)
    return report


__all__ = ["cleanup", "CleanupReport"]
