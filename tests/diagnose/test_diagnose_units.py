"""Pure parts of chaos/diagnose: the KV diff, the verdict rules, which requests a run's checks
name, and the report's "Why" section. No stack is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from chaos.checks.result import CheckResult
from chaos.diagnose.diagnose import failing_requests
from chaos.diagnose.kvdiff import compare_chunk, compare_engine_kv
from chaos.diagnose.model import (ABIsolation, ChunkDiff, Diagnosis, EngineKV, KeyIdentity, KVContent, LengthMask,
                                  Replay, RequestDiagnosis)
from chaos.diagnose.verdict import Original, decide, off_by_name


def _kv(seed: int = 0, layers: int = 3, tokens: int = 8, hidden: int = 4) -> torch.Tensor:
    return torch.randn(2, layers, tokens, hidden, generator=torch.Generator().manual_seed(seed))


def test_equal_chunks_are_equal_with_zero_delta() -> None:
    w = _kv()
    d = compare_chunk(w.clone(), w, chunk=1, start=8, chunk_hash="ab")
    assert d.equal and d.kind is None and d.max_abs_delta == 0.0 and d.first_bad_layer is None
    assert d.served_checksum == d.witness_checksum and [x.layer for x in d.layers] == [0, 1, 2]


def test_all_zero_served_chunk_is_zero_from_layer_0() -> None:
    w = _kv()
    d = compare_chunk(torch.zeros_like(w), w, chunk=0, start=0, chunk_hash="ab")
    assert not d.equal and d.kind == "zero" and d.first_bad_layer == 0 and d.first_bad_position == 0
    assert d.zero_share == 1.0 and d.witness_zero_share == 0.0


def test_kv_over_a_wrong_context_is_stale_from_layer_1_at_its_position() -> None:
    w = _kv()
    s = w.clone()
    s[1, 1:, 5:] = _kv(seed=9)[1, 1:, 5:]  # V planes of layers >= 1 differ from position 5 on
    d = compare_chunk(s, w, chunk=2, start=16, chunk_hash="ab")
    assert d.kind == "stale" and d.first_bad_layer == 1 and d.first_bad_position == 21
    assert d.layers[0].first_position is None and d.layers[1].plane == "V"


def test_garbage_bytes_are_corrupt() -> None:
    w = _kv()
    s = w.clone()
    s[0, 0, 0, 0] = float("nan")
    assert compare_chunk(s, w, chunk=0, start=0, chunk_hash="").kind == "corrupt"
    s = w * 1000
    assert compare_chunk(s, w, chunk=0, start=0, chunk_hash="").kind == "corrupt"


def test_tolerance_is_relative_to_the_witness_magnitude() -> None:
    w = _kv()
    s = w + 1e-6
    assert not compare_chunk(s, w, chunk=0, start=0, chunk_hash="").equal
    assert compare_chunk(s, w, chunk=0, start=0, chunk_hash="", tolerance=1e-3).equal
    with pytest.raises(ValueError, match="shape"):
        compare_chunk(w[:, :1], w, chunk=0, start=0, chunk_hash="")


@pytest.mark.parametrize("n,name", [(1, "off by +1 token"), (256, "off by +1 chunk (256 tokens)"),
                                    (512, "off by +2 chunks (512 tokens)"), (31, "off by +31 tokens"),
                                    (-1, "off by -1 token"), (-256, "off by -1 chunk (256 tokens)")])
def test_off_by_names(n: int, name: str) -> None:
    assert off_by_name(n, 256) == name


def _diag(**kw) -> RequestDiagnosis:
    d = RequestDiagnosis(request_id="r", check="recompute_equivalence")
    for k, v in kw.items():
        setattr(d, k, v)
    return d


def _replay(kind: str, ok: bool, hits: int = 0, salt: str | None = None) -> Replay:
    return Replay(kind=kind, token_ids=[1], matches_expected=ok, external_hit_tokens=hits, local_hit_tokens=0,
                  cache_salt=salt)


def _compared(bad: list[tuple[int, str, int]] = ()) -> KVContent:
    chunks = []
    for i in range(2):
        b = next((x for x in bad if x[0] == i), None)
        chunks.append(ChunkDiff(chunk=i, start=i * 256, end=(i + 1) * 256, chunk_hash="h", equal=b is None,
                                kind=b[1] if b else None, max_abs_delta=1.0 if b else 0.0, zero_share=0.0,
                                witness_zero_share=0.0, served_checksum="a", witness_checksum="a" if not b else "b",
                                first_bad_layer=b[2] if b else None, first_bad_position=i * 256 if b else None))
    kv = KVContent(status="compared", chunks=chunks, bad_chunks=[c.chunk for c in chunks if not c.equal])
    if bad:
        kv.first_bad_chunk, kv.kind, kv.first_bad_layer = bad[0][0], bad[0][1], bad[0][2]
    return kv


def _witness(chunks: int = 3, layers: int = 4, chunk: int = 16, hidden: int = 8) -> torch.Tensor:
    """Witness chunks ``[chunks, 2, layers, chunk, hidden]`` (random, never zero)."""
    return torch.randn(chunks, 2, layers, chunk, hidden, generator=torch.Generator().manual_seed(3)) + 5.0


def _flat(witness: torch.Tensor, extra: int = 5) -> torch.Tensor:
    """The engine's prompt KV ``[2, layers, tokens, hidden]`` holding the witness chunks, plus
    ``extra`` computed tokens past the last full chunk."""
    kv = torch.cat(list(witness), dim=2)
    return torch.cat([kv, torch.randn(2, kv.shape[1], extra, kv.shape[3])], dim=2)


def _engine(witness: torch.Tensor, kv: torch.Tensor | None = None, loaded: tuple[int, int] = (0, 32)) -> EngineKV:
    kv = _flat(witness) if kv is None else kv
    chunks, bad, after = compare_engine_kv(kv, witness, chunk_size=witness.shape[3], loaded=loaded,
                                           hashes=["h"] * witness.shape[0])
    return EngineKV(status="compared", loaded_start=loaded[0], loaded_end=loaded[1], chunks=chunks, bad_chunks=bad,
                    computed_bad_chunks=after, first_bad_chunk=bad[0] if bad else None)


def _after_load(engine_kv: EngineKV, **kw) -> RequestDiagnosis:
    ab = ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 32), bypass=_replay("bypass", True))
    return decide(_diag(ab=ab, kv=_compared(), engine_kv=engine_kv, **kw), Original(external=32))


@pytest.mark.parametrize("layer,plane", [(2, "K"), (0, "V"), (3, "V"), (1, "K")])
def test_a_layer_zeroed_after_the_load_is_named_by_layer_plane_and_chunk(layer: int, plane: str) -> None:
    """Held-back class: a correct retrieve, then one layer's K (or V) of the loaded tokens zeroed
    in the engine's blocks; LMCache's copy is right. Never logits/sampling."""
    w = _witness()
    kv = _flat(w)
    kv[{"K": 0, "V": 1}[plane], layer, :32] = 0  # chunks 0 and 1 were loaded
    d = _after_load(_engine(w, kv))
    assert d.verdict == "kv_after_load", d.evidence
    assert d.kind == f"layer {layer} {plane}, chunk 0"
    assert d.title.startswith("KV content wrong after load (engine side)")
    assert d.engine_kv.bad_chunks == [0, 1] and d.engine_kv.chunks[0].kind == "zero"
    assert any("LMCache's copy equals it" in e for e in d.evidence)


@pytest.mark.parametrize("target", [1, 2])
def test_a_chunk_filled_with_the_previous_chunks_kv_is_named_as_that_chunks(target: int) -> None:
    w = _witness()
    kv = _flat(w)
    kv[:, :, target * 16:(target + 1) * 16] = w[target - 1]
    d = _after_load(_engine(w, kv, loaded=(0, 48)))
    assert d.verdict == "kv_after_load"
    assert d.kind == f"chunk {target} holds chunk {target - 1}'s KV (stale or wrong offset)"
    assert d.engine_kv.chunks[target].same_as_chunk == target - 1


def test_logits_sampling_only_when_the_engine_kv_is_seen_right() -> None:
    w = _witness()
    assert _after_load(_engine(w)).verdict == "logits_sampling"
    blind = _after_load(EngineKV(reason="the engine shows no KV blocks (no /debug/kv route: vLLM ...)"))
    assert blind.verdict == "unknown" and "engine KV not visible" in blind.kind
    assert any("vLLM" in e for e in blind.evidence)
    ab = ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 32), bypass=_replay("bypass", True))
    ab.bypass.error = "HTTP 500"
    assert decide(_diag(ab=ab, kv=_compared(), engine_kv=_engine(w)), Original(external=32)).verdict != \
        "logits_sampling"


def test_a_claim_short_of_what_lmcache_holds_is_a_negative_offset_for_hit_quality() -> None:
    length = LengthMask(prompt_tokens=600, chunk_size=256, fresh_local=0, fresh_external=511,
                        lmcache_prefix_tokens=512, valid_prefix=512, off_by=-1, off_by_name="off by -1 token")
    ab = ABIsolation(outcome="transient", fresh=_replay("fresh", True, 511), bypass=_replay("bypass", True))
    d = decide(RequestDiagnosis(request_id="r", check="hit_quality", ab=ab, length=length, kv=_compared()),
               Original(external=511, output_wrong=False))
    assert (d.verdict, d.kind) == ("prefix_length", "off by -1 token"), d.evidence
    assert "short of the hit" in d.evidence[0]
    # a wrong output is not explained by a short claim: the next rules decide
    d = decide(_diag(ab=ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 511),
                                    bypass=_replay("bypass", True)), length=length, kv=_compared([(0, "zero", 0)])),
               Original(external=511))
    assert d.verdict == "kv_content"


def test_failing_requests_include_hit_quality_misses() -> None:
    hq = CheckResult(name="hit_quality", verdict="failed", summary="x", details={"phases": {
        "p": {"verdict": "failed", "stored_prefix_misses": [
            {"request_id": "q", "stored_prefix_tokens": 512, "lmcache_tokens": 511, "local_tokens": 0}]},
        "o": {"verdict": "passed", "stored_prefix_misses": [{"request_id": "z"}]}}})
    got = failing_requests([hq])
    assert [(r, c) for r, c, _ in got] == [("q", "hit_quality")] and "511 from LMCache" in got[0][2]


def test_verdict_engine_side_when_the_bypass_is_wrong_too() -> None:
    d = decide(_diag(ab=ABIsolation(outcome="engine-side", fresh=_replay("fresh", False, 256),
                                    bypass=_replay("bypass", False, 0, "x"))), Original())
    assert d.verdict == "engine_side"


def test_verdict_key_identity_when_a_new_salt_still_hits() -> None:
    d = decide(_diag(check="isolation", ab=ABIsolation(outcome="transient", fresh=_replay("fresh", True, 512),
                                                       bypass=_replay("bypass", True, 512, "new"))),
               Original(external=512, output_wrong=False))
    assert d.verdict == "key_identity" and "ignores cache_salt" in d.evidence[0]


def test_an_ignored_salt_is_not_the_verdict_when_the_own_key_explains_the_hit() -> None:
    """An engine that ignores cache_salt, failing because the entry it loaded is zeros."""
    key = KeyIdentity(request_salt="", lookups={"": 256})
    d = decide(_diag(key=key, ab=ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 256),
                                             bypass=_replay("bypass", False, 256, "new")),
                     kv=_compared([(0, "zero", 0)])), Original(external=256))
    assert (d.verdict, d.kind) == ("kv_content", "zero")
    assert any("not why it failed" in e for e in d.evidence)


def test_verdict_prefix_length_with_off_by() -> None:
    length = LengthMask(prompt_tokens=512, chunk_size=256, fresh_local=0, fresh_external=257,
                        lmcache_prefix_tokens=256, valid_prefix=256, off_by=1, off_by_name="off by +1 token")
    d = decide(_diag(ab=ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 257),
                                    bypass=_replay("bypass", True)), length=length, kv=_compared()), Original())
    assert (d.verdict, d.kind) == ("prefix_length", "off by +1 token")


def test_verdict_kv_content_names_kind_and_layer() -> None:
    d = decide(_diag(ab=ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 256),
                                    bypass=_replay("bypass", True)), kv=_compared([(0, "zero", 0)])), Original())
    assert (d.verdict, d.kind) == ("kv_content", "zero") and "first bad layer 0" in d.evidence[0]


def test_verdict_trusted_failed_load_is_stale_kv() -> None:
    d = decide(_diag(ab=ABIsolation(outcome="transient", fresh=_replay("fresh", True, 1024),
                                    bypass=_replay("bypass", True)), kv=_compared()),
               Original(external=1024, load_failed=1024))
    assert (d.verdict, d.kind) == ("kv_content", "stale") and "failed to load" in " ".join(d.evidence)


def test_verdict_preempted_request_is_stale_kv_only_when_transient() -> None:
    ab = ABIsolation(outcome="transient", fresh=_replay("fresh", True), bypass=_replay("bypass", True))
    assert decide(_diag(ab=ab, kv=_compared()), Original(preemptions=2)).kind == "stale"
    ab = ABIsolation(outcome="reproducible", fresh=_replay("fresh", False), bypass=_replay("bypass", True))
    assert decide(_diag(ab=ab, kv=_compared(), engine_kv=_engine(_witness())),
                  Original(preemptions=2)).verdict == "logits_sampling"


def test_verdict_unknown_says_what_was_seen() -> None:
    ab = ABIsolation(outcome="transient", fresh=_replay("fresh", True), bypass=_replay("bypass", True))
    d = decide(_diag(ab=ab, kv=KVContent(reason="no witness LMCache")), Original())
    assert d.verdict == "unknown" and any("no witness" in e for e in d.evidence)


def test_key_mismatch_decides_before_length() -> None:
    key = KeyIdentity(request_salt="t1", lookups={"t1": 0, "": 512}, used_salt="", mismatch="held under ''")
    length = LengthMask(prompt_tokens=700, chunk_size=256, off_by=512, off_by_name="x")
    d = decide(_diag(ab=ABIsolation(fresh=_replay("fresh", True, 512), bypass=_replay("bypass", True, 0)),
                     key=key, length=length), Original(output_wrong=False))
    assert d.verdict == "key_identity"


def test_failing_requests_come_from_request_checks_once_each() -> None:
    checks = [
        CheckResult(name="leaks", verdict="failed", summary="x", details={}),
        CheckResult(name="recompute_equivalence", verdict="failed", summary="x",
                    details={"mismatches": [{"request_id": "a", "line": "req a ..."}, {"request_id": "b"}]}),
        CheckResult(name="isolation", verdict="failed", summary="y",
                    details={"violations": [{"request_id": "b"}, {"request_id": "c", "hit_tokens": 5,
                                                                   "same_tenant_lcp": 0}]}),
        CheckResult(name="isolation", verdict="passed", summary="z", details={"violations": [{"request_id": "d"}]}),
    ]
    got = failing_requests(checks)
    assert [(r, c) for r, c, _ in got] == [("a", "recompute_equivalence"), ("b", "recompute_equivalence"),
                                          ("c", "isolation")]
    assert got[0][2] == "req a ..." and "reused 5" in got[2][2]


def test_report_shows_a_why_section(tmp_path: Path) -> None:
    from chaos.report.result import build_result
    from chaos.report.writer import write_report

    result = build_result(run_id="r1", scenario="s", history=[], checks=[])
    d = decide(_diag(ab=ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 256),
                                    bypass=_replay("bypass", True)), kv=_compared([(1, "stale", 2)])), Original())
    (tmp_path / "diagnosis.json").write_text(Diagnosis(run_id="r1", requests=[d]).model_dump_json())
    html = write_report(tmp_path, result, []).read_text()
    assert 'id="why"' in html and "KV content wrong: stale" in html and "first bad layer 2" in html
    assert "request cache_salt (none)" in html and "cache_salt <code></code>" not in html
    json.loads((tmp_path / "diagnosis.json").read_text())


def test_cli_rejects_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from chaos.cli import app

    r = CliRunner().invoke(app, ["diagnose", str(tmp_path)])
    assert r.exit_code == 2 and "no result.json" in r.output
    r = CliRunner().invoke(app, ["shrink", str(tmp_path)])
    assert r.exit_code == 2 and "no result.json" in r.output


def test_cli_says_when_nothing_failed(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from chaos.cli import app
    from chaos.report.result import build_result
    from chaos.report.writer import write_report

    write_report(tmp_path, build_result(run_id="r", scenario="s", history=[], checks=[]), [])
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path)])
    assert r.exit_code == 0 and "nothing to diagnose" in r.output
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path), "no-such-request"])
    assert r.exit_code == 2 and "no request 'no-such-request'" in r.output
    r = CliRunner().invoke(app, ["shrink", str(tmp_path)])
    assert r.exit_code == 2 and "no check failed" in r.output


def test_report_renders_a_non_finite_kv_delta(tmp_path: Path) -> None:
    """A wide bit flip turns served KV into inf/NaN: the report used to crash rendering
    ``"%.4g"|format(None)`` because the JSON had ``null`` there (CI, test_bites_on_reference_stack)."""
    from chaos.report.result import build_result
    from chaos.report.writer import write_report

    served = _kv()
    served[:, 1, 3] = float("inf")
    c = compare_chunk(served, _kv(), chunk=0, start=0, chunk_hash="h")
    assert not c.equal and c.max_abs_delta == float("inf")
    kv = KVContent(status="compared", chunks=[c], bad_chunks=[0], first_bad_chunk=0, kind=c.kind,
                   first_bad_layer=c.first_bad_layer)
    d = decide(_diag(ab=ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 256),
                                    bypass=_replay("bypass", True)), kv=kv), Original())
    (tmp_path / "diagnosis.json").write_text(Diagnosis(run_id="r1", requests=[d]).model_dump_json())
    raw = json.loads((tmp_path / "diagnosis.json").read_text())
    assert raw["requests"][0]["kv"]["chunks"][0]["max_abs_delta"] == "Infinity"
    assert Diagnosis.model_validate(raw).requests[0].kv.chunks[0].max_abs_delta == float("inf")
    html = write_report(tmp_path, build_result(run_id="r1", scenario="s", history=[], checks=[]), []).read_text()
    assert "Infinity" in html


def test_the_budget_bounds_the_whole_diagnosis_when_the_engine_never_answers() -> None:
    """``--budget 300`` ran 450 s: the budget only gated starting a request. An engine (and twin)
    that accepts connections and never answers: the diagnosis ends within the budget (plus the
    last call's short floor), saying which steps it skipped."""
    import socket
    import time

    from chaos.diagnose.diagnose import DiagnoseOptions, diagnose_failures
    from chaos.stack.spec import KvchaosSettings, KvLayout

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        ops = [{"index": 0, "time": 0.0, "process": "c", "type": "invoke", "f": "complete", "phase": "p",
                "request_id": rid, "fault_id": None,
                "value": {"prompt_token_ids": [1, 2, 3], "prompt_len": 3, "cache_salt": None, "max_tokens": 2}}
               for rid in ("a", "b")]
        ops += [{"index": 2 + i, "time": 1.0, "process": "c", "type": "ok", "f": "complete", "phase": "p",
                 "request_id": rid, "fault_id": None,
                 "value": {"type": "ok", "token_ids": [5, 6], "prompt_len": 3, "finish_reason": "length"}}
                for i, rid in enumerate(("a", "b"))]
        checks = [CheckResult(name="recompute_equivalence", verdict="failed", summary="x",
                              details={"mismatches": [{"request_id": "a"}, {"request_id": "b"}]})]
        t0 = time.monotonic()
        diag = diagnose_failures(ops, {"a": [7, 8], "b": [7, 8]}, checks,
                                 KvchaosSettings(engine_url=url, recompute_url=url,
                                                 kv_layout=KvLayout(num_layers=4, hidden_dim=256)),
                                 options=DiagnoseOptions(limit=2, budget_s=2.0))
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert took < 3.5, took
    assert any("time budget spent before" in e for e in diag.requests[0].errors)
    assert [s.reason for s in diag.skipped] == ["time budget of 2s spent"]


def test_lmcache_client_logs_stay_quiet_and_the_environment_is_restored() -> None:
    """Dozens of LMCache INFO lines preceded the verdicts: importing the client (its device
    detection logs at import) and using it print none, and LMCACHE_LOG_LEVEL is left as found."""
    import subprocess
    import sys

    code = ("import os; from chaos.diagnose.lmcache import quiet_lmcache, chunk_hashes; quiet_lmcache(); "
            "chunk_hashes(list(range(600)), 256); import logging; "
            "logging.getLogger('lmcache.v1.multiprocess.token_hasher').info('x'); "
            "print(repr(os.environ.get('LMCACHE_LOG_LEVEL')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "INFO" not in r.stderr and r.stdout.strip() == "None"


# --- the vLLM CPU stack: no witness, no engine KV, the engine's claim in usage ---------------


def test_duplicate_chunks_name_a_chunk_stored_with_an_earlier_chunks_kv() -> None:
    from chaos.diagnose.kvdiff import duplicate_chunks

    served = _witness(chunks=4)
    assert duplicate_chunks(served) == []
    served[2] = served[0]
    served[3] = served[0]
    assert duplicate_chunks(served) == [(2, 0), (3, 0)]


def test_without_a_witness_a_duplicated_chunk_is_kv_content_and_none_is_never_right() -> None:
    """vLLM's planted store-wrong-blocks: chunks 1.. of a store hold chunk 0's KV, and the stack
    has no witness to compare with; without such a pair the KV is not called right."""
    ab = ABIsolation(outcome="reproducible", fresh=_replay("fresh", False, 768), bypass=_replay("bypass", True))
    length = LengthMask(prompt_tokens=800, chunk_size=256, fresh_local=0, fresh_external=768,
                        lmcache_prefix_tokens=768, valid_prefix=768, off_by=0)
    kv = KVContent(status="self_checked", reason="the stack has no witness LMCache (x-kvchaos.witness)",
                   served_chunks=3, duplicates=[(1, 0), (2, 0)], bad_chunks=[1, 2], first_bad_chunk=1, kind="stale")
    d = decide(_diag(ab=ab, length=length, kv=kv), Original(external=768))
    assert d.verdict == "kv_content" and d.kind == "chunk 1 holds chunk 0's KV (stored under the wrong key)"
    assert "tokens 256-511" in d.evidence[0]
    clean = KVContent(status="self_checked", reason="no witness", served_chunks=3)
    d = decide(_diag(ab=ab, length=length, kv=clean), Original(external=768))
    assert d.verdict == "unknown" and any("pairwise distinct" in e for e in d.evidence)


def test_a_vllm_answer_gives_token_ids_stats_and_the_engines_own_count() -> None:
    """vLLM's /v1/completions with return_token_ids, --enable-prompt-tokens-details and LMCache's
    cached_token_stats (the shape of LMCacheMPConnector.request_finished): a connector claiming
    one chunk more than LMCache loaded shows in usage, not in the stats."""
    from chaos.diagnose.replay import read_completion

    data = {"choices": [{"text": "", "token_ids": [5, 6],
                         "logprobs": {"top_logprobs": [{"token_id:5": -0.1, "token_id:9": -2.0}, None]}}],
            "usage": {"prompt_tokens": 800, "prompt_tokens_details": {"cached_tokens": 768}},
            "kv_transfer_params": {"cached_token_stats": {"num_vllm_cached_tokens": 0,
                                                          "num_lmcache_cached_tokens": 512,
                                                          "num_lmcache_extra_cached_tokens": 512}}}
    out = Replay(kind="fresh")
    tops = read_completion(data, out)
    assert out.token_ids == [5, 6] and tops == [{5: -0.1, 9: -2.0}, {}]
    assert (out.local_hit_tokens, out.external_hit_tokens, out.connector_external_tokens) == (0, 768, 512)
    data["usage"]["prompt_tokens_details"]["cached_tokens"] = 512
    out = Replay(kind="fresh")
    read_completion(data, out)
    assert (out.external_hit_tokens, out.connector_external_tokens) == (512, None)


def test_cli_names_a_leak_when_nothing_can_be_diagnosed(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from chaos.cli import app
    from chaos.report.result import build_result
    from chaos.report.writer import write_report

    leak = CheckResult(name="leaks", verdict="failed", summary="lmcache.active_sessions=24 after quiesce")
    write_report(tmp_path, build_result(run_id="r", scenario="s", history=[], checks=[leak]), [])
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path)])
    assert r.exit_code == 0 and "nothing to diagnose" in r.output
    assert "leaks (lmcache.active_sessions=24 after quiesce)" in r.output and "not a request's answer" in r.output


