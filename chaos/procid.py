"""Process identity that survives a step of the wall clock.

kvchaos records the processes it starts (journal ``process`` entries, ``state.json``) and the
runner that owns a journal, and later asks "is pid N still *that* process?" (pid reuse guard):
cleanup must never end a stranger, and must never take a live run for a dead one.

psutil's ``create_time()`` is ``boot_time + start_ticks / CLK_TCK`` and ``boot_time`` is
``now - uptime``: when the wall clock is stepped (NTP, a VM restored from a snapshot, a
suspended CI runner) the same process gets another ``create_time``. On 2026-12-02 a CI run saw
its own process's ``create_time`` move by 89 s within one test, so a ``create_time`` compared
with a 1 s tolerance takes a live run for a dead one. The identity here is instead the kernel's
own start time of the process, ``starttime`` (field 22 of ``/proc/<pid>/stat``, clock ticks
since boot, proc(5)), together with the boot it belongs to (``/proc/sys/kernel/random/boot_id``):
neither moves with the wall clock. ``create_time`` is still recorded, for people and for records
written by an older kvchaos, which are compared the old way.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import psutil

#: Seconds two psutil start times may differ and still be the same process (psutil rounds);
#: used only for records that carry no ``start_ticks``.
START_TIME_TOLERANCE_S = 1.0


@functools.lru_cache(maxsize=1)
def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``, a UUID string), None off Linux."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``starttime``, field 22 of
    ``/proc/<pid>/stat``, proc(5)); None when it does not exist or /proc cannot be read.

    The command name (field 2) may hold spaces and parentheses: fields are counted after its
    last ``)``.
    """
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read()
    except (OSError, ValueError):
        return None
    try:
        rest = raw[raw.rindex(b")") + 2:].split()
        return int(rest[19])  # field 3 is rest[0], so field 22 is rest[19]
    except (ValueError, IndexError):
        return None


def identity(pid: int) -> dict[str, Any]:
    """What to record of process ``pid`` to recognise it later: ``{"create_time": float (s
    since epoch, psutil; 0.0 when unreadable), "start_ticks": int | None, "boot_id": str |
    None}``."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        created = 0.0
    return {"create_time": created, "start_ticks": start_ticks(pid), "boot_id": boot_id()}


def same_process(pid: int, record: dict[str, Any]) -> bool:
    """Whether ``pid`` still names the process ``record`` (an :func:`identity`, or an older
    record with ``create_time`` only) was taken of. False when the pid is gone or reused, or
    when the record is from another boot. Zombies are the caller's business.
    """
    ticks = record.get("start_ticks")
    if ticks is not None:
        rec_boot, now_boot = record.get("boot_id"), boot_id()
        if rec_boot and now_boot and rec_boot != now_boot:
            return False
        current = start_ticks(pid)
        if current is not None:
            return current == int(ticks)
        if os.path.exists("/proc/self/stat"):  # /proc works and has no such pid: it is gone
            return False
    try:
        created = psutil.Process(int(pid)).create_time()
    except (psutil.Error, ValueError, TypeError):
        return False
    try:
        return abs(created - float(record.get("create_time") or 0)) <= START_TIME_TOLERANCE_S
    except (TypeError, ValueError):
        return False
