from chaos.checks import Snapshots, isolation
from chaos.checks.isolation import common_prefix_len

SHARED = list(range(1000, 1512))   # a 512-token system prompt both tenants use


def test_same_tenant_reuse_passes(hb):
    hb.request("a-1", SHARED + [1, 2, 3], [9], tenant="A", t0=0, t1=1)
    hb.request("a-2", SHARED + [4, 5], [9], tenant="A", external=512, t0=2, t1=3)
    hb.request("b-1", SHARED + [6], [9], tenant="B", t0=4, t1=5)
    r = isolation.check(hb.ops, Snapshots(), {})
    assert r.verdict == "passed", r.summary
    assert r.details["hit_requests"] == 1


def test_cross_tenant_hit_fails_and_names_both_tenants(hb):
    hb.request("a-1", SHARED + [1, 2, 3], [9], tenant="A", t0=0, t1=1)
    hb.request("b-1", SHARED + [7], [9], tenant="B", external=512, t0=2, t1=3)
    r = isolation.check(hb.ops, Snapshots(), {})
    assert r.verdict == "failed"
    v = r.details["violations"][0]
    assert (v["request_id"], v["tenant"], v["other_tenant"], v["other_request_id"]) == ("b-1", "B", "A", "a-1")
    assert "tenant B" in r.summary and "tenant A's req a-1" in r.summary


def test_hit_longer_than_same_tenant_prefix_fails(hb):
    # B ran a 256-token prefix; a 512-token hit can only have come from A.
    hb.request("b-0", SHARED[:256] + [5], [9], tenant="B", t0=0, t1=1)
    hb.request("a-1", SHARED, [9], tenant="A", t0=0, t1=1, process="client-1")
    hb.request("b-1", SHARED + [7], [9], tenant="B", external=512, t0=2, t1=3)
    r = isolation.check(hb.ops, Snapshots(), {})
    assert r.verdict == "failed" and r.details["violations"][0]["same_tenant_lcp"] == 256


def test_concurrent_same_tenant_source_counts(hb):
    # a-1 stored its prefix before a-2 finished, even though a-1 completed later.
    hb.request("a-1", SHARED + [1], [9], tenant="A", t0=0, t1=5)
    hb.request("a-2", SHARED + [2], [9], tenant="A", external=256, t0=1, t1=3, process="client-1")
    assert isolation.check(hb.ops, Snapshots(), {}).verdict == "passed"


def test_own_prefix_after_preemption_counts(hb):
    hb.request("a-1", SHARED, [9], tenant="A", external=256, preemptions=1)
    assert isolation.check(hb.ops, Snapshots(), {}).verdict == "passed"
    hb2 = type(hb)()
    hb2.request("a-1", SHARED, [9], tenant="A", external=256)
    r = isolation.check(hb2.ops, Snapshots(), {})
    assert r.verdict == "failed" and "phantom" in r.summary


def test_multi_turn_prefix_includes_earlier_output(hb):
    hb.request("a-1", SHARED, [7, 8, 9], tenant="A", t0=0, t1=1)
    hb.request("a-2", SHARED + [7, 8, 9, 4], [1], tenant="A", local=515, t0=2, t1=3)
    assert isolation.check(hb.ops, Snapshots(), {}).verdict == "passed"


def test_no_completed_request_is_unknown(hb):
    hb.request("a-1", SHARED, outcome="fail", tenant="A")
    assert isolation.check(hb.ops, Snapshots(), {}).verdict == "unknown"


def test_hit_without_prompt_tokens_is_unknown(hb):
    hb.request("a-1", SHARED, [9], tenant="A", external=256)
    hb.ops[0]["value"]["prompt_token_ids"] = None
    assert isolation.check(hb.ops, Snapshots(), {}).verdict == "unknown"


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0


def test_a_failed_requests_output_explains_no_hit(hb):
    # a-1 failed: only its prompt was computed, so its "output" tokens are no cache source.
    hb.request("a-1", SHARED[:300], [1, 2, 3, 4], tenant="A", t0=0, t1=1, outcome="fail")
    hb.request("a-2", SHARED[:300] + [1, 2, 3, 4, 5], [9], tenant="A", external=304, t0=2, t1=3)
    r = isolation.check(hb.ops, Snapshots(), {})
    assert r.verdict == "failed"
    v = r.details["violations"][0]
    assert (v["same_tenant_lcp"], v["same_tenant_source"]) == (300, "a-1")


def test_phantom_hit_without_salt_names_no_source(hb):
    hb.request("x-0", [7], [9], t0=0, t1=1)
    hb.request("x-1", [8] + SHARED, [9], external=256, t0=2, t1=3)
    r = isolation.check(hb.ops, Snapshots(), {})
    v = r.details["violations"][0]
    assert (v["same_tenant_lcp"], v["same_tenant_source"], v["other_request_id"]) == (0, None, None)
    assert r.details["tenants"] == ["(no salt)"]
    assert r.summary == ("req x-1 (tenant (no salt)) reused 256 cached tokens but its tenant's longest "
                         "common prefix is 0: no request in the history shares that prefix (phantom hit "
                         "or stale cache)")


def test_source_is_the_first_of_equal_prefixes_and_a_one_token_match_counts(hb):
    hb.request("a-1", [5, 6, 7], [9], tenant="A", t0=0, t1=1)
    hb.request("a-2", [5, 6, 8], [9], tenant="A", t0=0, t1=1, process="client-1")
    hb.request("a-3", [5, 6, 1, 2], [9], tenant="A", external=3, t0=2, t1=3)
    hb.request("b-1", [4], [9], tenant="B", t0=0, t1=1, process="client-2")
    hb.request("b-2", [4, 1, 2], [9], tenant="B", external=2, t0=2, t1=3, process="client-2")
    r = isolation.check(hb.ops, Snapshots(), {})
    got = {v["request_id"]: (v["same_tenant_lcp"], v["same_tenant_source"]) for v in r.details["violations"]}
    assert got == {"a-3": (2, "a-1"), "b-2": (1, "b-1")}
    assert r.summary.endswith("(and 1 more)")
