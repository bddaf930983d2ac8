"""Port claims shared by every kvchaos process on the host, whatever its state dir or user.

A stack's port variables are resolved when it is loaded, but the ports are bound only later
(a service binds its port once it has started, the proxy binds a link's listen port when the link
is created after its health check), so two stacks started at the same moment could both find a
default port free and pick it. Each stack therefore claims the ports it picks:

- a claim is an exclusive ``flock(2)`` on ``<claims dir>/<port>``; the claims dir is host-wide
  (``/tmp/kvchaos-port-claims``, mode 1777, or ``$KVCHAOS_PORT_CLAIMS_DIR``), not under the state
  dir, so runs with different ``KVCHAOS_STATE_DIR`` and different users see each other's claims;
- the lock belongs to the open file, so it ends with the claiming process however that ends
  (no stale claims, no pid reuse: a live holder always holds its lock, whatever its pid);
- the module uses the standard library only (a test runs it as another user, on its own);
- a claim file is deleted only by a process that holds its lock and has checked that the name
  still names the file it locked (inode): a release deletes its own, and :func:`remove_stale`
  (once per process before the first pick, and ``kvchaos cleanup``) deletes those whose lock
  nobody holds, i.e. whose holder ended (killed runs). A claimer that opened a file just before
  it was deleted finds, once it holds the lock, that the name no longer names its file, and
  claims again on a fresh one, so two processes never hold two files of one name;
- one process may claim for several stacks: a claim has an ``owner`` (the stack's run dir), and
  a port one owner holds is refused to another;
- claim files are made mode 0666 whatever the creator's umask, so that another user can lock
  them; a claim file that cannot be opened at all (another user's, made before that) counts as
  held by someone else.

A port counts as free (:func:`is_free`) only when nothing listens on it on any address
(``127.0.0.1``, ``127.0.0.2``, ``::1``, ``0.0.0.0``, ...): a service started on a port held on
another loopback address would be answered by the other process.

Ports are picked from below the kernel's ephemeral range (``ip_local_port_range``), so an
outgoing connection's source port cannot take one between the pick and the bind. A program that
is not kvchaos can still bind a picked port first; the stack's identity check then reports it
(exit 3, chaos/stack/local.py).
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["claim", "release", "holder", "owned", "claims_dir", "pick_port", "ephemeral_range", "is_free",
           "release_all", "remove_stale"]

_DEFAULT_DIR = "/tmp/kvchaos-port-claims"
_lock = threading.Lock()


@dataclass
class _Held:
    fd: int
    owner: str


_held: dict[int, _Held] = {}
_swept = False  # remove_stale ran in this process (pick_port runs it once)


def claims_dir() -> Path:
    """The host-wide claims folder (created world-writable with the sticky bit, like /tmp).

    Raises:
        OSError: it cannot be made (naming it).
    """
    d = Path(os.environ.get("KVCHAOS_PORT_CLAIMS_DIR") or _DEFAULT_DIR)
    if not d.is_dir():
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot make the port claims folder {d}: {exc.strerror} "
                          "(set KVCHAOS_PORT_CLAIMS_DIR to a folder every user may write)") from None
        try:
            os.chmod(d, 0o1777)
        except PermissionError:  # made by another user in between
            pass
    return d


def _default_owner() -> str:
    return f"pid-{os.getpid()}"


def claim(port: int, owner: str | None = None) -> bool:
    """Claim ``port`` for ``owner`` (default: this process).

    Returns:
        True when the port is now claimed by ``owner`` (also when it held it already); False when
        another process, or another owner in this process, holds it, or when its claim file
        cannot be opened at all (another user's file this user may not read: taken as held).

    Raises:
        OSError: the claims folder does not let this user create a claim file (naming it).
    """
    owner = owner or _default_owner()
    path = claims_dir() / str(port)
    with _lock:
        held = _held.get(port)
        if held is not None:
            return held.owner == owner
        for _ in range(3):
            fd, writable = _open_claim(path)
            if fd is None:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the file was replaced between open and lock: lock the new one
                os.close(fd)
                continue
            if writable:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid={os.getpid()} uid={os.getuid()} owner={owner}\n".encode(), 0)
            _held[port] = _Held(fd, owner)
            return True
    return False


def _open_claim(path: Path) -> tuple[int | None, bool]:
    """Open (or create) the claim file ``path``: ``(fd, writable)``; ``(None, False)`` when it
    exists but this user may not open it at all.

    A file this call may have created is made mode 0666 (``fchmod``: the umask does not apply),
    so that every other user can open it for writing too.

    Raises:
        OSError: the file does not exist and cannot be created (the claims folder is not
            writable for this user).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError as exc:  # another user's claim file: a read-only fd can be locked too
        try:
            return os.open(path, os.O_RDONLY), False
        except PermissionError:  # not even readable (made under umask 077 by an older kvchaos)
            return None, False
        except FileNotFoundError:
            raise OSError(exc.errno, f"cannot create port claim files in {path.parent} "
                          f"({exc.strerror}): make it mode 1777 or set KVCHAOS_PORT_CLAIMS_DIR") from None
    try:
        if os.fstat(fd).st_mode & 0o777 != 0o666:
            os.fchmod(fd, 0o666)
    except OSError:  # another user's file opened for writing: its mode is its owner's to set
        pass
    return fd, True


def release(ports: list[int], owner: str | None = None) -> None:
    """Drop the claims ``owner`` (default: this process) holds on ``ports``; their claim files
    are deleted while still locked (:func:`_unlink_locked`)."""
    owner = owner or _default_owner()
    with _lock:
        for port in ports:
            held = _held.get(port)
            if held is not None and held.owner == owner:
                del _held[port]
                try:
                    _unlink_locked(held.fd, claims_dir() / str(port))
                finally:
                    os.close(held.fd)  # closing the file ends the lock


def _unlink_locked(fd: int, path: Path) -> bool:
    """Delete ``path`` if it still names the file ``fd`` has open; the caller holds ``fd``'s
    lock. Returns whether it was deleted (not: replaced meanwhile, gone, or another user's
    file in a sticky folder)."""
    try:
        mine, now = os.fstat(fd), os.stat(path)
        if (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino):
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def remove_stale() -> tuple[int, int]:
    """Delete the claim files whose lock nobody holds (their holder ended: a killed run leaves
    its files behind); a held claim's file is never touched, nor this process's own.

    Each file is locked first (non-blocking; held by a live process: kept) and deleted only
    while locked and still the file its name names, so a claimer racing the delete claims again
    on a fresh file (see :func:`claim`). Files this user cannot open or delete (another user's,
    in a sticky folder) are kept.

    Returns:
        ``(removed, kept)``: counts of claim files.
    """
    global _swept
    _swept = True
    try:
        d = claims_dir()
        names = [n for n in os.listdir(d) if n.isdigit()]
    except OSError:
        return 0, 0
    removed = kept = 0
    for name in names:
        with _lock:
            if int(name) in _held:
                kept += 1
                continue
            path = d / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                kept += 1
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held (BlockingIOError): a live claim
                os.close(fd)
                kept += 1
                continue
            try:
                if _unlink_locked(fd, path):
                    removed += 1
                else:
                    kept += 1
            finally:
                os.close(fd)
    return removed, kept


def release_all(owner: str | None = None) -> None:
    """Drop every claim ``owner`` (default: this process) holds."""
    release(owned(owner), owner)


def holder(port: int) -> str | None:
    """Who claims ``port`` (``"pid=N uid=U owner=..."``), or None when nobody does now (a claim
    file this user cannot read: ``"another user (claim file <path> not readable)"``)."""
    path = claims_dir() / str(port)
    with _lock:
        if port in _held:
            return f"pid={os.getpid()} owner={_held[port].owner}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:
        return f"another user (claim file {path} not readable)"
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral (source) port range, from ``/proc/sys/net/ipv4/ip_local_port_range``
    (Linux); ``(32768, 60999)``, Linux's default, where it cannot be read."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM):
            return socket.has_ipv6
    except OSError:
        return False


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``port`` on any address and ``host:port`` may be bound.

    A bind on ``host`` alone does not see a listener on another address of the host (a process on
    ``[::1]:PORT`` or ``127.0.0.2:PORT``), which would then take connections meant for the
    service, or which the identity check would report once the stack starts (exit 3). So the port
    is bound on the IPv4 any-address ``0.0.0.0`` (refused while any IPv4 address of it listens),
    on the IPv6 any-address ``[::]`` (IPv6 only; where the host has IPv6) and on ``host``.
    ``SO_REUSEADDR`` is set, as servers set it: a connection in TIME_WAIT does not count.
    """
    binds = [(socket.AF_INET, "0.0.0.0")]
    if _has_ipv6():
        binds.append((socket.AF_INET6, "::"))
    if host not in ("0.0.0.0", "::"):
        binds.append((socket.AF_INET6 if ":" in host else socket.AF_INET, host))
    for family, address in binds:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((address, port))
            except OSError:
                return False
    return True


def pick_port(owner: str | None = None, avoid: set[int] | None = None, host: str = "127.0.0.1",
              rng: random.Random | None = None) -> int:
    """A port that is free now (:func:`is_free`: nothing listens on it on any address, and
    ``host`` may bind it) and is claimed for ``owner`` (:func:`claim`), picked at random below
    the ephemeral range (from 20000, or 1024 when that range starts lower); the kernel's pick
    (port 0) if 200 tries find none.

    Raises:
        OSError: no port could be found and claimed, or the claims folder is not writable.
    """
    rng = rng or random.SystemRandom()
    avoid = avoid or set()
    if not _swept:
        remove_stale()
    low, _ = ephemeral_range()
    start = 20000 if low > 21000 else 1024
    for _ in range(200):
        port = rng.randrange(start, low) if low > start else 0
        if port == 0:
            break
        if port in avoid or not is_free(port, host):
            continue
        if claim(port, owner):
            if is_free(port, host):
                return port
            release([port], owner)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid and is_free(port, host) and claim(port, owner):
            return port
    raise OSError("could not find a free port to claim")


def owned(owner: str | None = None) -> list[int]:
    """The ports ``owner`` (default: this process) claims now."""
    owner = owner or _default_owner()
    with _lock:
        return sorted(p for p, h in _held.items() if h.owner == owner)
