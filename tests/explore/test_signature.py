"""Signatures deduplicate findings: same failed checks, diagnosis class and fault kinds are one
finding; a shipped xfail scenario with the same fault kinds, or whose log marks the run logged, is
"known" (never with a planted bug)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from chaos.explore.signature import (KnownFinding, Signature, diagnosis_class, fault_targets, known_findings,
                                    match_known, run_log_window, signature_of)
from chaos.scenario.loader import load_scenario

REPO = Path(__file__).resolve().parents[2]


def test_diagnosis_class_is_the_most_frequent_without_detail() -> None:
    assert diagnosis_class(["kv_content (zero)", "kv_content (shifted)", "length_mismatch"]) == "kv_content"
    assert diagnosis_class([]) == ""
    assert diagnosis_class(["b", "a"]) == "a"  # a tie: alphabetical, so deterministic


def test_same_failure_same_signature_order_free() -> None:
    s = load_scenario(REPO / "scenarios" / "lookup-timeout.yaml")
    a = signature_of(["recompute_equivalence", "liveness"], "kv_content", s)
    b = signature_of(["liveness", "recompute_equivalence", "liveness"], "kv_content", s)
    assert a == b and a.text() == "checks=liveness+recompute_equivalence | diagnosis=kv_content | faults=latency"
    assert signature_of(["liveness"], "kv_content", s) != a
    assert signature_of(["recompute_equivalence", "liveness"], "", s) != a
    assert a.slug() == "liveness-recompute-equivalence-kv-content-latency"


def test_known_findings_are_the_xfail_scenarios() -> None:
    known = known_findings([REPO / "scenarios"])
    names = {k.name for k in known}
    assert "restart-between-heartbeats" in names
    assert all(load_scenario(k.file).xfail is not None for k in known)
    assert "smoke" not in names


def test_match_known_needs_same_faults_and_a_check_it_runs() -> None:
    k = KnownFinding(name="f", file="f.yaml", faults=("pause",), checks=frozenset({"leaks", "evidence"}))
    assert match_known(Signature(("leaks",), "", ("pause",)), [k], planted_bugs=False) is k
    assert match_known(Signature(("leaks",), "", ("pause",)), [k], planted_bugs=True) is None
    assert match_known(Signature(("leaks",), "", ("kill",)), [k], planted_bugs=False) is None
    assert match_known(Signature(("liveness",), "", ("pause",)), [k], planted_bugs=False) is None


def test_guide_prefers_kind_sets_that_reach_new_counter_combinations() -> None:
    from chaos.explore.guidance import CounterGuide, grown

    assert grown({"a_total": 1.0}, {"a_total": 2.0, "b_total": 0.0, "c_total": 1.0}) == frozenset({"a_total", "c_total"})
    assert grown(None, {"a_total": 1.0}) is None
    g = CounterGuide()
    assert g.record(["latency"], frozenset({"x"})) is True
    assert g.record(["latency"], frozenset({"x"})) is False  # seen: no credit
    assert g.record(["kill"], None) is False  # LMCache unreadable after the run: no credit
    assert g.score(["latency"]) == 0.5 and g.score(["kill"]) == 0.0 and g.score(["pause"]) == 1.0
    # never tried first, then the best record; the first among equals
    assert g.pick([["kill"], ["latency"], ["pause"], ["tier_flush"]], lambda k: k) == 2
    assert g.pick([["kill"], ["latency"]], lambda k: k) == 1


def test_counter_totals_sum_counters_over_labels_from_a_real_page() -> None:
    import http.server
    import threading

    from chaos.explore.guidance import counter_totals

    page = (b"# TYPE lmcache_mp_lookup_hit_tokens counter\n"
            b'lmcache_mp_lookup_hit_tokens_total{model="a"} 256\n'
            b'lmcache_mp_lookup_hit_tokens_total{model="b"} 512\n'
            b"# TYPE lmcache_mp_l1_usage gauge\nlmcache_mp_l1_usage 0.5\n")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(page if self.path == "/metrics" else b"")

        def log_message(self, *_a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert counter_totals(base + "/metrics") == {"lmcache_mp_lookup_hit_tokens_total": 768.0}
        assert counter_totals(base + "/nothing") is None
    finally:
        server.shutdown()
        server.server_close()


def test_signature_counts_only_the_failed_checks_the_shrunk_file_runs() -> None:
    # explore-smoke, seed 55, hit-plus-one-chunk: run 1 failed four checks, its shrink kept the one
    # it was shrunk on (recompute_equivalence); the by-the-way failures must not make a second signature
    s = load_scenario(REPO / "scenarios" / "lookup-timeout.yaml")
    shrunk = s.model_copy(deep=True)
    for name in shrunk.checks.enabled():
        if name != "recompute_equivalence":
            setattr(shrunk.checks, name, None)
    failed = ["recompute_equivalence", "leaks", "isolation", "hit_quality"]
    assert signature_of(failed, "prefix_length", shrunk).checks == ("recompute_equivalence",)
    # not a shrunk file of this failure (it runs none of them): every failed check counts
    assert signature_of(["isolation"], "", shrunk).checks == ("isolation",)
    assert signature_of(failed, "", s).checks == tuple(sorted(set(failed) & set(s.checks.enabled())))


def test_signature_drops_faults_the_failure_does_not_need() -> None:
    # one planted bug, two shrinks that kept different faults, and one that kept none: one signature
    # once the control on the clean engine showed that the failure needs the bug
    with_latency = load_scenario(REPO / "scenarios" / "lookup-timeout.yaml")
    with_pause = load_scenario(REPO / "scenarios" / "findings" / "frozen-l2-read-lock-leak.yaml")
    bare = with_latency.model_copy(deep=True)
    for phase in bare.phases:
        phase.faults = []
    sigs = {signature_of(["recompute_equivalence"], "prefix_length", s, faults_irrelevant=True)
            for s in (with_latency, with_pause, bare)}
    assert sigs == {Signature(("recompute_equivalence",), "prefix_length", ())}
    assert signature_of(["recompute_equivalence"], "prefix_length", bare) in sigs
    assert signature_of(["recompute_equivalence"], "prefix_length", with_pause).faults == ("pause",)


def test_a_slow_l2_leak_of_the_clean_stack_is_known() -> None:
    # explore seed 1 scenario 2 on the clean engine (disk_full, then latency on lmcache-redis):
    # leaks; its shrink to the latency alone is the shipped finding slow-l2-read-lock-leak
    known = known_findings([REPO / "scenarios"])
    hit = match_known(Signature(("leaks",), "", ("latency",)), known, planted_bugs=False, stack="reference")
    assert hit is not None and hit.name == "slow-l2-read-lock-leak"
    assert match_known(Signature(("leaks",), "", ("disk_full", "latency")), known, planted_bugs=False,
                       stack="reference") is None
    # lookup-timeout is expected to fail leaks on the vLLM stack only (xfail.stacks): not known here
    assert "lookup-timeout" in {k.name for k in known}
    on_vllm = match_known(Signature(("leaks",), "", ("latency",)), known, planted_bugs=False, stack="vllm-cpu")
    assert on_vllm is not None and on_vllm.name in {"lookup-timeout", "slow-l2-read-lock-leak"}


# Lines of LMCache's log (colours as it writes them) from `kvchaos explore --stack
# compose/reference.yml --jobs 2 --seed 3306` (2026-12-06). Run 4 (a 500 ms latency on
# lmcache-redis) logged the first; run 5 (an L1 flush, a preemption and a 1500 ms upstream
# latency on lmcache-redis; started 18:27:48 on another stack) logged the second and failed
# `leaks` with lmcache.read_locked_count=6, the chunks of its two abandoned lookups.
_EARLIER = ("\x1b[33;20m[2026-12-06 18:27:47,234] LMCache WARNING:\x1b[0m free_lookup_locks for request "
            "fault-1-2-0 while its prefetch is still running; leaving its locks to the prefetch controller "
            "\x1b[3m(lookup.py:427:lmcache.v1.multiprocess.modules.lookup)\x1b[0m")
_IN_RUN = ("\x1b[33;20m[2026-12-06 18:27:59,326] LMCache WARNING:\x1b[0m free_lookup_locks for request "
           "fault-2-2-1 while its prefetch is still running; leaving its locks to the prefetch controller "
           "\x1b[3m(lookup.py:427:lmcache.v1.multiprocess.modules.lookup)\x1b[0m")
_OTHER = ("\x1b[32;20m[2026-12-06 18:27:55,671] LMCache INFO:\x1b[0m Retrieved 512 tokens in 0.009 seconds "
          "\x1b[3m(engine_driven_transfer.py:514:lmcache.v1.multiprocess.modules.engine_driven_transfer)\x1b[0m")


def test_run_log_window_keeps_the_runs_own_lines(tmp_path: Path) -> None:
    log = tmp_path / "lmcache.log"
    log.write_text("\n".join([_EARLIER, "  a continuation line", _OTHER, "Traceback line without a time", _IN_RUN]) + "\n")
    window = run_log_window(log, "2026-12-06T18:27:48")
    assert "fault-1-2-0" not in window and "continuation" not in window  # the run before's
    assert "fault-2-2-1" in window and "without a time" in window and "\x1b[" not in window
    assert "fault-1-2-0" in run_log_window(log, None)
    assert run_log_window(tmp_path / "missing.log", "2026-12-06T18:27:48") == ""
    # docker's UTC prefix (--backend compose) is read as UTC
    docker = tmp_path / "docker.log"
    docker.write_text("2026-12-06T18:27:40.5Z before\n2026-12-06T18:27:59.1Z after\n")
    start = datetime(2026, 12, 6, 18, 27, 48, tzinfo=timezone.utc).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    assert run_log_window(docker, start).splitlines() == ["2026-12-06T18:27:59.1Z after"]


def test_a_known_leak_reached_beside_other_faults_is_known_by_its_marks(tmp_path: Path) -> None:
    """Seed 3306 run 5: its shrink kept latency+preempt+tier_flush (the verify failed 0 of 2),
    so the fault kinds were not those of slow-l2-read-lock-leak (latency) and explore reported a
    new signature; LMCache's log shows the finding's mechanism."""
    known = known_findings([REPO / "scenarios"])
    slow = next(k for k in known if k.name == "slow-l2-read-lock-leak")
    assert slow.marks and slow.marks[0][0] == "lmcache"
    sig = Signature(("leaks",), "", ("latency", "preempt", "tier_flush"))
    log = tmp_path / "lmcache.log"
    log.write_text("\n".join([_EARLIER, _OTHER, _IN_RUN]) + "\n")

    def logs_from(start: str):
        return lambda service: (run_log_window(log, start) if service == "lmcache" else "")

    assert match_known(sig, known, planted_bugs=False, stack="reference", logs=logs_from("2026-12-06T18:27:48")) is slow
    assert match_known(sig, known, planted_bugs=False, stack="reference", logs=None) is None  # kinds differ
    # the mark logged by the run before, on this stack, is not this run's
    assert match_known(sig, known, planted_bugs=False, stack="reference", logs=logs_from("2026-12-06T18:28:00")) is None
    # the same kinds without the mark (a pause of LMCache, not of Redis): not the frozen-L2 leak
    pause = Signature(("leaks",), "", ("pause",))
    assert match_known(pause, known, planted_bugs=False, stack="reference", logs=logs_from("2026-12-06T18:28:00")) is None
    assert match_known(pause, known, planted_bugs=False, stack="reference",
                       logs=logs_from("2026-12-06T18:27:48")).name.startswith("frozen-l2")
    # a check the finding does not run, or a planted bug: never known
    assert match_known(Signature(("hit_recovery",), "", sig.faults), known, planted_bugs=False, stack="reference",
                       logs=logs_from("2026-12-06T18:27:48")) is None
    assert match_known(sig, known, planted_bugs=True, stack="reference", logs=logs_from("2026-12-06T18:27:48")) is None


def test_a_wrong_output_from_flipped_l2_objects_is_the_bitflip_finding(tmp_path: Path) -> None:
    """Seed 3306 run 33 (clean reference stack): an L1 flush and a 1-bit `l2_corrupt` bitflip of
    both L2 tiers; `recompute_equivalence` failed, diagnosis kv_content, after LMCache served the
    prefixes from L2 (the line below, logged in the run). Known since
    scenarios/findings/l2-bitflip-served-as-kv.yaml; a run where nothing came from L2 (a
    truncated or deleted object is a miss) is not that finding."""
    known = known_findings([REPO / "scenarios"])
    sig = Signature(("recompute_equivalence",), "kv_content", ("l2_corrupt", "tier_flush"))
    served = ("\x1b[32;20m[2026-12-06 19:03:43,566] LMCache INFO:\x1b[0m Prefetch request completed (L1+L2): 3/4 "
              "retained keys (0 L1, 3 L2) in 12.6 ms (external_request_id=fault-1-1-0, prefetch_request_id=70)")
    from_l1 = ("\x1b[32;20m[2026-12-06 19:03:41,054] LMCache INFO:\x1b[0m Prefetch request completed (L1+L2): 3/4 "
               "retained keys (3 L1, 0 L2) in 4.5 ms (external_request_id=hit-0-0, prefetch_request_id=64)")
    log = tmp_path / "lmcache.log"
    log.write_text("\n".join([from_l1, served]) + "\n")
    hit = match_known(sig, known, planted_bugs=False, stack="reference",
                      logs=lambda s: run_log_window(log, "2026-12-06T19:03:36") if s == "lmcache" else "")
    assert hit is not None and hit.name == "l2-bitflip-served-as-kv"
    log.write_text(from_l1 + "\n")
    assert match_known(sig, known, planted_bugs=False, stack="reference",
                       logs=lambda s: run_log_window(log, "2026-12-06T19:03:36") if s == "lmcache" else "") is None


def _frozen_l2_log(tmp_path: Path) -> Path:
    """LMCache's log of `kvchaos run` of explore's seed 1 scenario 8 on compose/reference.yml,
    real Toxiproxy, 2026-12-07 (the run started 17:03:23; leaks failed, read_locked_count=2)."""
    log = tmp_path / "lmcache.log"
    log.write_text("\x1b[33;20m[2026-12-07 17:03:58,629] LMCache WARNING:\x1b[0m free_lookup_locks for request "
                   "fault-2-0-0 while its prefetch is still running; leaving its locks to the prefetch controller "
                   "\x1b[3m(lookup.py:427:lmcache.v1.multiprocess.modules.lookup)\x1b[0m\n")
    return log


def test_an_l2_lock_leak_reached_by_another_fault_on_the_l2_link_is_known(tmp_path: Path) -> None:
    """Seed 1 scenario 8 (compose/reference.yml): an upstream `timeout` toxic on lmcache-redis
    with L1 and fs flushed holds LMCache's L2 reads as a pause of Redis or a latency on that link
    does; leaks failed and LMCache logged the L2 lock leak's mark, yet explore reported a new
    signature, since neither finding's fault kind (pause, latency) was the run's. The part of the
    stack faulted (the L2 server's path) and the mark make it known."""
    from chaos.explore.generate import generate, stack_offer, write_scenario

    stack = REPO / "compose" / "reference.yml"
    ran = load_scenario(write_scenario(generate(stack_offer(stack), 1, 8), tmp_path / "gen"))
    targets = fault_targets(ran, stack)
    assert {"l2", "link:engine-lmcache", "kind:stall", "kind:tier_flush"} == targets
    known = known_findings([REPO / "scenarios"])
    assert {k.name: k.targets for k in known}["frozen-l2-read-lock-leak"] == {"l2"}  # pause of Redis
    assert {k.name: k.targets for k in known}["slow-l2-read-lock-leak"] == {"l2"}  # latency on lmcache-redis
    log = _frozen_l2_log(tmp_path)

    def logs(service: str) -> str:
        return run_log_window(log, "2026-12-07T17:03:23") if service == "lmcache" else ""

    shrunk = Signature(("leaks",), "", ("tier_flush", "timeout"))
    hit = match_known(shrunk, known, planted_bugs=False, stack="reference", logs=logs,
                      targets={"l2", "kind:tier_flush"})
    assert hit is not None and hit.name in ("frozen-l2-read-lock-leak", "slow-l2-read-lock-leak",
                                            "frozen-l2-locks-outlive-read-ttl")
    # by fault kinds alone (no targets given) it was new: the report this fixes
    assert match_known(shrunk, known, planted_bugs=False, stack="reference", logs=logs) is None
    # the mark without a fault on the L2 path (a latency on engine->LMCache only) is not this
    # finding, though the kind is slow-l2-read-lock-leak's own
    engine_side = Signature(("leaks",), "", ("latency",))
    assert match_known(engine_side, known, planted_bugs=False, stack="reference", logs=logs,
                       targets={"link:engine-lmcache"}) is None
    # the L2 path faulted but the mark not logged: not known
    assert match_known(shrunk, known, planted_bugs=False, stack="reference", logs=lambda s: "",
                       targets={"l2", "kind:tier_flush"}) is None
    # a latency on the L2 link: the finding with that kind comes first
    slow = match_known(Signature(("leaks",), "", ("latency", "tier_flush")), known, planted_bugs=False,
                       stack="reference", logs=logs, targets={"l2", "kind:tier_flush"})
    assert slow is not None and slow.name == "slow-l2-read-lock-leak"


def test_fault_targets_name_the_l2_server_by_link_and_by_service() -> None:
    frozen = load_scenario(REPO / "scenarios" / "findings" / "frozen-l2-read-lock-leak.yaml")
    assert fault_targets(frozen) == {"l2"}
    pause = load_scenario(REPO / "scenarios" / "lmcache-pause.yaml")
    assert "l2" not in fault_targets(pause)
    # a stack file that does not load: each link and service by its own name
    slow = load_scenario(REPO / "scenarios" / "findings" / "slow-l2-read-lock-leak.yaml")
    assert fault_targets(slow, REPO / "no-such-stack.yml") == {"link:lmcache-redis"}


def test_a_known_l2_lock_leak_does_not_explain_another_field_that_leaked(tmp_path: Path) -> None:
    """A run that failed ``leaks`` with LMCache's L2 read-lock leak (its mark logged, the L2 path
    faulted) and, beside it, engine blocks held (a bug of its own, e.g. the engine keeping an
    aborted request's blocks) was reported as the known slow or frozen L2 read-lock leak: the
    match compared the check's name, not what leaked. A known finding explains a failed ``leaks``
    only when every field that leaked is one its ``xfail.leaks`` names."""
    known = known_findings([REPO / "scenarios"])
    log = _frozen_l2_log(tmp_path)

    def logs(service: str) -> str:
        return run_log_window(log, "2026-12-07T17:03:23") if service == "lmcache" else ""

    sig = Signature(("leaks",), "", ("tier_flush", "timeout"))

    def match(leaked):
        return match_known(sig, known, planted_bugs=False, stack="reference", logs=logs,
                           targets={"l2", "kind:tier_flush"}, leaked=leaked)

    l2_leak = ("frozen-l2-read-lock-leak", "slow-l2-read-lock-leak", "frozen-l2-locks-outlive-read-ttl")
    assert match({"lmcache.read_locked_count"}).name in l2_leak
    # a lock LMCache's TTL freed is the same leak (the lock ledger counts it)
    assert match({"lmcache.read_locked_count", "lmcache-lock-ledger.read_locks_expired"}).name in l2_leak
    # engine blocks held beside it, or sessions left open: not explained, so a new signature
    assert match({"lmcache.read_locked_count", "engine.blocks_held_by_requests"}) is None
    assert match({"lmcache.active_sessions"}) is None
    # the fields unknown (a result without details): the check's name decides, as before
    assert match(None).name in l2_leak


def test_a_finding_that_declares_no_leak_fields_explains_no_failed_leaks_check() -> None:
    """Without ``xfail.leaks`` a finding cannot say which leak is its own, so a failed ``leaks``
    whose fields are known is never reported as it (new, not a false 'known'); other checks
    still match by fault kinds."""
    bare = KnownFinding(name="k", file="k.yaml", faults=("pause",), checks=frozenset({"leaks", "hit_recovery"}))
    declared = KnownFinding(name="d", file="d.yaml", faults=("pause",), checks=frozenset({"leaks"}),
                            leaks=frozenset({"lmcache.active_sessions"}))
    leaks = Signature(("leaks",), "", ("pause",))
    assert match_known(leaks, [bare], planted_bugs=False, leaked={"lmcache.active_sessions"}) is None
    assert match_known(leaks, [bare, declared], planted_bugs=False, leaked={"lmcache.active_sessions"}) is declared
    assert match_known(Signature(("hit_recovery",), "", ("pause",)), [bare], planted_bugs=False,
                       leaked={"lmcache.active_sessions"}) is bare


def test_leaked_fields_read_a_failed_leaks_check_as_source_dot_field() -> None:
    from chaos.checks.result import CheckResult
    from chaos.checks.leaks import leaked_fields

    leaked = [{"source": "lmcache", "field": "read_locked_count", "value": 2, "peak": 4},
              {"source": "engine", "field": "blocks_held_by_requests", "value": 3, "peak": 3}]
    failed = CheckResult(name="leaks", verdict="failed", summary="s", details={"leaked": leaked})
    want = {"lmcache.read_locked_count", "engine.blocks_held_by_requests"}
    assert leaked_fields([failed]) == want
    assert leaked_fields([failed.model_dump()]) == want  # result.json's dicts
    passed = CheckResult(name="leaks", verdict="passed", summary="s", details={"leaked": leaked})
    other = CheckResult(name="liveness", verdict="failed", summary="s", details={"leaked": leaked})
    assert leaked_fields([passed, other]) == frozenset()


def test_every_shipped_leak_finding_declares_what_it_leaks() -> None:
    """Every xfail scenario whose evidence is a failed ``leaks`` check declares the fields it
    leaks: each field its evidence names, and only fields of its stacks' leak sources (a typo
    would make it never match)."""
    import re

    from chaos.stack.spec import load_stack

    declared = 0
    for k in known_findings([REPO / "scenarios"]):
        evidence = load_scenario(Path(k.file)).xfail.evidence or ""
        if not re.search(r"\bleaks(:| fails)", evidence):
            assert k.leaks is None, k.name
            continue
        named = {f"{m.group(1)}.{m.group(2)}" for m in re.finditer(r"\b(lmcache|engine)\.([a-z_]+_[a-z_]+)\b", evidence)}
        assert k.leaks and named <= k.leaks, (k.name, named - (k.leaks or set()))
        declared += 1
        stacks = [REPO / "compose" / f"{n}.yml" for n in (k.stacks or ["reference"])]
        for stack in stacks:
            sources = load_stack(stack, require_commands=False, allocate_ports=False).settings.leak_sources
            have = {f"{src.name}.{f}" for src in sources for f in src.fields}
            assert k.leaks <= have, (k.name, stack.name, k.leaks - have)
    assert declared >= 15


#: vLLM's traceback in the engine log of the seed-4102 exploration's run 16 (2026-12-07 21:28,
#: docs/findings/vllm/fail-policy-kills-engine.md "Reached by a client abort").
_VLLM_ABORT_CRASH = """\
(EngineCore pid=19826) ERROR 12-07 21:28:07 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=19826) ERROR 12-07 21:28:07 [core.py:1512]   File ".../vllm/v1/core/sched/scheduler.py", line 3234, in _update_from_kv_xfer_finished
(EngineCore pid=19826) ERROR 12-07 21:28:07 [core.py:1512]     assert req_id in self.requests
(EngineCore pid=19826) ERROR 12-07 21:28:07 [core.py:1512] AssertionError
"""


def test_vllms_abort_crash_found_by_explore_is_the_abort_during_load_finding(tmp_path: Path) -> None:
    """Seed 4102 run 16 on compose/vllm-cpu.yml: a cancel storm 20 ms into requests whose
    LMCache loads were in flight killed vLLM's EngineCore (`assert req_id in self.requests`), and
    explore reported `checks=liveness | faults=cancel+latency+preempt` as new, as no shipped
    scenario reproduced that route. abort-during-load now does (an xfail on vllm-cpu whose mark is
    that assert): the same run is known by its mark and the parts of the stack it faulted (the
    engine-LMCache link, a cancel); without the assert in the engine's log, or on the reference
    stack, it is not."""
    from chaos.explore.generate import generate, stack_offer, write_scenario

    stack = REPO / "compose" / "vllm-cpu.yml"
    ran = load_scenario(write_scenario(generate(stack_offer(stack), 4102, 16), tmp_path / "gen"))
    targets = fault_targets(ran, stack)
    assert {"kind:cancel", "link:engine-lmcache"} <= targets
    known = known_findings([REPO / "scenarios"])
    finding = next(k for k in known if k.name == "abort-during-load")
    assert finding.stacks == ("vllm-cpu",) and finding.targets == {"kind:cancel", "link:engine-lmcache"}
    sig = Signature(("liveness",), "", ("cancel", "latency", "preempt"))

    def logs(text: str):
        return lambda service: text if service == "engine" else ""

    hit = match_known(sig, known, planted_bugs=False, stack="vllm-cpu", logs=logs(_VLLM_ABORT_CRASH), targets=targets)
    assert hit is not None and hit.name == "abort-during-load"
    assert match_known(sig, known, planted_bugs=False, stack="vllm-cpu", logs=logs(""), targets=targets) is None
    assert match_known(sig, known, planted_bugs=False, stack="reference", logs=logs(_VLLM_ABORT_CRASH),
                       targets=targets) is None
