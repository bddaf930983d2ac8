"""The fault kinds of issue 12 have teeth, and a window they did not reach is inconclusive.

Each kind on the whole reference stack (engine, recompute twin, LMCache, Redis, fs L2, proxy):
- retrieve_fail: the planted bug trust-failed-load is caught (recompute_equivalence); without
  a warm phase no lookup hits, the engine is never held before a retrieve: inconclusive.
- tier_flush: a mutation (the fs L2's object files zeroed: present, but an empty buffer) is
  caught only with L1 flushed first; without the flush L1 serves the good copy and the
  run passes, a hollow pass; with novel prompts after the flush its trigger (L2 hits) is not
  reached: inconclusive.
- l2_fault_inject: a hit one chunk longer than what LMCache loaded (the planted bug
  hit-plus-one-chunk stands in for a failed load counted as loaded) is caught in the phase of
  the failing loads; with nothing stored in L2 no load fails: inconclusive.

One stack for the module (reset between scenarios, as a suite does); the two cold runs are one
run (the ``cold`` fixture). Slow: about 6 minutes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvchaos_support import run_pooled, scenario_text

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "compose" / "reference.yml"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="the reference stack's tmpfs needs root")]

#: The mutation: every object of the fs L2 overwritten with zeros of the same size (an entry
#: whose metadata says present while its bytes are an empty buffer: the "all-zero output" class).
ZERO = """\
import os, sys
d = sys.argv[1]
files = sorted(f for f in os.listdir(d) if f.endswith(".data"))
for f in files:
    path = os.path.join(d, f)
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.write(bytes(size))
print(len(files))
"""


def run(pool, tmp_path: Path, text: str):
    return run_pooled(pool, tmp_path, text, STACK, f"bite-{tmp_path.name}")


def _scenario(name: str, phases: str, *, bugs: str = "[]", workload: str, checks: str) -> str:
    return scenario_text(name, phases, bugs=bugs, workload=workload, checks=checks)


RETRIEVE_PHASES = """\
  - name: warm
  - name: fail-load
    faults:
      - kind: retrieve_fail
        count: 1
        until: end
        trigger: {metric: kvchaos_engine_load_failed_tokens_total, service: engine, grew_by: 512}
"""
RETRIEVE_WORKLOAD = "{families: 1, prefix_tokens: [600], suffix_tokens: 8, requests: 1, concurrency: 1, max_tokens: 16}"
CHECKS = "  recompute_equivalence: {}\n  liveness: {request_deadline_s: 40}\n  evidence: {}\n"


def test_retrieve_fail_catches_a_trusted_failed_load(pool, tmp_path):
    result, checks = run(pool, tmp_path, _scenario("rf-bug", RETRIEVE_PHASES, bugs="[trust-failed-load]",
                                                   workload=RETRIEVE_WORKLOAD, checks=CHECKS))
    assert checks["evidence"].verdict == "passed", checks["evidence"].summary
    assert checks["recompute_equivalence"].verdict == "failed", checks["recompute_equivalence"].summary


FLUSH_WORKLOAD = "{families: 2, prefix_tokens: [512], suffix_tokens: 8, requests: 4, concurrency: 2, max_tokens: 16}"


def flush_phases(zero: Path, flush: bool) -> str:
    """warm, then the resend phase with its faults in place before its requests: the fs L2's
    objects zeroed, and (with ``flush``) L1 and Redis emptied first, so loads come from fs."""
    faults = f"""      - kind: hook
        name: zero-fs-objects
        service: lmcache
        apply: {{argv: [python3, "{zero}", "${{KVCHAOS_RUN_DIR}}/l2fs"]}}
        evidence: {{argv: ["true"]}}
        until: end
"""
    if flush:
        faults = """      - kind: tier_flush
        tiers: [l1, redis]
        until: end
        trigger: {metric: lmcache_mp_lookup_hit_l2_tokens_total, service: lmcache, grew_by: 256}
