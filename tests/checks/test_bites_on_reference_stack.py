"""On the real reference stack (engine, LMCache with Redis and fs L2, fault proxy, recompute
twin): hit_quality, slo, cancel aimed at a request state and the wider bitflip each bite on
what they are for, and each says "unknown" when it cannot decide. Three scenario runs on one
stack (about 3-4 minutes here): marked slow.

- clean: hits of stored prefixes pass hit_quality and slo (a 512-token hit is several times
  faster than its recompute); cancels land in `lookup` (held open by a latency toxic) and in
  `load` (held open by a stall before the retrieve); a cancel 300 ms after sending, beside a
  1.5 s latency on the LMCache link, lands in the lookup and reaches its default trigger (issue
  34: where the aborts landed); a 4096-bit flip of every L2 object, read
  while the fault is active, changes outputs (recompute_equivalence fails, the correct-hit rate
  of that phase drops) with the reads in its evidence.
- planted bug `hit-plus-one-chunk` and retrieves stalled 4 s: hits still counted, but slower than
  recompute (slo fails: no speedup) and wrong (hit_quality fails on the correct-hit rate); after
  L1 is cleared and the L2 copies deleted, re-sent stored prefixes miss (hit_quality fails).
- nothing to decide: a first phase where every family is new (no load for a cancel to land in, no
  stored prefix re-sent, no hit to time), corruption in a phase that sends no request, a cancel
  after the first token beside a 5 ms latency on the LMCache link (every abort lands after the
  lookup: its default trigger is not reached): every verdict is unknown with its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.runner.run import run_scenario
from chaos.runner.suite import load_and_validate

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "compose" / "reference.yml"

pytestmark = pytest.mark.slow

WORKLOAD = """workload: {families: 6, prefix_tokens: [512], suffix_tokens: 32, requests: 6, concurrency: 3,
           max_tokens: 4, stream: true}"""
CLEAR_L1 = """
      - kind: hook
        name: clear-l1{suffix}
        service: lmcache
        apply: {{http: {{url: "http://127.0.0.1:${{LMCACHE_HTTP_PORT}}/cache/clear", json: {{tier: l1, force: false}}}}}}
        evidence: {{argv: ["true"]}}
        duration: 300ms"""
STALL_RETRIEVES = """
      - kind: hook
        name: stall-retrieves{suffix}
        service: engine
        apply: {{http: {{url: "http://127.0.0.1:${{ENGINE_PORT}}/hooks/stall", json: {{point: before_retrieve, seconds: 1.0, count: 6}}}}}}
        evidence: {{argv: [grep, -q, "hook: stalling", "${{KVCHAOS_RUN_DIR}}/logs/engine.log"]}}
        until: end"""

CLEAN = f"""
name: bites-clean
stack: {STACK}
seed: 5
{WORKLOAD}
phases:
  - name: warm
  - name: recover
  - name: cancel-lookup
    faults:
      - {{kind: latency, name: slow-lookups, link: engine-lmcache, stream: downstream, latency_ms: 500, until: end}}
      - {{kind: cancel, name: cancel-in-lookup, mode: at_state, state: lookup, storm: true, until: end}}
  - name: cancel-timed             # 300 ms after sending, while lookups take 1.5 s: in the lookup
    faults:                        # (before cancel-load: its unused stalls outlive that phase)
      - {{kind: latency, name: slower-lookups, link: engine-lmcache, stream: downstream, latency_ms: 1500, until: end}}
      - {{kind: cancel, name: cancel-after-300ms, mode: after_ms, after_ms: 300, storm: true, until: end}}
  - name: cancel-load
    faults:{STALL_RETRIEVES.format(suffix="")}
      - {{kind: cancel, name: cancel-in-load, mode: at_state, state: load, storm: true, until: end}}
  - name: evict
    requests: 0
    faults:{CLEAR_L1.format(suffix="")}
  - name: flipped
    faults:
      - {{kind: l2_corrupt, name: flip-4096-bits, mode: bitflip, bits: 4096, target: both, until: end}}
