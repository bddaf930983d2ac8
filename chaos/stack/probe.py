"""Health probes: ``kvchaos probe URL`` and the in-process fast path LocalStack uses for it.

A probe URL is ``http(s)://host:port/path`` (healthy on HTTP 2xx) or ``tcp://host:port``
(healthy when a TCP connection opens).

An answer proves nothing about *who* answered: on a shared host another stack's engine may hold
the port. :func:`listeners` and :func:`group_pids` let the local backend check that the socket
listening on the probed port belongs to the process it started (the listening socket's owner
pid), which works for every service alike (the engine, LMCache, Redis, either proxy).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import psutil

from chaos.httppool import ssl_context


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
            r = httpx.get(url, timeout=timeout_s, verify=ssl_context())
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


def probe_url_of(argv: list[str]) -> str | None:
    """The URL when ``argv`` is ``kvchaos probe URL`` (so it can run in-process), else None."""
    if len(argv) == 3 and argv[0].rsplit("/", 1)[-1] == "kvchaos" and argv[1] == "probe":
        return argv[2]
    return None


@dataclass(frozen=True)
class Listener:
    """A process listening on a TCP port: ``pid`` None when its owner is not visible to us
    (another user's process, and we are not root)."""

    pid: int | None
    address: str
    cmdline: str = ""

    def describe(self) -> str:
        """``pid 123 (redis-server --port 6379)`` or ``a process not visible to this user``."""
        if self.pid is None:
            return f"a process not visible to this user (listening on {self.address})"
        return f"pid {self.pid} ({self.cmdline})" if self.cmdline else f"pid {self.pid}"


def is_local_host(host: str | None) -> bool:
    """True for addresses of this host's loopback or any-address (``127.x``, ``::1``,
    ``localhost``, ``0.0.0.0``), whose listener the identity check can see."""
    if not host:
        return False
    if host in ("localhost", "0.0.0.0", "::", "::1"):
        return True
    return host.startswith("127.")


def listeners(port: int) -> list[Listener]:
    """Every TCP socket listening on ``port`` (any address), with its process where visible.

    Read through psutil (``/proc/net/tcp*`` and each process's fds on Linux).
    """
    out: list[Listener] = []
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return out
    for c in conns:
        if c.status != psutil.CONN_LISTEN or not c.laddr or c.laddr.port != port:
            continue
        cmd = ""
        if c.pid:
            try:
                cmd = " ".join(psutil.Process(c.pid).cmdline())[:200]
            except psutil.Error:
                pass
        out.append(Listener(c.pid, f"{c.laddr.ip}:{c.laddr.port}", cmd))
    return out


def source_port_users(port: int) -> list[Listener]:
    """Every TCP connection whose own (local) port is ``port`` and that a process holds, while
    nothing listens on ``port``: a client socket that took ``port`` as its source port (the
    kernel gives source ports from the ephemeral range, /proc/sys/net/ipv4/ip_local_port_range,
    which a stack's default ports may lie in). A later ``bind`` of ``port`` fails with
    EADDRINUSE even under SO_REUSEADDR, so a service that starts on it exits. ``address`` is
    ``local -> remote (state)``. Sockets in TIME_WAIT (they do not block SO_REUSEADDR) and those
    of a port something listens on (its accepted connections) are left out.
    """
    out: list[Listener] = []
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return out
    on_port = [c for c in conns if c.laddr and c.laddr.port == port]
    if any(c.status == psutil.CONN_LISTEN for c in on_port):
        return out
    for c in on_port:
        if c.pid is None or c.status in (psutil.CONN_TIME_WAIT, psutil.CONN_CLOSE, psutil.CONN_NONE):
            continue
        cmd = ""
        try:
            cmd = " ".join(psutil.Process(c.pid).cmdline())[:200]
        except psutil.Error:
            pass
        remote = f"{c.raddr.ip}:{c.raddr.port}" if c.raddr else "?"
        out.append(Listener(c.pid, f"{c.laddr.ip}:{c.laddr.port} -> {remote} ({c.status})", cmd))
    return out


def group_pids(pgid: int) -> set[int]:
    """The live pids of process group ``pgid`` (a LocalStack service and its children)."""
    pids = set()
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.info["pid"]) == pgid:
                pids.add(p.info["pid"])
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return pids


def url_host_port(url: str) -> tuple[str | None, int | None]:
    """Host and port of a probe URL (port from the scheme's default for http/https)."""
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = None
    return parts.hostname, port
