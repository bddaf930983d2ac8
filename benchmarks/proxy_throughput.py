"""Benchmark of the kvchaos fault proxy (``python -m chaos.proxy``) on loopback.

Measures, in one run, against the proxy running as its own process (as stacks run it):

1. throughput: ``--gib`` GiB (default 1) sent through the proxy vs direct loopback, in
   ``--pairs`` alternating rounds (median ratio reported); target ratio >= 0.5. Each round also
   sends through a second proxy process started with ``KVCHAOS_PROXY_SPLICE=0`` (the plain
   fast path, bytes copied through Python), printed for comparison only;
2. added latency: p50 of a 1 KiB request / 1 KiB response round trip through the proxy minus
   direct; target < 0.3 ms;
3. ``--concurrency`` (default 200) connections at once, each echoing 16 KiB, no error allowed;
4. peak RSS of the proxy process (VmHWM); target < 200 MiB;
5. the proxy's CPU seconds per GiB moved, splice vs plain fast path (printed, no target).

Sender and receiver are threads of this process using blocking sockets (socket calls release
the GIL). Prints every figure and ratio; exit status 1 if a target is missed.

    .venv/bin/python benchmarks/proxy_throughput.py [--gib 1] [--rounds 2000]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chaos.proxy.client import ToxiproxyClient  # noqa: E402

CHUNK = 1024 * 1024


def start_proxy(loop: str, splice: bool = True) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m chaos.proxy --port 0 --loop LOOP`` (``KVCHAOS_PROXY_SPLICE=0`` when
    not ``splice``); return (process, API URL)."""
    env = {**os.environ, "KVCHAOS_PROXY_SPLICE": "1" if splice else "0"}
    proc = subprocess.Popen([sys.executable, "-m", "chaos.proxy", "--port", "0", "--loop", loop],
                            cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"proxy did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0), backlog=1024)


def addr(sock: socket.socket) -> str:
    return "127.0.0.1:%d" % sock.getsockname()[1]


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def throughput(target: str, sink: socket.socket, total: int) -> float:
    """Send ``total`` bytes to ``target`` whose far end is ``sink``; return bytes/s."""
    received = [0]

    def drain() -> None:
        conn, _ = sink.accept()
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        n = 0
        while True:
            got = conn.recv_into(view)
            if not got:
                break
            n += got
        received[0] = n
        conn.close()

    t = threading.Thread(target=drain)
    t.start()
    s = connect(target)
    payload = memoryview(os.urandom(CHUNK))
    start = time.perf_counter()
    sent = 0
    while sent < total:
        s.sendall(payload)
        sent += CHUNK
    s.shutdown(socket.SHUT_WR)
    t.join()
    elapsed = time.perf_counter() - start
    s.close()
    if received[0] != total:
        raise SystemExit(f"throughput: received {received[0]} of {total} bytes")
    return total / elapsed


def echo_server(sock: socket.socket, stop: threading.Event) -> None:
    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)
        except OSError:
            pass
        conn.close()

    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except (TimeoutError, socket.timeout):
            continue
        except OSError:
            return
        conn.settimeout(None)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def rtt_samples(target: str, rounds: int) -> list[float]:
    """Seconds of each 1 KiB request / 1 KiB response round trip (after 20 warm-up)."""
    s = connect(target)
    msg = b"q" * 1024
    times = []
    for i in range(rounds + 20):
        t0 = time.perf_counter()
        s.sendall(msg)
        got = 0
        while got < 1024:
            got += len(s.recv(1024 - got))
        if i >= 20:
            times.append(time.perf_counter() - t0)
    s.close()
    return times


