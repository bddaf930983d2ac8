"""TTFT of a 2,048-token prefix: recompute vs LMCache hit, and the engine's peak RSS.

Starts redis-server, `lmcache server` (Redis + fs L2) and the reference engine with its
default flags (connector on, local prefix cache off) on free 127.0.0.1 ports, unless
``--engine-url`` points at a running engine. For each of ``--rounds`` fresh prefixes it
sends prefix + suffix A (a miss: TTFT(recompute)) and then prefix + suffix B (LMCache holds
the prefix: TTFT(hit)); TTFT is the time to the first SSE token event. Prints medians, the
ratio and the engine's peak RSS (VmHWM). Bounded: a few requests, each with a 120 s timeout.

    .venv/bin/python benchmarks/ttft_hit.py [--rounds 3] [--prefix-tokens 2048] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TELEMETRY_OFF = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1",
                 "LMCACHE_DISABLE_BANNER": "1", "VLLM_NO_USAGE_STATS": "1"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float) -> None:
    """Wait for a 2xx from ``url``; raise RuntimeError on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


def ttft(base: str, prompt: list[int], max_tokens: int = 4) -> tuple[float, dict]:
    """Seconds to the first streamed token, and the final event's cached_token_stats."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    first: float | None = None
    final: dict = {}
    start = time.perf_counter()
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and event["choices"][0]["token_ids"]:
                first = time.perf_counter() - start
            if "kv_transfer_params" in event:
                final = event["kv_transfer_params"]["cached_token_stats"]
    assert first is not None, "no token streamed"
    return first, final


def peak_rss_bytes(pid: int) -> int:
    """VmHWM (peak resident set) of ``pid`` in bytes, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found")


def main() -> int:
    """Run the benchmark; returns the exit status (0, or 1 when a target is missed)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--suffix-tokens", type=int, default=16)
    ap.add_argument("--engine-url", help="use a running engine (RSS needs --engine-pid)")
    ap.add_argument("--engine-pid", type=int)
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="extra flag for the engine this script starts (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    procs: list[subprocess.Popen] = []
    workdir = Path(tempfile.mkdtemp(prefix="kvchaos-ttft-"))
    env = {**os.environ, **TELEMETRY_OFF,
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def spawn(argv: list[str], name: str) -> subprocess.Popen:
        log = open(workdir / f"{name}.log", "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True, cwd=REPO)
        procs.append(p)
        return p

    try:
        base, engine_pid = args.engine_url, args.engine_pid
        if base is None:
            redis_port, lm_port, lm_http, lm_prom, eng_port = (free_port() for _ in range(5))
            spawn([shutil.which("redis-server") or "redis-server", "--port", str(redis_port),
                   "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], "redis")
            (workdir / "l2fs").mkdir()
            spawn([str(Path(sys.executable).parent / "lmcache"), "server", "--host",
                   "127.0.0.1", "--port", str(lm_port), "--http-port", str(lm_http),
                   "--prometheus-port", str(lm_prom), "--l1-size-gb", "0.5",
                   "--eviction-policy", "LRU", "--chunk-size", "256",
                   "--supported-transfer-mode", "auto",
                   "--l2-adapter", json.dumps({"type": "resp", "host": "127.0.0.1",
                                               "port": redis_port, "num_workers": 2}),
                   "--l2-adapter", json.dumps({"type": "fs",
                                               "base_path": str(workdir / "l2fs")})],
                  "lmcache")
            wait_http(f"http://127.0.0.1:{lm_http}/status", 60)
            engine = spawn([sys.executable, "-m", "chaos.engine", "serve", "--port",
                            str(eng_port), "--kv-connector", "lmcache-mp", "--lmcache-url",
                            f"tcp://127.0.0.1:{lm_port}", *args.engine_arg], "engine")
            base, engine_pid = f"http://127.0.0.1:{eng_port}", engine.pid
            wait_http(base + "/health", 120)
            deadline = time.monotonic() + 60
            while httpx.get(base + "/debug/state").json()["lmcache"]["state"] != "healthy":
                if time.monotonic() > deadline:
                    raise RuntimeError("engine did not connect to LMCache")
                time.sleep(0.2)
        ttft(base, [1] * 300)  # warm-up (allocator, code paths); not measured
        rng = random.Random(2048)
        miss, hit, hit_tokens = [], [], []
        for _ in range(args.rounds):
            prefix = [rng.randrange(256) for _ in range(args.prefix_tokens)]
            suffix_a = [rng.randrange(256) for _ in range(args.suffix_tokens)]
            suffix_b = [rng.randrange(256) for _ in range(args.suffix_tokens)]
            t_miss, s_miss = ttft(base, prefix + suffix_a)
            t_hit, s_hit = ttft(base, prefix + suffix_b)
            assert s_miss.get("external_cache_hit_tokens", 0) == 0, s_miss
            miss.append(t_miss)
            hit.append(t_hit)
            hit_tokens.append(s_hit.get("external_cache_hit_tokens", 0))
        ratio = statistics.median(miss) / statistics.median(hit)
        rss = peak_rss_bytes(engine_pid) if engine_pid else None
        fingerprint = httpx.get(base + "/debug/state").json()["fingerprint"]
        result = {
            "prefix_tokens": args.prefix_tokens, "suffix_tokens": args.suffix_tokens,
            "rounds": args.rounds, "fingerprint": fingerprint,
            "ttft_recompute_s": statistics.median(miss), "ttft_hit_s": statistics.median(hit),
            "lmcache_hit_tokens": hit_tokens, "ratio_recompute_over_hit": ratio,
            "engine_peak_rss_bytes": rss,
            "targets": {"ratio_at_least_3": ratio >= 3,
                        "rss_under_1GiB": None if rss is None else rss < 2**30},
        }
        if args.json:
            print(json.dumps(result))
        else:
            print(f"prefix {args.prefix_tokens} tokens + suffix {args.suffix_tokens}, "
                  f"{args.rounds} rounds, engine {fingerprint}")
            print(f"TTFT recompute (median): {result['ttft_recompute_s'] * 1000:8.1f} ms")
            print(f"TTFT LMCache hit (median): {result['ttft_hit_s'] * 1000:6.1f} ms  "
                  f"(hit tokens {hit_tokens})")
            print(f"ratio TTFT(recompute) / TTFT(hit): {ratio:.2f}  (target >= 3)")
            if rss is not None:
                print(f"engine peak RSS: {rss / 2**20:.0f} MiB  (target < 1024 MiB)")
        ok = ratio >= 3 and (rss is None or rss < 2**30) and all(
            h >= args.prefix_tokens // 256 * 256 for h in hit_tokens)
        return 0 if ok else 1
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
