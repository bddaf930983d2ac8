"""What the kernel says about a link's connections through the proxy: per-socket byte counts.

    client ──> [listen] proxy ──> [upstream] server
               accepted socket     upstream socket (the proxy's, to the server)
               (local = listen)    (peer = upstream, owned by the proxy's process)

    a toxic on stream  downstream (server -> client) reads its data from the upstream sockets,
                       upstream   (client -> server) reads its data from the accepted sockets.

Toxiproxy 2.9.0 exports its byte counters (``toxiproxy_proxy_received_bytes_total``) only when a
connection ends (``link.go``: the counter is added after ``io.Copy`` returns), so a persistent
connection (the engine's ZMQ socket to LMCache, LMCache's Redis connections) shows no bytes while
a toxic is in place. The kernel's ``TCP_INFO`` of each socket (``bytes_received``, Linux 4.1+)
does: two samples, one just after the toxic is added and one just before it is removed, give the
bytes that arrived on the toxic's stream while it was in place, connection by connection. It
works alike for the bundled proxy, the real Toxiproxy, and either of them in a container on the
host network.

Sockets are read with iproute2's ``ss -tanpieH`` (sock_diag netlink); the proxy's process is the
one holding the link's listening socket (``users:(...)``), so a connection of another process to
the same upstream (a test, a fault that talks to Redis directly) never counts. Without ``ss``,
or when the owner process is not visible (another user's proxy, not root), sampling raises
:class:`SocketsUnavailable` and callers report that they cannot tell.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import weakref
from dataclasses import dataclass, field

__all__ = ["SocketInfo", "LinkSample", "SocketsUnavailable", "DestroyWatch", "ConnectionWindow", "sample_link",
           "stream_bytes", "ended_read", "destroyed_bytes", "connection_windows"]

#: States in which the peer's FIN has arrived (ss's names).
FIN_RECEIVED_STATES = frozenset({"CLOSE-WAIT", "LAST-ACK", "CLOSING", "TIME-WAIT"})
_HEAD = re.compile(r"^(?P<state>\S+)\s+(?P<recvq>\d+)\s+(?P<sendq>\d+)\s+(?P<local>\S+)\s+(?P<peer>\S+)")
_PID = re.compile(r"pid=(\d+)")
_FIELDS = {k: re.compile(rf"\b{k}:(\d+)") for k in ("ino", "bytes_received", "bytes_acked", "bytes_sent")}


class SocketsUnavailable(RuntimeError):
    """The link's sockets cannot be read (no ``ss``, it failed, or the proxy's process is not
    visible); the message says which."""


@dataclass(frozen=True)
class SocketInfo:
    """One TCP socket as ``ss`` shows it.

    ``bytes_received`` counts bytes the kernel received (TCP_INFO ``tcpi_bytes_received``),
    ``recv_q`` those not yet read by the process, so ``bytes_read`` is what the process read.
    """

    state: str
    local: str
    peer: str
    inode: int
    pids: frozenset[int]
    recv_q: int = 0
    bytes_received: int = 0
    bytes_acked: int = 0

    @property
    def fin_received(self) -> bool:
        """The peer's FIN arrived (``bytes_received`` counts it as one byte of sequence)."""
        return self.state in FIN_RECEIVED_STATES

    @property
    def data_received(self) -> int:
        """Data bytes received: ``bytes_received`` without the FIN's one."""
        return max(0, self.bytes_received - (1 if self.fin_received else 0))

    @property
    def bytes_read(self) -> int:
        """Data bytes the owning process has read from the socket (received minus still queued)."""
        return max(0, self.data_received - (self.recv_q if self.state != "LISTEN" else 0))


@dataclass
class LinkSample:
    """The sockets of one link at one moment.

    Attributes:
        proxy_pids: pids holding the link's listening socket (the proxy), or the ones given.
        listening: whether anything listened on the link's ``listen`` address.
        accepted: the proxy's sockets of client connections, by inode.
        upstream: the proxy's sockets to the upstream server, by inode.
    """

    proxy_pids: frozenset[int]
    listening: bool
    accepted: dict[int, SocketInfo] = field(default_factory=dict)
    upstream: dict[int, SocketInfo] = field(default_factory=dict)

    def stream_input(self, stream: str) -> dict[int, SocketInfo]:
        """The sockets a toxic on ``stream`` reads its data from (see the module picture)."""
        return self.upstream if stream == "downstream" else self.accepted


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    if host.startswith("::ffff:"):
        host = host[len("::ffff:"):]
    return host, int(port) if port.isdigit() else -1