checks:
  recompute_equivalence: {{}}
  hit_quality: {{phases: [recover], min_token_hit_rate: 0.9, min_request_hit_rate: 1.0, stored_prefix_full_hit: true,
                min_correct_hit_rate: 1.0}}
  slo: {{phases: [recover], hit_speedup: {{min_ratio: 1.2}}, ttft: {{lmcache_hit_partial: {{p99: 20s}}}}}}
  liveness: {{request_deadline_s: 60}}
  leaks: {{quiesce_s: 15}}
  evidence: {{}}
"""

BROKEN = f"""
name: bites-broken
stack: {STACK}
seed: 5
engine: {{bugs: [hit-plus-one-chunk]}}
{WORKLOAD}
phases:
  - name: warm
  - name: arm                      # the next 6 retrieves stall 4 s each (registered before they start)
    requests: 0
    faults:
      - kind: hook
        name: stall-retrieves
        service: engine
        apply: {{http: {{url: "http://127.0.0.1:${{ENGINE_PORT}}/hooks/stall", json: {{point: before_retrieve, seconds: 4.0, count: 6}}}}}}
        evidence: {{argv: ["true"]}}
        duration: 200ms
  - name: slow
  - name: evict
    requests: 0
    faults:{CLEAR_L1.format(suffix="")}
      - {{kind: l2_corrupt, name: delete-l2, mode: delete, target: both, start: 100ms, duration: 200ms}}
  - name: lost
checks:
  recompute_equivalence: {{}}
  hit_quality: {{phases: [slow, lost], min_correct_hit_rate: 1.0, stored_prefix_full_hit: true}}
  slo: {{phases: [slow], hit_speedup: {{}}}}
  liveness: {{request_deadline_s: 90}}
  evidence: {{}}
"""


UNDECIDABLE = f"""
name: bites-undecidable
stack: {STACK}
seed: 5
{WORKLOAD}
phases:
  - name: first
    faults:
      - {{kind: cancel, name: cancel-in-load, mode: at_state, state: load, storm: true, until: end}}
  - name: idle
    requests: 0
    faults:
      - {{kind: l2_corrupt, name: flip-unread, mode: bitflip, bits: 64, target: both, duration: 300ms}}
  - name: cancel-late              # the held-back class: lookups done long before the abort
    faults:
      - {{kind: latency, name: slight-latency, link: engine-lmcache, stream: downstream, latency_ms: 5, until: end}}
      - {{kind: cancel, name: cancel-after-first-token, mode: after_first_token, storm: true, until: end}}
checks:
  hit_quality: {{phases: [first], stored_prefix_full_hit: true}}
  slo: {{phases: [first], hit_speedup: {{}}}}
  evidence: {{}}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory, reference_pool):
    """Run the three scenarios on one reference stack (the session's pool, tests/conftest.py
    ``reference_pool``); results by scenario name."""
    root = tmp_path_factory.mktemp("bites")
    paths = []
    for text in (CLEAN, BROKEN, UNDECIDABLE):
        name = text.split("name: ", 1)[1].split("\n", 1)[0]
        paths.append(root / f"{name}.yaml")
        paths[-1].write_text(text)
    scenarios = load_and_validate(paths)
    pool = reference_pool
    out = {}
    for scenario in scenarios:
        stack = pool.acquire(STACK, scenario.stack_variables())
        result = run_scenario(scenario, stack, root / scenario.name, run_id=scenario.name, timeout_s=420)
        pool.release(STACK, result)
        assert result.error is None, result.error
        out[scenario.name] = result
    return out


def _check(result, name):
    return next(c for c in result.checks if c.name == name)


def _evidence_row(result, fid):
    return next(row for row in _check(result, "evidence").details["faults"] if row["fault_id"] == fid)


def _fault(result, fid):
    return next(f for f in result.faults if f.fault_id == fid)


def test_clean_hits_pass_hit_quality_and_slo(runs):
    r = runs["bites-clean"]
    hq = _check(r, "hit_quality")
    assert hq.verdict == "passed", hq.summary
    rec = hq.details["phases"]["recover"]
    assert rec["token_hit_rate"] >= 0.9 and rec["stored_prefix_full_hits"] == rec["stored_prefix_requests"] == 6
    assert rec["correct_hit_rate"] == 1.0
    slo = _check(r, "slo")
    assert slo.verdict == "passed", slo.summary
    (row,) = slo.details["hit_speedup"]["lengths"]
    assert row["prompt_tokens"] == 544 and row["ratio"] > 1.2


