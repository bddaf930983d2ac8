"""The vLLM CPU stack in figures (issue 31), all measured in one run on this machine:

1. start-up: seconds from nothing to a healthy compose/vllm-cpu.yml (vLLM with LMCache's MP
   connector, the LMCache MP server, Redis, the proxy, the recompute twin) on the local backend;
2. RSS per process of each service (psutil, MB), and the total;
3. TTFT of a ``--prefix-tokens`` prompt served from LMCache against its recompute: for each of
   ``--rounds`` fresh prefixes, prefix + suffix A (a miss: vLLM computes it, LMCache stores it),
   vLLM's own prefix cache reset (``POST /reset_prefix_cache``), then prefix + suffix B (the
   prefix comes from LMCache: vLLM's ``vllm:external_prefix_cache_hits_total`` must grow); the
   medians and their ratio;
4. the wall time of the same scenarios (``--scenarios``, stack start included) with ``kvchaos
   run`` on the vLLM stack and on the reference stack, and their ratio.

Ratios are the figures to compare between machines (the host is shared and noisy). Needs the vLLM
venv (``make setup-vllm`` or ``KVCHAOS_VLLM_PYTHON``). One vLLM stack at a time: part 4 starts
its own after parts 1-3 stopped theirs. Bounded: every request has a 300 s timeout, every
``kvchaos run`` a 1,800 s one.

    .venv/bin/python benchmarks/vllm_stack.py [--rounds 2] [--prefix-tokens 2048]
        [--scenarios smoke tenant-isolation] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chaos import interrupts  # noqa: E402
from chaos.prometheus import scrape_counters  # noqa: E402
from chaos.runner.stacks import StackPool  # noqa: E402

VLLM_STACK = REPO / "compose" / "vllm-cpu.yml"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
VOCAB = 1000  # below the tiny model's vocabulary of 1,024 (chaos/vllm/model.py)


def ttft(base: str, model: str, prompt: list[int]) -> float:
    """Seconds from sending ``prompt`` to vLLM's first streamed token (4 tokens, greedy)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    t0 = time.monotonic()
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                return time.monotonic() - t0
    raise RuntimeError("no token streamed")


def external_hits(base: str) -> float:
    """vLLM's external (LMCache) prefix-cache hit tokens so far."""
    return scrape_counters(f"{base}/metrics", [EXTERNAL_HITS])[EXTERNAL_HITS] or 0.0


def rss_by_service(stack) -> dict[str, list[tuple[str, float]]]:
    """``{service: [(process name, RSS MB), ...]}`` of every live process of the stack."""
    out: dict[str, list[tuple[str, float]]] = {}
    for name in stack.status():
        for pid in sorted(stack.service_pids(name) or ()):
            try:
                p = psutil.Process(pid)
                out.setdefault(name, []).append((p.name(), p.memory_info().rss / 1e6))
            except psutil.Error:
                continue
    return out


def model_name(base: str) -> str:
    """The served model's id (``GET /v1/models``)."""
    return httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]


def stack_figures(rounds: int, prefix_tokens: int, root: Path) -> dict:
    """Parts 1-3 on one vLLM stack (stopped before returning)."""
    pool = StackPool("local", root / "stacks")
    try:
        t0 = time.monotonic()
        stack = pool.acquire(VLLM_STACK, {})
        start_s = time.monotonic() - t0
        base = stack.settings.engine_url
        rss = rss_by_service(stack)
        model = model_name(base)
        rng = random.Random(7)
        miss, hit, grew = [], [], []
        for _ in range(rounds):
            prefix = [rng.randrange(VOCAB) for _ in range(prefix_tokens)]
            miss.append(ttft(base, model, prefix + [rng.randrange(VOCAB) for _ in range(16)]))
            httpx.post(f"{base}/reset_prefix_cache", timeout=60).raise_for_status()
            before = external_hits(base)
            hit.append(ttft(base, model, prefix + [rng.randrange(VOCAB) for _ in range(16)]))
            grew.append(external_hits(base) - before)
        return {"start_s": start_s, "rss_mb": rss, "ttft_recompute_s": miss, "ttft_lmcache_s": hit,
                "external_hit_tokens": grew}
    finally:
        pool.close()


def suite_wall(stack: Path | None, scenarios: list[str], out: Path) -> tuple[float, int]:
    """Wall seconds and exit code of ``kvchaos run`` of ``scenarios`` (on ``stack``, else each
    scenario's own stack)."""
    cmd = [str(REPO / ".venv" / "bin" / "kvchaos"), "run", "--report-dir", str(out)]
    if stack is not None:
        cmd += ["--stack", str(stack)]
    cmd += [str(REPO / "scenarios" / f"{s}.yaml") for s in scenarios]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rc = proc.wait(timeout=1800)
    except BaseException:
        # A signal or the timeout: SIGTERM lets kvchaos heal its faults and stop its stack
        # (subprocess.run would SIGKILL it and leave the stack's services up).
        proc.terminate()
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    return time.monotonic() - t0, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--scenarios", nargs="+", default=["smoke", "tenant-isolation"])
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    # Run through interrupts.script_exit: SIGINT/SIGTERM raise RunInterrupted, so the pool's
    # stack and a running `kvchaos run` come down before the exit (without it a SIGTERM left
    # every service of the stack up).
    with tempfile.TemporaryDirectory(prefix="kvchaos-bench-vllm-") as tmp:
        root = Path(tmp)
        figs = stack_figures(args.rounds, args.prefix_tokens, root)
        vllm_s, vllm_rc = suite_wall(VLLM_STACK, args.scenarios, root / "vllm")
        ref_s, ref_rc = suite_wall(None, args.scenarios, root / "reference")
    miss, hit = statistics.median(figs["ttft_recompute_s"]), statistics.median(figs["ttft_lmcache_s"])
    figs.update({"suite_scenarios": args.scenarios, "suite_vllm_s": vllm_s, "suite_vllm_exit": vllm_rc,
                 "suite_reference_s": ref_s, "suite_reference_exit": ref_rc,
                 "ttft_ratio_lmcache_over_recompute": hit / miss, "suite_ratio_vllm_over_reference": vllm_s / ref_s})
    print(f"vLLM stack start-up: {figs['start_s']:.1f} s")
    total = 0.0
    for service, procs in figs["rss_mb"].items():
        mb = sum(m for _, m in procs)
        total += mb
        print(f"  RSS {service}: {mb:.0f} MB ({', '.join(f'{n} {m:.0f}' for n, m in procs)})")
    print(f"  RSS total: {total:.0f} MB")
    print(f"TTFT of a {args.prefix_tokens}-token prompt: recompute {miss:.3f} s, from LMCache {hit:.3f} s "
          f"(median of {args.rounds}; external hit tokens per round {figs['external_hit_tokens']}): "
          f"ratio {hit / miss:.2f}")
    print(f"kvchaos run {' '.join(args.scenarios)} (stack start included): vLLM {vllm_s:.0f} s (exit {vllm_rc}), "
          f"reference {ref_s:.0f} s (exit {ref_rc}): ratio {vllm_s / ref_s:.2f}")
    if args.json:
        args.json.write_text(json.dumps(figs, indent=2))
    ok = vllm_rc == 0 and ref_rc == 0 and all(g > 0 for g in figs["external_hit_tokens"])
    return 0 if ok else 1


if __name__ == "__main__":
    interrupts.script_exit(main, "vllm_stack")
