"""Health probes: ``kvchaos probe URL`` and the in-process fast path LocalStack uses for it.

A probe URL is ``http(s)://host:port/path`` (healthy on HTTP 2xx) or ``tcp://host:port``
(healthy when a TCP connection opens).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx


def probe(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """Probe ``url`` once.

    Args:
        url: ``http://...``, ``https://...`` or ``tcp://host:port``.
        timeout_s: connect + read timeout, seconds.

    Returns:
        ``(healthy, detail)``: detail is the HTTP status or the error, for logs.

    Raises:
        ValueError: an unsupported scheme or a URL without host/port.
    """
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        try:
            r = httpx.get(url, timeout=timeout_s)
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return 200 <= r.status_code < 300, f"HTTP {r.status_code}"
    if parts.scheme == "tcp":
        if not parts.hostname or not parts.port:
            raise ValueError(f"tcp probe needs host:port, got {url!r}")
        try:
            with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s):
                return True, "connected"
        except OSError as exc:
            return False, str(exc)
    raise ValueError(f"unsupported probe URL {url!r} (use http://, https:// or tcp://)")


def foreign_listener(url: str, pgid: int) -> str | None:
    """Who serves ``url``'s port, when it is not the process group ``pgid``.

    A health check that passes proves only that *something* answers on the port. On a shared
    host another stack's process can hold a default port that this stack's service then fails
    to bind; its health check would pass on the other process, and the run would test the
    wrong server. This reads the kernel's listening sockets (psutil) to tell.

    Args:
        url: the probed ``http(s)://`` or ``tcp://`` URL.
        pgid: the service's process group.

    Returns:
        ``"pid N (command)"`` of a listener on the port outside ``pgid``, when the port's
        listeners are known and none of them is in ``pgid``; None when one of them is in
        ``pgid``, or when the owners cannot be read (no permission: the check is skipped).
    """
    import os

    import psutil

    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    if port is None:
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError, OSError):
        return None
    pids = {c.pid for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    if not pids or None in pids:
        return None
    foreign = []
    for pid in sorted(pids):
        try:
            if os.getpgid(pid) == pgid:
                return None
            foreign.append(f"pid {pid} ({' '.join(psutil.Process(pid).cmdline())[:120]})")
        except (ProcessLookupError, psutil.Error):
            continue
    return ", ".join(foreign) or None


def probe_url_of(argv: list[str]) -> str | None:
    """The URL when ``argv`` is ``kvchaos probe URL`` (so it can run in-process), else None."""
    if len(argv) == 3 and argv[0].rsplit("/", 1)[-1] == "kvchaos" and argv[1] == "probe":
        return argv[2]
    return None