def test_cancels_land_in_the_state_they_aim_at(runs):
    r = runs["bites-clean"]
    lookup, load = _fault(r, "cancel-in-lookup"), _fault(r, "cancel-in-load")
    assert lookup.bit and lookup.evidence["landed"].get("lookup", 0) >= 1, lookup.evidence
    assert load.bit and load.evidence["landed"].get("load", 0) >= 1, load.evidence
    assert _check(r, "leaks").verdict == "passed", _check(r, "leaks").summary  # aborted lookups freed


def test_a_timed_cancel_beside_a_slowed_lmcache_link_is_proven_by_where_it_landed(runs):
    """Issue 34's held-back class, the reached side: no at_state, so its default trigger (beside
    a latency fault on the LMCache link) is an abort the engine located in the lookup or load."""
    r = runs["bites-clean"]
    cancel = _fault(r, "cancel-after-300ms")
    assert cancel.bit and cancel.evidence["landed_in_lmcache_call"] >= 1, {k: v for k, v in cancel.evidence.items() if k != "aborted_ids"}
    row = _evidence_row(r, "cancel-after-300ms")
    assert row["default_trigger"]["text"].startswith("an abort landed while the request's LMCache lookup")
    assert row["trigger_reached"] is True, row


def test_a_wide_bitflip_read_while_active_changes_outputs(runs):
    r = runs["bites-clean"]
    flip = _fault(r, "flip-4096-bits")
    assert flip.bit and flip.evidence["reads_of_corrupted"] >= 1, flip.evidence
    re = _check(r, "recompute_equivalence")
    assert re.verdict == "failed"
    assert {m["phase"] for m in re.details["mismatches"]} == {"flipped"}
    assert r.stats.by_phase["flipped"].correct_hit_rate < 1.0
    assert r.stats.by_phase["recover"].correct_hit_rate == 1.0


def test_slow_wrong_and_lost_hits_are_caught(runs):
    r = runs["bites-broken"]
    slo = _check(r, "slo")
    assert slo.verdict == "failed" and "hit brings no speedup" in slo.summary, slo.summary
    hq = _check(r, "hit_quality")
    assert hq.verdict == "failed"
    slow, lost = hq.details["phases"]["slow"], hq.details["phases"]["lost"]
    # hits (most of them: on a loaded host a lookup may time out and miss) that are wrong
    assert slow["verdict"] == "failed" and slow["correct_hit_rate"] < 1.0 and slow["request_hit_rate"] >= 0.5
    assert lost["verdict"] == "failed" and lost["stored_prefix_requests"] == 6 and lost["stored_prefix_full_hits"] == 0


def test_nothing_to_decide_is_unknown(runs):
    r = runs["bites-undecidable"]
    assert r.verdict == "unknown"
    cancel, flip = _fault(r, "cancel-in-load"), _fault(r, "flip-unread")
    assert not cancel.bit and "no picked request reached state load" in cancel.evidence["reason"], cancel.evidence
    assert not flip.bit and flip.evidence["corrupted"] >= 6 and "none read" in flip.evidence["reason"], flip.evidence
    assert _check(r, "evidence").verdict == "unknown"
    hq, slo = _check(r, "hit_quality"), _check(r, "slo")
    assert hq.verdict == "unknown" and "no request re-sent a prefix stored earlier" in hq.summary
    assert slo.verdict == "unknown" and "too few samples" in slo.summary
    # aborted after the first token, long after a 5 ms-slower lookup: the cancel bit, but no
    # abort landed in an LMCache call, so its default trigger beside the latency is not reached
    late = _fault(r, "cancel-after-first-token")
    assert late.bit and late.evidence["landed_in_lmcache_call"] == 0, late.evidence
    assert set(late.evidence["landed"]) <= {"prefill", "decode"}, late.evidence
    row = _evidence_row(r, "cancel-after-first-token")
    assert row["trigger_reached"] is False and "landed_in_lmcache_call=0" in row["problem"], row