def rtt_p50s(direct: str, proxied: str, rounds: int, blocks: int = 10) -> tuple[float, float]:
    """Median round trip (s) direct and proxied, measured in alternating blocks."""
    d: list[float] = []
    p: list[float] = []
    for _ in range(blocks):
        d += rtt_samples(direct, rounds // blocks)
        p += rtt_samples(proxied, rounds // blocks)
    return statistics.median(d), statistics.median(p)


def concurrent(target: str, n: int, size: int = 16 * 1024) -> int:
    """Open ``n`` connections at once, echo ``size`` bytes on each; return the error count."""
    errors = [0]
    barrier = threading.Barrier(n)
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            s = connect(target)
            barrier.wait(timeout=60)
            payload = bytes([i % 256]) * size
            s.sendall(payload)
            buf = bytearray()
            while len(buf) < size:
                data = s.recv(size - len(buf))
                if not data:
                    break
                buf += data
            s.close()
            if bytes(buf) != payload:
                raise ValueError("echo mismatch")
        except Exception:
            with lock:
                errors[0] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (/proc/PID/stat fields 14-15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB per throughput run")
    ap.add_argument("--pairs", type=int, default=3,
                    help="direct/proxied throughput pairs (median ratio reported)")
    ap.add_argument("--rounds", type=int, default=2000, help="round trips for the latency p50")
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--loop", default="auto", help="proxy event loop: auto, uvloop, asyncio")
    args = ap.parse_args()
    total = int(args.gib * 1024**3) // CHUNK * CHUNK

    procs = []
    ok = True
    try:
        proc, api = start_proxy(args.loop)
        procs.append(proc)
        plain_proc, plain_api = start_proxy(args.loop, splice=False)
        procs.append(plain_proc)
        tp = ToxiproxyClient(api, timeout_s=10)
        sink = listener()
        proxy = tp.create_proxy("bench-sink", "127.0.0.1:0", addr(sink))
        with ToxiproxyClient(plain_api, timeout_s=10) as plain_tp:
            plain = plain_tp.create_proxy("bench-sink", "127.0.0.1:0", addr(sink))
        # Direct and proxied runs alternate so that load from other processes hits all.
        pairs, plain_ratios = [], []
        cpu = {"splice": 0.0, "plain": 0.0}
        for _ in range(args.pairs):
            direct_bps = throughput(addr(sink), sink, total)
            c0 = cpu_seconds(proc.pid)
            proxied_bps = throughput(proxy.listen, sink, total)
            cpu["splice"] += cpu_seconds(proc.pid) - c0
            c0 = cpu_seconds(plain_proc.pid)
            plain_ratios.append(throughput(plain.listen, sink, total) / direct_bps)
            cpu["plain"] += cpu_seconds(plain_proc.pid) - c0
            pairs.append((proxied_bps / direct_bps, direct_bps, proxied_bps))
        pairs.sort()
        ratio, direct_bps, proxied_bps = pairs[len(pairs) // 2]
        print(f"throughput: direct {direct_bps / 2**20:8.1f} MiB/s, proxied "
              f"{proxied_bps / 2**20:8.1f} MiB/s over {total / 2**30:.2f} GiB; "
              f"ratio {ratio:.2f} (median of {len(pairs)} pairs, range "
              f"{pairs[0][0]:.2f}-{pairs[-1][0]:.2f}; target >= 0.5)")
        print(f"  for comparison, plain fast path (KVCHAOS_PROXY_SPLICE=0): ratio "
              f"{statistics.median(plain_ratios):.2f} (range {min(plain_ratios):.2f}-"
              f"{max(plain_ratios):.2f})")
        gib = args.pairs * total / 2**30
        print(f"  proxy CPU per GiB: splice {cpu['splice'] / gib:.2f} s, plain "
              f"{cpu['plain'] / gib:.2f} s (ratio {cpu['splice'] / max(cpu['plain'], 1e-9):.2f})")
        ok &= ratio >= 0.5

        stop = threading.Event()
        esock = listener()
        threading.Thread(target=echo_server, args=(esock, stop), daemon=True).start()
        eproxy = tp.create_proxy("bench-echo", "127.0.0.1:0", addr(esock))
        direct_rtt, proxied_rtt = rtt_p50s(addr(esock), eproxy.listen, args.rounds)
        added_ms = (proxied_rtt - direct_rtt) * 1000
        print(f"latency 1 KiB req/resp p50: direct {direct_rtt * 1e3:.3f} ms, proxied "
              f"{proxied_rtt * 1e3:.3f} ms; added {added_ms:.3f} ms (target < 0.3 ms)")
        ok &= added_ms < 0.3

        t0 = time.perf_counter()
        errs = concurrent(eproxy.listen, args.concurrency)
        print(f"concurrency: {args.concurrency} connections x 16 KiB echo, {errs} errors, "
              f"{time.perf_counter() - t0:.2f} s (target 0 errors)")
        ok &= errs == 0
        stop.set()

        rss = peak_rss_mib(proc.pid)
        print(f"proxy peak RSS: {rss:.1f} MiB (target < 200 MiB)")
        ok &= rss < 200
        tp.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    print("all targets met" if ok else "some targets missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
