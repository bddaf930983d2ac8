"""How often the explore generator draws what each planted reference-engine bug needs (issue 33,
acceptance 1), from generation alone: no stack starts, nothing runs.

For seeds S and indexes 0..N-1 (``chaos.explore.generate.generate(offer, S, i)`` on
compose/reference.yml), each scenario is classified by the features below; the script prints
the fraction of scenarios with each feature and, per seed, the first index that has it (what an
exploration without ``--guide`` meets first: run = index + 1).

    local-hit       engine.prefix_caching on: a phase after warm re-sends prefixes the local
                    prefix cache covers (keep-locks-on-local-hit; scenarios/apc-local-covers-hit.yaml)
    dropped-retrieve a stall before the retrieve beside a downstream latency past the MQ timeout
                    on engine-lmcache in one phase: the adapter drops the retrieve unsent
                    (short-free-after-failed-load; scenarios/retrieve-dropped-slow-link.yaml)
    abort-with-blocks a cancel that lands after admission (at_state prefill, decode or load;
                    after the first token or at random on streamed requests; after 200+ ms
                    beside held answers): hold-blocks-on-abort (scenarios/cancel-storm.yaml)
    tenants         tenants with cache_salt sharing the families' prefixes, isolation checked
                    (drop-cache-salt; scenarios/tenant-isolation.yaml)
    and, for the bugs found already: hit-phase (hit_quality), hit-recovery, retrieve-fail,
    cut-off (a fault that cuts the engine off LMCache), preemption (small pool or preempt hook),
    cancel (any), store-after-hit (a prefix whose suffix completes a further chunk).

Usage: .venv/bin/python benchmarks/explore_features.py [--seeds 1 2 3] [-n 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos.explore.generate import MQ_TIMEOUT_MS, StackOffer, _cuts_lmcache_off, generate, stack_offer  # noqa: E402


def _faults(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for ph in d["phases"] for f in ph.get("faults", [])]


def _dropped_retrieve(d: dict[str, Any], offer: StackOffer) -> bool:
    for ph in d["phases"]:
        fs = ph.get("faults", [])
        if ph.get("requests") == 0:
            continue
        stall = any(f["kind"] == "stall" and f["point"] == "before_retrieve" for f in fs)
        slow = any(f["kind"] == "latency" and f["link"] == "engine-lmcache" and f["stream"] == "downstream"
                   and f["latency_ms"] > MQ_TIMEOUT_MS for f in fs)
        if stall and slow:
            return True
    return False


def _abort_with_blocks(d: dict[str, Any], offer: StackOffer) -> bool:
    streamed = d["workload"].get("stream") is not False
    for f in _faults(d):
        if f["kind"] != "cancel":
            continue
        if f["mode"] == "at_state" and f["state"] in ("prefill", "decode", "load"):
            return True
        if f["mode"] in ("after_first_token", "random") and streamed:
            return True
        if f["mode"] == "after_ms" and f.get("after_ms", 0) >= 200:
            return True
    return False


def _store_after_hit(d: dict[str, Any], offer: StackOffer) -> bool:
    w = d["workload"]
    lengths = w["prefix_tokens"]
    used = [lengths[i % len(lengths)] for i in range(w["families"])]
    return any(p >= offer.chunk and p % offer.chunk + w["suffix_tokens"] >= offer.chunk for p in used)


#: feature name -> (planted bug it serves, test on one generated scenario)
FEATURES: dict[str, tuple[str, Callable[[dict[str, Any], StackOffer], bool]]] = {
    "local-hit": ("keep-locks-on-local-hit", lambda d, o: bool(d.get("engine", {}).get("prefix_caching"))),
    "dropped-retrieve": ("short-free-after-failed-load", _dropped_retrieve),
    "abort-with-blocks": ("hold-blocks-on-abort", _abort_with_blocks),
    "tenants": ("drop-cache-salt", lambda d, o: "tenants" in d["workload"] and "isolation" in d["checks"]),
    "hit-phase": ("hit-plus-one-token/chunk", lambda d, o: "hit_quality" in d["checks"]),
    "hit-recovery": ("no-reconnect", lambda d, o: "hit_recovery" in d["checks"]),
    "retrieve-fail": ("trust-failed-load, retry-failed-load-forever",
                      lambda d, o: any(f["kind"] == "retrieve_fail" for f in _faults(d))),
    "cut-off": ("repoll-timed-out-lookup", lambda d, o: any(_cuts_lmcache_off(f, o) for f in _faults(d))),
    "preemption": ("stale-blocks-on-resume", lambda d, o: any(f["kind"] == "preempt" for f in _faults(d))),
    "cancel": ("skip-abort-cleanup", lambda d, o: any(f["kind"] == "cancel" for f in _faults(d))),
    "store-after-hit": ("store-after-hit-wrong-blocks, store-before-compute", _store_after_hit),
}


def measure(offer: StackOffer, seeds: list[int], n: int) -> dict[str, Any]:
    """Fractions of the first ``n`` scenarios of each seed with each feature, and each seed's
    first index with it (None: none in ``n``).

    Returns:
        ``{"fraction": {feature: float}, "first": {feature: {seed: int | None}}, "n": int}``.
    """
    count = {k: 0 for k in FEATURES}
    first: dict[str, dict[int, int | None]] = {k: {s: None for s in seeds} for k in FEATURES}
    for s in seeds:
        for i in range(n):
            d = generate(offer, s, i)
            for k, (_bug, test) in FEATURES.items():
                if test(d, offer):
                    count[k] += 1
                    if first[k][s] is None:
                        first[k][s] = i
    total = n * len(seeds)
    return {"fraction": {k: count[k] / total for k in FEATURES}, "first": first, "n": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("-n", type=int, default=200, help="scenarios per seed (indexes 0..n-1)")
    ap.add_argument("--stack", default=str(REPO / "compose" / "reference.yml"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = measure(stack_offer(a.stack), a.seeds, a.n)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"| feature | bug | fraction of {out['n']} | first index per seed {a.seeds} |")
    print("|---|---|---|---|")
    for k, (bug, _t) in FEATURES.items():
        firsts = ", ".join("-" if v is None else str(v) for v in out["first"][k].values())
        print(f"| {k} | {bug} | {out['fraction'][k]:.3f} | {firsts} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
