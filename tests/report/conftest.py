"""A realistic synthetic run (phases, a latency fault, four clients, a planted wrong output)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from chaos.checks import LeakSample, ServiceExit, Snapshots, run_checks
from chaos.report import build_result
from chaos.report.model import Durations, RunResult


def synthetic_history(seed: int = 7) -> tuple[list[dict[str, Any]], Snapshots]:
    """About 70 requests over warm / stall / recover, a latency fault during stall, a request
    failing with HTTP 500, an abort on purpose, and the first request of client-1 in recover served a
    wrong first token (expected 104, got 7)."""
    rng = random.Random(seed)
    ops: list[dict[str, Any]] = []

    def add(t: float, process: str, type_: str, f: str, phase: str, **kw: Any) -> None:
        ops.append({"index": 0, "time": round(t, 4), "process": process, "type": type_, "f": f, "phase": phase,
                    "request_id": kw.get("request_id"), "fault_id": kw.get("fault_id"), "value": kw.get("value", {})})

    prefixes = [list(range(1000 + 300 * k, 1000 + 300 * k + n)) for k, n in enumerate([255, 256, 257, 512])]
    expected: dict[str, list[int]] = {}
    phases = [("warm", 0.0, 12.0), ("stall", 12.0, 24.0), ("recover", 24.0, 34.0)]
    n = 0
    planted: str | None = None
    last_end = [0.0] * 4
    for phase, start, end in phases:
        for c in range(4):
            t = max(start, last_end[c]) + rng.uniform(0, 0.5)
            while t < end - 1:
                rid = f"w-{n}"
                n += 1
                fam = rng.randrange(4)
                prompt = prefixes[fam] + [rng.randrange(256) for _ in range(32)]
                out = [rng.randrange(256) for _ in range(16)]
                expected[rid] = list(out)
                stall = phase == "stall"
                lat = rng.uniform(3.0, 3.6) if stall else rng.uniform(0.4, 1.6)
                ttft = lat * 0.35
                add(t, f"client-{c}", "invoke", "complete", phase, request_id=rid,
                    value={"prompt_token_ids": prompt, "prompt_len": len(prompt), "tenant": None, "stream": True,
                           "max_tokens": 16, "family": fam})
                warm = phase != "warm" and len(prefixes[fam]) >= 256
                if planted is None and phase == "recover" and c == 1 and fam == 3:
                    planted = rid
                if rid == "w-40":
                    add(t + lat, f"client-{c}", "fail", "complete", phase, request_id=rid,
                        value={"error": "HTTP 500: KV load failed", "status": 500, "prompt_len": len(prompt)})
                elif rid == "w-51":
                    add(t + 0.2, f"client-{c}", "info", "complete", phase, request_id=rid,
                        value={"aborted": True, "error": "aborted by client after 200 ms", "prompt_len": len(prompt)})
                    lat = 0.2
                else:
                    if stall and rng.random() < 0.6:
                        stats = {"lookup": "timeout", "external_cache_hit_tokens": 0}
                    elif warm and rng.random() < 0.7:
                        ext = (len(prefixes[fam]) // 256) * 256
                        stats = {"lookup": "hit", "external_cache_hit_tokens": ext}
                    elif warm and rng.random() < 0.5:
                        stats = {"lookup": "miss", "local_cache_hit_tokens": 256}
                    else:
                        stats = {"lookup": "miss"}
                    if rid == planted:
                        stats = {"lookup": "hit", "external_cache_hit_tokens": 512}
                        out = [7] + out[1:]
                        expected[rid][0] = 104
                    add(t + lat, f"client-{c}", "ok", "complete", phase, request_id=rid,
                        value={"token_ids": out, "finish_reason": "length", "prompt_len": len(prompt),
                               "cached_token_stats": {"local_cache_hit_tokens": 0, "load_failed_tokens": 0,
                                                      "num_preemptions": 0, **stats},
                               "usage": {"prompt_tokens": len(prompt), "completion_tokens": 16},
                               "ttft_s": ttft, "itl_s": [(lat - ttft) / 15] * 15, "latency_s": lat})
                last_end[c] = t + lat
                t += lat + rng.uniform(0.05, 0.3)
    add(12.0, "nemesis", "invoke", "apply", "stall", fault_id="stall-latency",
        value={"kind": "latency", "params": {"link": "engine-lmcache", "latency_ms": 3000, "stream": "downstream"}})
    add(12.02, "nemesis", "ok", "apply", "stall", fault_id="stall-latency", value={"kind": "latency"})
    add(20.0, "nemesis", "invoke", "heal", "stall", fault_id="stall-latency", value={"kind": "latency"})
    add(20.01, "nemesis", "ok", "heal", "stall", fault_id="stall-latency",
        value={"kind": "latency", "evidence": {"bit": True, "connections": 4, "bytes_delayed": 182340}})
    add(26.0, "nemesis", "invoke", "apply", "recover", fault_id="kill-redis", value={"kind": "process_kill",
                                                                                      "params": {"service": "redis"}})
    add(26.01, "nemesis", "ok", "apply", "recover", fault_id="kill-redis", value={"kind": "process_kill"})
    add(30.0, "nemesis", "invoke", "heal", "recover", fault_id="kill-redis", value={"kind": "process_kill"})
    add(30.5, "nemesis", "ok", "heal", "recover", fault_id="kill-redis",
        value={"kind": "process_kill", "evidence": {"bit": False, "reason": "no request touched redis"}})
    ops.sort(key=lambda o: o["time"])
    for i, o in enumerate(ops):
        o["index"] = i
    snaps = Snapshots(
        expected=expected, leak_sources=["lmcache", "engine"], quiesce_waited_s=10.0,
        leak_samples=[LeakSample(source="lmcache", time=35 + i, values={"read_locked_count": v, "active_sessions": 0})
                      for i, v in enumerate([3, 1, 1])]
        + [LeakSample(source="engine", time=35.0, values={"open_sessions": 0})],
        service_exits=[ServiceExit(service="redis", time=26.01, returncode=-9, killed_by_fault=True)])
    return ops, snaps


def synthetic_result(ops: list[dict[str, Any]], snaps: Snapshots, **kw: Any) -> RunResult:
    """Check and assemble the synthetic run."""
    checks = run_checks(ops, snaps, {"recompute_equivalence": {}, "liveness": {"request_deadline_s": 30},
                                     "leaks": {"quiesce_s": 10}, "evidence": {}, "isolation": {}})
    args: dict[str, Any] = dict(run_id="20261129-142200-lookup-stall", scenario="lookup-stall-during-warm-hits",
                                description="Lookups stall past the client deadline; the engine must fall back to recompute.",
                                seed=7, history=ops, checks=checks, scenario_path="scenarios/lookup-stall.yml",
                                stack="compose/reference.yml", started_at="2026-11-29T14:22:00Z",
                                durations=Durations(total_s=52.3, stack_up_s=9.1, workload_s=34.0, quiesce_s=3.0),
                                service_exits=snaps.service_exits, deadline_s=30)
    args.update(kw)
    return build_result(**args)


@pytest.fixture
def synthetic() -> tuple[list[dict[str, Any]], Snapshots, RunResult]:
    """(ops, snapshots, result) of the synthetic run."""
    ops, snaps = synthetic_history()
    return ops, snaps, synthetic_result(ops, snaps)


@pytest.fixture
def run_dir(tmp_path: Path, synthetic) -> Path:
    """A written reports/<run-id>/ of the synthetic run, with two log files."""
    ops, _, result = synthetic
    d = tmp_path / result.run_id
    (d / "logs").mkdir(parents=True)
    (d / "logs" / "engine.log").write_text("engine started\n")
    (d / "logs" / "lmcache.log").write_text("lmcache started\n")
    from chaos.report import write_report
    write_report(d, result, ops)
    return d


@pytest.fixture
def make_result(synthetic):
    """Build the synthetic run's RunResult with overrides (xfail=..., error=...)."""
    ops, snaps, _ = synthetic
    return lambda **kw: synthetic_result(ops, snaps, **kw)