""" + faults
    return f"""  - name: warm
  - name: resend
    faults:
{faults}"""


def test_tier_flush_makes_a_mutated_l2_copy_be_read(pool, tmp_path):
    zero = tmp_path / "zero.py"
    zero.write_text(ZERO)
    # Without the flush the run passes: L1 still holds good copies (the hollow pass).
    (tmp_path / "a").mkdir()
    _, hollow = run(pool, tmp_path / "a", _scenario("flush-hollow", flush_phases(zero, flush=False),
                                                    workload=FLUSH_WORKLOAD, checks=CHECKS))
    assert hollow["recompute_equivalence"].verdict == "passed", hollow["recompute_equivalence"].summary
    (tmp_path / "b").mkdir()
    _, bit = run(pool, tmp_path / "b", _scenario("flush-bites", flush_phases(zero, flush=True),
                                                 workload=FLUSH_WORKLOAD, checks=CHECKS))
    assert bit["evidence"].verdict == "passed", bit["evidence"].summary
    assert bit["recompute_equivalence"].verdict == "failed", bit["recompute_equivalence"].summary


def test_tier_flush_trigger_not_reached_with_novel_prompts(pool, tmp_path):
    phases = """  - name: warm
  - name: flushed
    faults:
      - kind: tier_flush
        tiers: [l1]
        until: end
        trigger: {metric: lmcache_mp_lookup_hit_l2_tokens_total, service: lmcache, grew_by: 256}
"""
    # suffixes only: the flush phase's prompts share no chunk with what warm stored
    workload = "{families: 2, prefix_tokens: [0], suffix_tokens: 300, requests: 2, concurrency: 2, max_tokens: 4}"
    result, checks = run(pool, tmp_path, _scenario("flush-novel", phases, workload=workload, checks=CHECKS))
    ev = checks["evidence"]
    assert ev.verdict == "unknown" and result.exit_code == 4, ev.summary
    assert "faults acted: 1 of 1; triggers reached: 0 of 1" in ev.summary


INJECT_PHASES = """\
  - name: warm
  - name: fail-loads
    faults:
      - kind: l2_fault_inject
        gap_indices: [1]
        until: end
        trigger: {metric: lmcache_mp_l2_prefetch_failure_chunks_total, labels: {reason: not_found}, service: lmcache, grew_by: 1}
"""
INJECT_WORKLOAD = "{families: 2, prefix_tokens: [1024], suffix_tokens: 8, requests: 2, concurrency: 2, max_tokens: 16}"


def test_l2_fault_inject_catches_a_hit_longer_than_what_was_loaded(pool, tmp_path):
    result, checks = run(pool, tmp_path, _scenario("fi-bug", INJECT_PHASES, bugs="[hit-plus-one-chunk]",
                                                   workload=INJECT_WORKLOAD, checks=CHECKS))
    assert checks["evidence"].verdict == "passed", checks["evidence"].summary
    rq = checks["recompute_equivalence"]
    assert rq.verdict == "failed"
    # the warm phase's two requests are misses (two families, two at once): the wrong outputs
    # are those of the failing loads
    wrong = [m["request_id"] for m in rq.details["mismatches"]]
    assert wrong and all(r.startswith("fail-loads-") for r in wrong), wrong


@pytest.fixture(scope="module")
def cold(pool, tmp_path_factory):
    """One run with no warm phase for both kinds' inconclusive claims: retrieve_fail and
    l2_fault_inject side by side in a first phase whose requests are all misses (two new
    families) with nothing stored in L2. Each kind's own row of the evidence says that it did
    not act and why, so each claim is still proven on its own; one run instead of two saves a
    run and a whole stack restart (both kinds are disruptive: the pool starts the stack afresh
    after each)."""
    phases = (RETRIEVE_PHASES.replace("  - name: warm\n", "").replace("  - name: fail-load\n", "  - name: cold\n")
              + INJECT_PHASES.split("    faults:\n", 1)[1])
    return run(pool, tmp_path_factory.mktemp("cold"), _scenario("cold", phases, workload=INJECT_WORKLOAD, checks=CHECKS))


def _not_acted(checks, kind: str) -> dict:
    """The evidence check's row of the fault of ``kind``, asserted not to have acted."""
    (row,) = [r for r in checks["evidence"].details["faults"] if r["kind"] == kind]
    assert row["acted"] is False and row["bit"] is False and row["applied_at"] is not None, row
    assert row["trigger_reached"] is False, row
    return row


def test_a_cold_run_of_retrieve_fail_and_l2_fault_inject_is_inconclusive(cold):
    result, checks = cold
    ev = checks["evidence"]
    assert ev.verdict == "unknown" and result.exit_code == 4, ev.summary
    assert "faults acted: 0 of 2" in ev.summary and "triggers reached: 0 of 2" in ev.summary, ev.summary


def test_retrieve_fail_with_no_hit_is_inconclusive(cold):
    row = _not_acted(cold[1], "retrieve_fail")
    assert "never held before a retrieve" in row["evidence"]["reason"], row


def test_l2_fault_inject_with_nothing_in_l2_is_inconclusive(cold):
    row = _not_acted(cold[1], "l2_fault_inject")
    assert "no load from a wrapped adapter failed" in row["evidence"]["reason"], row