def test_a_cpu_attn_layout_takes_the_engines_block_size_from_its_cache_config_info() -> None:
    """vLLM CPU's LMCache objects hold its block memory, so the reader needs vLLM's block size:
    read from the block_size label of vllm:cache_config_info (vllm/v1/metrics/loggers.py, the
    series as vLLM 0.32 exports it); an engine that does not say leaves the layout unknown, with
    the reason, rather than a reader that guesses."""
    from http.server import BaseHTTPRequestHandler

    from chaos.diagnose.diagnose import DiagnoseOptions, _Context, _resolve_layout
    from chaos.stack.spec import KvchaosSettings, KvLayout
    from kvchaos_support import http_server

    body = {"/metrics": ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
                         '# TYPE vllm:cache_config_info gauge\n'
                         'vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0"} 1.0\n')}

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            text = body.get(self.path, "").encode()
            self.send_response(200 if text else 404)
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: object) -> None:
            pass

    with pytest.raises(ValueError, match="cpu_attn needs num_kv_heads"):
        KvLayout(num_layers=4, hidden_dim=256, paged="cpu_attn")
    layout = KvLayout(num_layers=4, hidden_dim=256, num_kv_heads=4, paged="cpu_attn")
    with http_server(Metrics) as port:
        ctx = _Context(settings=KvchaosSettings(engine_url=f"http://127.0.0.1:{port}", kv_layout=layout),
                       options=DiagnoseOptions())
        _resolve_layout(ctx)
        assert ctx.layout is not None and ctx.layout.block_size == 32 and not ctx.problems
        body["/metrics"] = "vllm:num_requests_running 0\n"
        ctx = _Context(settings=ctx.settings, options=DiagnoseOptions())
        _resolve_layout(ctx)
    assert ctx.layout is None and "block size" in ctx.problems[0] and "vllm:cache_config_info" in ctx.problems[0]