def _same(addr: str, want: str) -> bool:
    h1, p1 = _split(addr)
    h2, p2 = _split(want)
    if p1 != p2:
        return False
    loop = {"localhost", "127.0.0.1"}
    return h1 == h2 or (h1 in loop and h2 in loop)


def parse_ss(text: str, require_inode: bool = True) -> list[SocketInfo]:
    """Parse the output of ``ss -tanpieH`` (a record per socket; ``-i`` puts TCP_INFO on an
    indented continuation line).

    Returns:
        One :class:`SocketInfo` per record (records without an ``ino:`` field are skipped
        unless ``require_inode`` is False: destroyed sockets, ``ss -E``, have none).
    """
    records: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[:1].isspace() and records:
            records[-1] += " " + line.strip()
        else:
            records.append(line.strip())
    out = []
    for rec in records:
        m = _HEAD.match(rec)
        if not m:
            continue
        vals = {k: (int(r.group(1)) if (r := rx.search(rec)) else 0) for k, rx in _FIELDS.items()}
        if require_inode and not vals["ino"]:
            continue
        out.append(SocketInfo(m["state"], m["local"], m["peer"], vals["ino"],
                              frozenset(int(p) for p in _PID.findall(rec)), int(m["recvq"]),
                              vals["bytes_received"], vals["bytes_acked"]))
    return out


def _ss_binary() -> str:
    ss = shutil.which("ss") or next((p for p in ("/usr/bin/ss", "/sbin/ss", "/usr/sbin/ss", "/bin/ss")
                                     if os.path.exists(p)), None)
    if ss is None:
        raise SocketsUnavailable("iproute2's `ss` is not installed")
    return ss


def _filter(ports: list[int]) -> str:
    return "( " + " or ".join(f"sport = :{p} or dport = :{p}" for p in sorted(set(ports))) + " )"


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def _collect(stream, lines: list[str], times: list[float]) -> None:
    import time as _time

    for line in stream:
        times.append(_time.monotonic())
        lines.append(line)


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(2)


class DestroyWatch:
    """The link's sockets as the kernel destroys them (``ss -tinEH``: sock_diag destroy events,
    with each socket's last TCP_INFO), collected while a fault is in place: a connection cut
    between two samples still tells how many bytes it had read. Needs root (or
    CAP_NET_ADMIN) and ``stdbuf``; without them :meth:`stop` returns None."""

    def __init__(self, ports: list[int]) -> None:
        import threading

        self.lines: list[str] = []
        self.ready = False  # listening for destroy events (see _subscribed)
        self.times: list[float] = []  # time.monotonic() each line arrived
        #: ``(local, peer)`` -> when the kernel reported the socket destroyed (after :meth:`stop`)
        self.destroyed_at: dict[tuple[str, str], float] = {}
        self.proc = None
        stdbuf = shutil.which("stdbuf")
        try:
            ss = _ss_binary()
        except SocketsUnavailable:
            return
        if stdbuf is None or os.geteuid() != 0:
            return
        try:
            self.proc = subprocess.Popen([stdbuf, "-oL", ss, "-tinEH", _filter(ports)], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                                         preexec_fn=_die_with_parent)
        except OSError:
            self.proc = None
            return
        self.ready = _subscribed(self.proc.pid, timeout_s=3.0)
        # The reader holds no reference to this object, so the finalizer below can run.
        self._reader = threading.Thread(target=_collect, args=(self.proc.stdout, self.lines, self.times),
                                        daemon=True)
        self._reader.start()
        # A watch nobody stops (a fault never healed) ends with this object, or with this
        # process (PR_SET_PDEATHSIG), never outlives it.
        weakref.finalize(self, _end, self.proc)

    def stop(self) -> dict[tuple[str, str], SocketInfo] | None:
        """End the watch; the sockets destroyed meanwhile by ``(local, peer)``, or None when
        the watch could not run."""
        import signal as _signal

        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(_signal.SIGINT)
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(2)
        self._reader.join(2)
        lines, times = list(self.lines), list(self.times)
        for line, t in zip(lines, times):  # a record's first line is not indented
            if line.strip() and not line[:1].isspace():
                for sock in parse_ss(line, require_inode=False):
                    self.destroyed_at.setdefault((sock.local, sock.peer), t)
        return {(s.local, s.peer): s for s in parse_ss("".join(lines), require_inode=False)}


