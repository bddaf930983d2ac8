"""The journal: what a run applied or started, on disk before it happens, so that
``kvchaos cleanup`` can undo it after the run was killed (SIGKILL, OOM, a lost CI runner).

One JSON-lines file per run under the state directory (``$KVCHAOS_STATE_DIR``, default
``~/.local/state/kvchaos``): ``journal/<run-id>.jsonl``. Entries are appended with
``{"op": "add", "kind": ..., "key": ..., ...}`` when something is started or applied and
``{"op": "remove", "kind": ..., "key": ...}`` once it is undone; the entries still open are
what cleanup undoes. Kinds used across kvchaos:

- ``process``: ``pid``, ``pgid``, ``create_time`` (psutil, s since epoch), ``start_ticks`` and
  ``boot_id`` (:mod:`chaos.procid`: the identity that survives a wall-clock step), ``service``
- ``toxic``: ``api`` (Toxiproxy URL), ``proxy``, ``toxic``
- ``proxy_disabled``: ``api``, ``proxy``
- ``mount``: ``path``
- ``file``: ``path`` (ballast files)
- ``compose_project``: ``project``

Each process that writes to a journal first appends ``{"op": "owner", "pid", "create_time",
"start_ticks", "boot_id", "host", "argv"}``: the runner that owns the entries after it. ``kvchaos cleanup`` undoes only
journals none of whose owners still runs (:func:`live_owner`), so it never tears down a live
run; a live one is skipped and named, and ``--force RUN_ID`` undoes it anyway.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from chaos.procid import identity, same_process


def state_dir() -> Path:
    """The kvchaos state directory (journals, detached stacks); created on demand."""
    d = Path(os.environ.get("KVCHAOS_STATE_DIR") or Path.home() / ".local" / "state" / "kvchaos")
    d.mkdir(parents=True, exist_ok=True)
    return d


class Journal:
    """Append-only record of one run's side effects.

    Args:
        run_id: unique per run; names the file.
        directory: where journals live; ``state_dir()/journal`` when None.
    """

    def __init__(self, run_id: str, directory: Path | None = None) -> None:
        self.run_id = run_id
        self.directory = Path(directory) if directory else state_dir() / "journal"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{run_id}.jsonl"
        self._lock = threading.Lock()
        # (kind, key) this instance already recorded as undone and not added since: a repeated
        # remove (status polls of a dead service) writes and fsyncs nothing.
        self._removed: set[tuple[str, str]] = set()
        self._owner_pid: int | None = None  # the process whose owner line this instance wrote

    def _write(self, entry: dict[str, Any]) -> None:
        entry = {"time": time.time(), **entry}
        line = json.dumps(entry, sort_keys=True) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            # The first write of this process says who owns the file; so does the first write
            # after close() deleted it (a restarted stack writes a new file through the same
            # instance: without that line cleanup took its live runner for gone).
            if self._owner_pid != os.getpid() or f.tell() == 0:
                f.write(json.dumps({"time": time.time(), **owner_record()}, sort_keys=True) + "\n")
                self._owner_pid = os.getpid()
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def add(self, kind: str, key: str, **fields: Any) -> None:
        """Record that ``kind``/``key`` now exists and must be undone if the run dies."""
        self._removed.discard((kind, key))
        self._write({"op": "add", "kind": kind, "key": key, **fields})

    def remove(self, kind: str, key: str) -> None:
        """Record that ``kind``/``key`` was undone (once: repeats by this instance are no-ops)."""
        if (kind, key) in self._removed:
            return
        self._write({"op": "remove", "kind": kind, "key": key})
        self._removed.add((kind, key))

    def open_entries(self) -> list[dict[str, Any]]:
        """Entries added and not removed, oldest first."""
        return open_entries(self.path)

    def close(self) -> None:
        """Delete the journal file when nothing is left open (a later write starts a new file,
        with its owner line)."""
        with self._lock:
            if self.path.exists() and not self.open_entries():
                self.path.unlink()


_OWN: dict[str, Any] = {}


def owner_record() -> dict[str, Any]:
    """This process as a journal owner: ``{"op": "owner", "pid", "create_time" (s since epoch,
    psutil), "start_ticks", "boot_id" (:func:`chaos.procid.identity`), "host", "argv" (the
    first words of the command line)}``."""
    if _OWN.get("pid") != os.getpid():
        _OWN.clear()
        _OWN.update({"op": "owner", "pid": os.getpid(), **identity(os.getpid()), "host": socket.gethostname(),
                     "argv": " ".join(sys.argv[:4])[:200]})
    return dict(_OWN)


def owners(path: Path) -> list[dict[str, Any]]:
    """Every owner line of a journal file, oldest first (a journal without one was written by
    an older kvchaos: its owner is unknown)."""
    out = []
    for e in _lines(path):
        if e.get("op") == "owner":
            out.append(e)
    return out


def owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the process an owner line names still runs: same host, same pid, same start
    (:func:`chaos.procid.same_process`: a pid reused by another process is not the owner, and a
    step of the wall clock does not make the owner a stranger). A line from another host counts
    as alive: it cannot be checked from here."""
    if owner.get("host") and owner.get("host") != socket.gethostname():
        return True
    try:
        if not same_process(int(owner["pid"]), owner):
            return False
        return psutil.Process(int(owner["pid"])).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError, TypeError):
        return False


def live_owner(path: Path) -> dict[str, Any] | None:
    """The newest owner of the journal that still runs, or None when every owner is gone."""
    for owner in reversed(owners(path)):
        if owner_alive(owner):
            return owner
    return None


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        if isinstance(e, dict):
            yield e


def open_entries(path: Path) -> list[dict[str, Any]]:
    """Entries of one journal file that were added and not removed, oldest first.

    A torn last line (the writer died mid-write) is ignored.
    """
    live: dict[tuple[str, str], dict[str, Any]] = {}
    for e in _lines(path):
        k = (e.get("kind", ""), e.get("key", ""))
        if e.get("op") == "add":
            live[k] = e
        elif e.get("op") == "remove":
            live.pop(k, None)
    return list(live.values())


def all_journals(directory: Path | None = None) -> Iterator[Path]:
    """Every journal file in the state directory."""
    d = Path(directory) if directory else state_dir() / "journal"
    if d.is_dir():
        yield from sorted(d.glob("*.jsonl"))