def _subscribed(pid: int, timeout_s: float) -> bool:
    """Wait until process ``pid`` (an ``ss -E``) has joined a sock_diag multicast group, i.e.
    receives destroy events from now on: one of its sockets is listed in ``/proc/net/netlink``
    with a non-zero ``Groups`` mask. A socket destroyed before that is never reported, so a
    watch started just before a toxic is added must be listening before the add. False when
    that was not seen within ``timeout_s`` seconds (or cannot be read)."""
    import time as _time

    deadline = _time.monotonic() + timeout_s
    while True:
        try:
            inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
            with open("/proc/net/netlink") as f:
                for line in f.readlines()[1:]:
                    cols = line.split()
                    if len(cols) >= 10 and cols[9] in inodes and int(cols[3], 16) != 0:
                        return True
        except (OSError, ValueError):
            pass
        if _time.monotonic() >= deadline:
            return False
        _time.sleep(0.005)


def _ss(ports: list[int], timeout_s: float) -> str:
    ss = _ss_binary()
    expr = _filter(ports)[2:-2]
    try:
        r = subprocess.run([ss, "-tanpieH", f"( {expr} )"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SocketsUnavailable(f"ss failed: {exc}") from None
    if r.returncode != 0:
        raise SocketsUnavailable(f"ss failed: {r.stderr.strip() or r.returncode}")
    return r.stdout


def sample_link(listen: str, upstream: str, proxy_pids: frozenset[int] | None = None,
                timeout_s: float = 10.0) -> LinkSample:
    """The link's sockets now.

    Args:
        listen: the link's listen address (``host:port``) on the proxy.
        upstream: the address the proxy forwards to.
        proxy_pids: the proxy's pids when known (from an earlier sample: a disabled link has no
            listening socket to find them by); else the owners of the listening socket.
        timeout_s: limit for the ``ss`` call, seconds.

    Raises:
        SocketsUnavailable: no ``ss``, it failed, or neither ``proxy_pids`` nor a visible owner
            of the listening socket is known (then the proxy's upstream sockets cannot be told
            from other processes' connections to the same server).
    """
    socks = parse_ss(_ss([_split(listen)[1], _split(upstream)[1]], timeout_s))
    listeners = [s for s in socks if s.state == "LISTEN" and _same(s.local, listen)]
    pids = frozenset(p for s in listeners for p in s.pids) or (proxy_pids or frozenset())
    if not pids:
        why = ("nothing listens on it" if not listeners else
               "its owner process is not visible (run as its user or as root)")
        raise SocketsUnavailable(f"cannot tell the proxy's sockets of link {listen}: {why}")
    sample = LinkSample(pids, bool(listeners))
    for s in socks:
        if s.state == "LISTEN":
            continue
        if _same(s.local, listen):
            sample.accepted[s.inode] = s
        elif _same(s.peer, upstream) and s.pids & pids:
            sample.upstream[s.inode] = s
    return sample


def stream_bytes(before: LinkSample, after: LinkSample, stream: str) -> dict[str, int]:
    """Bytes that arrived on ``stream``'s input sockets between two samples.

    A socket in both samples counts the growth of its ``bytes_received``; a socket only in
    ``after`` was opened after ``before`` was taken, so all of its bytes count. A socket gone by
    ``after`` counts nothing here (its bytes after ``before`` are not known from the kernel).

    Returns:
        ``{"bytes_in", "bytes_read", "connections_before", "connections_after",
        "connections_opened", "connections_closed"}``.
    """
    a, b = before.stream_input(stream), after.stream_input(stream)
    bytes_in = bytes_read = 0
    for ino, s in b.items():
        old = a.get(ino)
        bytes_in += s.data_received - (old.data_received if old else 0)
        bytes_read += s.bytes_read - (old.bytes_read if old else 0)
    closed = [s for ino, s in a.items() if ino not in b]
    return {"bytes_in": max(0, bytes_in), "bytes_read": max(0, bytes_read),
            "connections_before": len(a), "connections_after": len(b),
            "connections_opened": sum(1 for ino in b if ino not in a),
            "connections_closed": len(closed)}


def ended_read(prior: LinkSample | None, before: LinkSample, after: LinkSample, stream: str) -> int:
    """What the stream's input sockets that ended by ``after`` had read when last seen before
    the window (in ``before``, else in ``prior``): the part of a counter added at a
    connection's end (Toxiproxy's ``toxiproxy_proxy_received_bytes_total``) that is not the
    window's. "Ended" = gone, or its reader done although the socket is still listed (the peer's
    FIN: CLOSE-WAIT and later states)."""
    a0 = prior.stream_input(stream) if prior is not None else {}
    a1, b = before.stream_input(stream), after.stream_input(stream)
    total = 0
    for ino in set(a0) | set(a1):
        if ino in b and b[ino].state == "ESTAB":
            continue
        last = a1.get(ino) or a0[ino]
        total += last.bytes_read
    return total


def destroyed_bytes(prior: LinkSample | None, before: LinkSample, after: LinkSample, stream: str,
                    destroyed: dict[tuple[str, str], SocketInfo]) -> int:
    """Data bytes the stream's input sockets read after they were last sampled (in ``before``,
    else in ``prior``) and before the kernel destroyed them (a :class:`DestroyWatch` record of
    the same addresses). The final count is taken less one (a FIN may be counted as read), so
    a connection that only closed counts nothing."""
    a0 = prior.stream_input(stream) if prior is not None else {}
    a1, b = before.stream_input(stream), after.stream_input(stream)
    total = 0
    for ino in set(a0) | set(a1):
        if ino in b:
            continue
        last = a1.get(ino) or a0[ino]
        end = destroyed.get((last.local, last.peer))
        if end is None:
            continue
        final_read = max(0, end.bytes_received - end.recv_q - 1)
        total += max(0, final_read - last.bytes_read)
    return total


@dataclass(frozen=True)
class ConnectionWindow:
    """One connection of a link seen over a fault's window, on one stream's input socket.

    Attributes:
        local, peer: the socket's addresses.
        opened: first seen after the window began (all its bytes are the window's).
        ended: gone by the window's end, or its peer's FIN arrived (CLOSE-WAIT and later).
        ended_at: ``time.monotonic()`` the kernel reported it destroyed (a
            :class:`DestroyWatch` record), else None.
        read: data bytes the proxy read from it inside the window; None when it ended and
            no record tells how many it read after its last sample.
    """

    local: str
    peer: str
    opened: bool
    ended: bool
    ended_at: float | None
    read: int | None


def connection_windows(prior: LinkSample | None, before: LinkSample, after: LinkSample, stream: str,
                       destroyed: dict[tuple[str, str], SocketInfo] | None = None,
                       destroyed_at: dict[tuple[str, str], float] | None = None,
                       listen: str | None = None) -> list[ConnectionWindow]:
    """Each connection of the stream's input sockets over the window ``before`` .. ``after``,
    with what the proxy read from it in between (``prior``: a sample taken just before
    ``before``, for connections that ended between the two).

    A connection opened and ended between two samples is known only from the kernel's destroy
    records (``destroyed``); it is counted when its accepted socket (local address ``listen``:
    only the proxy accepts there) is among them, with ``read`` the bytes the proxy read from
    the client (``upstream``) or at least those the client acknowledged from the proxy
    (``downstream``: what passed the toxic chain, a lower bound of what it read).

    Returns:
        One :class:`ConnectionWindow` per connection.
    """
    a0 = prior.stream_input(stream) if prior is not None else {}
    a1, b = before.stream_input(stream), after.stream_input(stream)
    destroyed, destroyed_at = destroyed or {}, destroyed_at or {}
    out = []
    for ino in sorted(set(a0) | set(a1) | set(b)):
        first = a1.get(ino) or a0.get(ino)
        last = b.get(ino)
        start_read = first.bytes_read if first is not None else 0
        if last is not None and last.state == "ESTAB":
            out.append(ConnectionWindow(last.local, last.peer, first is None, False, None,
                                        max(0, last.bytes_read - start_read)))
            continue
        sock = last or first
        assert sock is not None
        end = destroyed.get((sock.local, sock.peer))
        if end is not None:
            read: int | None = max(0, end.bytes_received - end.recv_q - 1 - start_read)
        elif last is not None:  # still listed, its reader done (the peer's FIN)
            read = max(0, last.bytes_read - start_read)
        else:
            read = None
        out.append(ConnectionWindow(sock.local, sock.peer, first is None, True,
                                    destroyed_at.get((sock.local, sock.peer)), read))
    if listen is not None:
        sampled = {(x.local, x.peer) for smp in (prior, before, after) if smp is not None
                   for x in list(smp.accepted.values()) + list(smp.upstream.values())}
        for key, end in sorted(destroyed.items()):
            if key in sampled or not _same(end.local, listen):
                continue
            read = (max(0, end.bytes_received - end.recv_q - 1) if stream == "upstream" else end.bytes_acked)
            out.append(ConnectionWindow(end.local, end.peer, True, True, destroyed_at.get(key), read))
    return out
