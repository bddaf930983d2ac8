"""Diagnose the failing requests of a run on a running stack (the six triage steps).

    history + snapshots + checks ──> failing requests (recompute_equivalence, isolation)
          │ for each, within the limit and the time budget:
          ├─ 5 key identity: chunk hashes (LMCache's hasher), lookups under each salt, L2 keys
          ├─ 1 A/B: fresh (cache on) │ bypass (unused cache_salt) │ twin (top-k logprobs)
          ├─ 2 first divergent position, the twin's top-k there
          ├─ 3 claimed prefix vs LMCache's lookup: off by N
          ├─ 4 served KV (LMCache) vs witness KV (the twin's LMCache), chunk x layer
          └─ 6 verdict (chaos/diagnose/verdict.py) ──> diagnosis.json, report "Why"

Reads only HTTP APIs (engine, twin, LMCache) and LMCache's own client; never imports the
reference engine. The engine's ``/debug/state`` is read only for the KV layout, and only when
the stack file gives none (``x-kvchaos.kv_layout``) and ``engine_debug`` is on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from chaos.checks.recompute_equivalence import first_difference
from chaos.checks.requests import RequestRecord, requests
from chaos.checks.result import CheckResult
from chaos.diagnose import engine_kv as engine_kv_api
from chaos.diagnose import kvdiff
from chaos.diagnose.lmcache import (
    KVReader,
    LMCacheReadError,
    ServerInfo,
    chunk_hashes,
    delete_objects,
    server_info,
    stored_entries,
)
from chaos.diagnose.model import (
    Diagnosis,
    Divergence,
    EngineKV,
    KeyIdentity,
    KVContent,
    LengthMask,
    RequestDiagnosis,
    SkippedRequest,
    StoredEntry,
)
from chaos.diagnose.replay import BYPASS_PREFIX, TOP_K, bypass_salt, replay, reset_prefix_cache
from chaos.diagnose.verdict import Original, decide, off_by_name
from chaos.stack.spec import KvchaosSettings, KvLayout

#: Checks whose failures name requests, and where in their details the request ids are
#: (hit_quality: see :func:`failing_requests`).
REQUEST_CHECKS = {"recompute_equivalence": "mismatches", "isolation": "violations", "hit_quality": None}
_ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass
class DiagnoseOptions:
    """How much diagnosis a run gets.

    Attributes:
        limit: the first N failing requests (0: none).
        budget_s: the whole diagnosis ends within this many seconds: no request starts and no
            step runs once it is spent, and every replay's timeout is cut to what is left.
        deadline: ``time.monotonic()`` by which it ends (overrides ``budget_s`` when set: the
            CLI counts its warm-up in the budget).
        engine_debug: may read the engine's ``/debug/state`` for the KV layout.
        tolerance: |delta| counted equal, relative to the witness's max |value| (0: bit-exact).
    """

    limit: int = 3
    budget_s: float = 60.0
    deadline: float | None = None
    engine_debug: bool = True
    tolerance: float = 0.0


def _hit_quality_requests(check: CheckResult, history: list[Any] | None, chunk: int) -> list[tuple[str, str]]:
    """``(request_id, line)`` of requests a failed hit_quality names: the stored-prefix misses of
    its failed phases, else (rate bounds name none) the failed phases' requests whose reported
    LMCache hit is not a whole number of chunks or recomputes part of a stored prefix."""
    phases = {p: d for p, d in (check.details.get("phases") or {}).items() if d.get("verdict") == "failed"}
    out: list[tuple[str, str]] = []
    for p, d in phases.items():
        for m in d.get("stored_prefix_misses") or []:
            out.append((m["request_id"], f"req {m['request_id']} ({p}) re-sent {m.get('stored_prefix_tokens')} stored "
                        f"tokens and got {m.get('lmcache_tokens')} from LMCache + {m.get('local_tokens')} local"))
    if out or history is None:
        return out
    from chaos.checks.hits import request_hits

    recs = [r for r in requests(history) if r.phase in phases]
    for h in request_hits(recs, chunk_size=chunk, stored_from=recs):
        if h.looked_up and h.lmcache_tokens and (h.lmcache_tokens % chunk or h.recomputed_stored_tokens > 0):
            out.append((h.request_id, f"req {h.request_id} ({h.phase}) reported {h.lmcache_tokens} LMCache tokens "
                        f"(not a whole number of {chunk}-token chunks)"))
    return out


def failing_requests(checks: Iterable[CheckResult], history: Iterable[Any] | None = None,
                     chunk_size: int = 256) -> list[tuple[str, str, str]]:
    """``(request_id, check, one-line failure)`` for every request a failed check names, in the
    checks' order, each request once (its first check). ``history`` (and LMCache's
    ``chunk_size``) lets a hit_quality failure of rates alone name its requests."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    hist = list(history) if history is not None else None
    for c in checks:
        if c.verdict != "failed" or c.name not in REQUEST_CHECKS:
            continue
        if c.name == "hit_quality":
            items = [{"request_id": rid, "line": line} for rid, line in _hit_quality_requests(c, hist, chunk_size)]
        else:
            items = c.details.get(REQUEST_CHECKS[c.name]) or []  # type: ignore[arg-type]
        for item in items:
            rid = item.get("request_id")
            if rid and rid not in seen:
                seen.add(rid)
                line = item.get("line") or (f"req {rid} reused {item.get('hit_tokens')} cached tokens; its tenant's "
                                            f"longest common prefix is {item.get('same_tenant_lcp')}")
                out.append((rid, c.name, line))
    return out


@dataclass
class _Context:
    """What every request's diagnosis shares: endpoints, LMCache readers, layout."""

    settings: KvchaosSettings
    options: DiagnoseOptions
    main: ServerInfo | None = None
    witness: ServerInfo | None = None
    layout: KvLayout | None = None
    layout_source: str = ""
    problems: list[str] = field(default_factory=list)
    readers: dict[tuple[str, str], KVReader] = field(default_factory=dict)
    stack: ExitStack = field(default_factory=ExitStack)
    deadline: float = float("inf")

    def left(self) -> float:
        """Seconds of the budget left (<= 0: spent)."""
        return self.deadline - time.monotonic()

    def reader(self, info: ServerInfo, model: str) -> KVReader:
        key = (info.zmq_url, model)
        if key not in self.readers:
            assert self.layout is not None
            r = KVReader(info.zmq_url, model, num_layers=self.layout.num_layers, hidden_dim=self.layout.hidden_dim,
                         dtype=self.layout.dtype, chunk_size=info.chunk_size, paged=self.layout.paged,
                         num_kv_heads=self.layout.num_kv_heads, block_size=self.layout.block_size)
            self.readers[key] = self.stack.enter_context(r)
        return self.readers[key]


def _resolve_layout(ctx: _Context) -> None:
    s = ctx.settings
    if s.kv_layout is not None:
        ctx.layout, ctx.layout_source = s.kv_layout, "x-kvchaos.kv_layout"
    elif ctx.options.engine_debug and s.engine_url:
        try:
            cfg = httpx.get(f"{s.engine_url.rstrip('/')}/debug/state",
                            timeout=max(0.2, min(10.0, ctx.left()))).json()["config"]["model"]
            head = int(cfg["hidden_size"]) // int(cfg["num_heads"])
            ctx.layout = KvLayout(num_layers=int(cfg["num_layers"]), hidden_dim=int(cfg["num_kv_heads"]) * head,
                                  dtype=str(cfg.get("dtype") or "float32"))
            ctx.layout_source = "engine /debug/state config"
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            ctx.problems.append(f"KV layout: not in the stack file and the engine's /debug/state has none ({exc})")
    else:
        ctx.problems.append("KV layout unknown: set x-kvchaos.kv_layout in the stack file")
    if ctx.layout is not None and ctx.layout.paged == "cpu_attn" and ctx.layout.block_size is None:
        _engine_block_size(ctx)
    if ctx.layout is not None and ctx.main is not None and not ctx.main.serde:
        from chaos.diagnose.lmcache import fs_object_size

        size = fs_object_size(ctx.main)
        want = 2 * ctx.layout.num_layers * ctx.main.chunk_size * ctx.layout.hidden_dim * _ELEM[ctx.layout.dtype]
        if size is not None and size != want:
            ctx.problems.append(f"KV layout {ctx.layout.model_dump()} ({ctx.layout_source}) gives {want}-byte "
                                f"objects, but LMCache's fs L2 holds {size}-byte ones")
            ctx.layout = None


def _engine_block_size(ctx: _Context) -> None:
    """Complete a ``cpu_attn`` layout with the engine's block size, the ``block_size`` label of
    its cache-config info series (vLLM: ``vllm:cache_config_info``, vllm/v1/metrics/loggers.py);
    the layout is dropped, with the problem noted, when the engine does not say."""
    from chaos.prometheus import parse_selector, text_samples

    assert ctx.layout is not None
    s = ctx.settings
    sel = parse_selector(s.engine_metrics.cache_config_info)
    where = f"{(s.engine_url or '').rstrip('/')}/metrics"
    try:
        if not s.engine_url:
            raise ValueError("the stack names no engine_url")
        text = httpx.get(where, timeout=max(0.2, min(10.0, ctx.left()))).raise_for_status().text
        sizes = {labels.get("block_size") for name, labels, _ in text_samples(text) if sel.matches(name, labels)}
        if len(sizes) != 1 or not str(next(iter(sizes)) or "").isdigit():
            raise ValueError(f"{sel} gives block_size {sorted(map(str, sizes))}")
        block = int(next(iter(sizes)))  # type: ignore[arg-type]
    except (httpx.HTTPError, ValueError) as exc:
        ctx.problems.append(f"KV layout: the engine's block size is not in the stack file and {where} does not "
                            f"give it ({exc})")
        ctx.layout = None
        return
    ctx.layout = ctx.layout.model_copy(update={"block_size": block})
    ctx.layout_source += f", block_size from {sel}"


def _prepare(settings: KvchaosSettings, options: DiagnoseOptions, deadline: float = float("inf")) -> _Context:
    ctx = _Context(settings=settings, options=options, deadline=deadline)
    if settings.lmcache_http:
        try:
            ctx.main = server_info(settings.lmcache_http)
        except LMCacheReadError as exc:
            ctx.problems.append(str(exc))
    else:
        ctx.problems.append("the stack names no LMCache HTTP API (x-kvchaos.lmcache_http)")
    if settings.witness is not None and settings.witness.http:
        try:
            ctx.witness = server_info(settings.witness.http)
            ctx.witness.zmq_url = settings.witness.url
        except LMCacheReadError as exc:
            ctx.problems.append(f"witness: {exc}")
    else:
        ctx.problems.append("the stack has no witness LMCache (x-kvchaos.witness): KV content is not compared")
    if ctx.main is not None and settings.lmcache_url:
        ctx.main.zmq_url = settings.lmcache_url  # the server itself, not the fault proxy's link
    _resolve_layout(ctx)
    return ctx


def _key_identity(ctx: _Context, prompt: list[int], salt: str) -> tuple[KeyIdentity, list[bytes]]:
    main = ctx.main
    assert main is not None
    hashes = chunk_hashes(prompt, main.chunk_size, main.hash_algorithm)
    key = KeyIdentity(model_names=list(main.model_names), request_salt=salt,
                      chunk_hashes=[h.hex() for h in hashes])
    entries = stored_entries(main, hashes)
    grouped: dict[tuple[str, str], StoredEntry] = {}
    for e in entries:
        g = grouped.setdefault((e["model_name"], e["cache_salt"]),
                               StoredEntry(model_name=e["model_name"], cache_salt=e["cache_salt"], chunks=[], where=[]))
        if e["chunk"] not in g.chunks:
            g.chunks.append(e["chunk"])
        if e["where"] not in g.where:
            g.where.append(e["where"])
    for g in grouped.values():
        g.chunks.sort()
    # A diagnosis's own bypass replays are not the run's entries (cleaned up, but an L2 write
    # may land after the clean-up).
    key.l2_entries = sorted((g for g in grouped.values() if not g.cache_salt.startswith(BYPASS_PREFIX)),
                            key=lambda g: (g.model_name, g.cache_salt))
    return key, hashes


def _lookups(ctx: _Context, key: KeyIdentity, model: str, prompt: list[int]) -> None:
    salts = [key.request_salt] + ([""] if key.request_salt else [])
    salts += sorted({e.cache_salt for e in key.l2_entries
                     if e.model_name == model and not e.cache_salt.startswith(BYPASS_PREFIX)} - set(salts))
    reader = ctx.reader(ctx.main, model)  # type: ignore[arg-type]
    for s in salts:
        key.lookups[s] = reader.lookup(prompt, s, reserve_last_token=True)


def _judge_key(key: KeyIdentity, model: str, claimed_external: int | None, fresh_local: int) -> None:
    own = key.lookups.get(key.request_salt, 0)
    if claimed_external is None:
        return
    claimed = claimed_external + fresh_local
    if claimed_external > 0 and claimed > own:
        others = [s for s, n in key.lookups.items() if s != key.request_salt and n >= claimed]
        if others:
            key.used_salt = others[0]
            key.mismatch = (f"the engine loaded {claimed} tokens, which LMCache holds only under cache_salt "
                            f"{others[0]!r} (model {model}); under the request's own cache_salt "
                            f"{key.request_salt!r} it holds {own}: the hit used another tenant's entry")
            return
    if claimed_external > 0:
        key.used_salt = key.request_salt


def _witness_chunks(ctx: _Context, model: str, prompt: list[int]):
    """Every full chunk of the prompt the witness LMCache holds (the clean twin's KV), or None."""
    assert ctx.witness is not None
    wmodel = model if model in ctx.witness.model_names or not ctx.witness.model_names else ctx.witness.model_names[0]
    _, witness = ctx.reader(ctx.witness, wmodel).read(prompt, "")
    return witness


def _kv_content(ctx: _Context, model: str, prompt: list[int], salt: str, hashes: list[bytes],
                claimed: int, witness) -> KVContent:
    kv = KVContent(model_name=model, served_salt=salt, tolerance=ctx.options.tolerance,
                   layout=ctx.layout.model_dump() if ctx.layout else None)
    if ctx.layout is None:
        kv.reason = "; ".join(p for p in ctx.problems if "layout" in p) or "KV layout unknown"
        return kv
    n_served, served = ctx.reader(ctx.main, model).read(prompt, salt)  # type: ignore[arg-type]
    if served is None:
        kv.reason = f"LMCache holds no chunk of this prompt under cache_salt {salt!r}"
        if ctx.witness is None:
            kv.reason += "; no witness LMCache"
        return kv
    chunk = ctx.main.chunk_size  # type: ignore[union-attr]
    if ctx.witness is None:
        # No clean copy to compare with: LMCache's chunks of the prompt against each other.
        kv.status, kv.reason = "self_checked", "the stack has no witness LMCache (x-kvchaos.witness)"
        kv.served_chunks = min(served.shape[0], n_served // chunk)
        kv.duplicates = [(j, i) for j, i in kvdiff.duplicate_chunks(served[:kv.served_chunks])
                         if j * chunk < max(claimed, 0)]
        if kv.duplicates:
            kv.bad_chunks = [j for j, _ in kv.duplicates]
            kv.first_bad_chunk, kv.kind = kv.bad_chunks[0], "stale"
            kv.first_bad_position = kv.first_bad_chunk * chunk
        return kv
    if witness is None:
        kv.reason = "the witness LMCache holds no chunk of this prompt (the twin did not store it)"
        return kv
    kv.status = "compared"
    for i in range(min(served.shape[0], witness.shape[0], n_served // chunk)):
        kv.chunks.append(kvdiff.compare_chunk(served[i], witness[i], chunk=i, start=i * chunk,
                                              chunk_hash=hashes[i].hex() if i < len(hashes) else "",
                                              tolerance=ctx.options.tolerance))
    bad = [c for c in kv.chunks if not c.equal and c.start < max(claimed, 0)]
    kv.bad_chunks = [c.chunk for c in kv.chunks if not c.equal]
    if bad:
        kv.first_bad_chunk, kv.kind = bad[0].chunk, bad[0].kind
        kv.first_bad_position = bad[0].first_bad_position
        kv.first_bad_layer = min(c.first_bad_layer for c in bad if c.first_bad_layer is not None)
    return kv


def _engine_kv(ctx: _Context, request_id: str, prompt: list[int], hashes: list[bytes], witness,
               armed: str | None) -> EngineKV:
    """Triage step 3 on the engine's side: the KV the fresh replay attended over (its blocks
    after the load, read through the engine's ``/debug/kv``) against the witness, per chunk."""
    ekv = EngineKV(request_id=request_id, prompt_tokens=len(prompt))
    if armed is not None:
        ekv.reason = armed
        return ekv
    if witness is None:
        ekv.reason = "the witness LMCache holds no chunk of this prompt"
        return ekv
    try:
        kv, local, external = engine_kv_api.fetch(ctx.settings.engine_url, request_id,  # type: ignore[arg-type]
                                                  timeout_s=max(0.2, min(10.0, ctx.left())))
    except engine_kv_api.EngineKVError as exc:
        ekv.reason = str(exc)
        return ekv
    chunk = ctx.main.chunk_size if ctx.main else ctx.settings.chunk_size
    ekv.loaded_start, ekv.loaded_end = local, local + external
    try:
        ekv.chunks, ekv.bad_chunks, ekv.computed_bad_chunks = kvdiff.compare_engine_kv(
            kv, witness, chunk_size=chunk, loaded=(local, local + external), hashes=[h.hex() for h in hashes],
            tolerance=ctx.options.tolerance)
    except ValueError as exc:
        ekv.reason = str(exc)
        return ekv
    ekv.status = "compared"
    ekv.first_bad_chunk = ekv.bad_chunks[0] if ekv.bad_chunks else None
    return ekv


def _clean_bypass(ctx: _Context, model: str | None, hashes: list[bytes], salt: str | None) -> list[str]:
    """Delete what the bypass replay stored under its salt (L1 and every L2 adapter), so later
    reads (lookups by salt, the leaks and hit checks of a later run on this stack) never see
    it. L2 writes are asynchronous: listed objects are deleted again for up to 3 s."""
    if ctx.main is None or model is None or not salt or not salt.startswith(BYPASS_PREFIX) or not hashes:
        return []
    rank, group = 0, 0
    for e in stored_entries(ctx.main, hashes):
        if e["model_name"] == model:
            rank, group = int(e.get("kv_rank") or 0), int(e.get("object_group_id") or 0)
            break

    def keys(entries) -> list[dict[str, Any]]:
        return [{"chunk_hash_hex": e["chunk_hash"], "model_name": e["model_name"], "kv_rank": e["kv_rank"],
                 "object_group_id": e["object_group_id"], "cache_salt": e["cache_salt"]} for e in entries]

    guessed = [{"chunk_hash": h.hex(), "model_name": model, "kv_rank": rank, "object_group_id": group,
                "cache_salt": salt} for h in hashes]
    problems = delete_objects(ctx.main, keys(guessed))
    end = time.monotonic() + min(3.0, max(0.0, ctx.left()))
    while True:
        left = [e for e in stored_entries(ctx.main, hashes) if e["cache_salt"] == salt]
        if not left:
            return problems
        if time.monotonic() > end:
            return problems + [f"{len(left)} object(s) of the bypass replay (cache_salt {salt!r}) still in L2"]
        problems = delete_objects(ctx.main, keys(left))
        time.sleep(0.2)


def _divergence(expected: list[int], actual: list[int], tops: list[dict[int, float]]) -> Divergence:
    pos = first_difference(expected, actual)
    if pos is None:
        return Divergence()
    d = Divergence(position=pos, expected_token=expected[pos] if pos < len(expected) else None,
                   actual_token=actual[pos] if pos < len(actual) else None)
    if pos < len(tops):
        top = dict(sorted(tops[pos].items(), key=lambda kv: -kv[1]))
        d.top_logprobs = top
        if d.actual_token in top and d.expected_token in top:
            d.margin = round(top[d.expected_token] - top[d.actual_token], 6)
            d.actual_rank = list(top).index(d.actual_token)
    return d


def _model_for(ctx: _Context, prompt: list[int]) -> str | None:
    """The model name of the keys: the one engine context LMCache has registered, or, when
    several are, the one whose L2 entries cover most of the prompt's chunks."""
    main = ctx.main
    if main is None or not main.model_names:
        return None
    if len(main.model_names) == 1:
        return main.model_names[0]
    hits = {m: 0 for m in main.model_names}
    for e in stored_entries(main, chunk_hashes(prompt, main.chunk_size, main.hash_algorithm)):
        if e["model_name"] in hits:
            hits[e["model_name"]] += 1
    return max(main.model_names, key=lambda m: (hits[m], m))


def diagnose_request(ctx: _Context, rec: RequestRecord, expected: list[int] | None, check: str,
                     failure: str, replay_timeout_s: float = 60.0) -> RequestDiagnosis:
    """All six steps for one request (errors are recorded, never raised); each replay waits
    at most ``replay_timeout_s`` and what the budget leaves (``ctx.deadline``); a step that
    would start after the deadline is skipped (said in ``errors``)."""
    t0 = time.monotonic()
    d = RequestDiagnosis(request_id=rec.request_id, check=check, phase=rec.phase, failure=failure)
    s = ctx.settings
    prompt = rec.prompt_token_ids or []
    inv = rec.invoke_value
    salt = inv.get("cache_salt")
    max_tokens = int(inv.get("max_tokens") or len(expected or rec.token_ids or []) or 1)
    stats = rec.cached_token_stats
    original = Original(local=stats.local_cache_hit_tokens if stats else 0,
                        external=stats.external_cache_hit_tokens if stats else 0,
                        load_failed=stats.load_failed_tokens if stats else 0,
                        preemptions=stats.num_preemptions if stats else 0)
    d.errors.extend(ctx.problems)
    model = _model_for(ctx, prompt)
    hashes: list[bytes] = []
    mark = [time.monotonic()]

    def lap(step: str) -> None:
        now = time.monotonic()
        d.step_seconds[step] = round(now - mark[0], 3)
        mark[0] = now

    def spent(step: str) -> bool:
        if ctx.left() > 0:
            return False
        d.errors.append(f"time budget spent before {step}: skipped")
        return True

    def timeout(most: float = replay_timeout_s) -> float:
        return max(0.2, min(most, ctx.left()))

    # 5 (first half): what LMCache holds before anything is replayed.
    if ctx.main is not None and model is not None and ctx.layout is not None:
        try:
            d.key, hashes = _key_identity(ctx, prompt, salt or "")
            _lookups(ctx, d.key, model, prompt)
        except LMCacheReadError as exc:
            d.errors.append(f"key identity: {exc}")
    elif ctx.main is not None and model is None:
        d.errors.append("no engine has a KV context registered with LMCache (no model name for the keys)")
    lap("lmcache_lookups")
    # 1: A/B isolation; the fresh replay's KV is captured by an engine that can show it.
    fresh_id = f"kvchaos-diagnose-fresh-{uuid.uuid4().hex[:8]}"
    armed: str | None = "no engine URL"
    bypass_used: str | None = None
    if s.engine_url and not spent("the replays"):
        d.ab.prefix_cache_reset = reset_prefix_cache(s.engine_url, timeout_s=timeout(10.0))
        if not ctx.options.engine_debug:
            armed = "reading the engine's debug routes is off (engine_debug)"
        elif not spent("the engine KV capture"):
            try:
                engine_kv_api.arm(s.engine_url, fresh_id, timeout_s=timeout(5.0))
                armed = None
            except engine_kv_api.EngineKVError as exc:
                armed = str(exc)
        if not spent("the fresh replay"):
            d.ab.fresh, _ = replay(s.engine_url, "fresh", prompt, max_tokens, cache_salt=salt, request_id=fresh_id,
                                   timeout_s=timeout())
        if not spent("the bypass replay"):
            bypass_used = bypass_salt()
            d.ab.bypass, _ = replay(s.engine_url, "bypass", prompt, max_tokens, cache_salt=bypass_used,
                                    timeout_s=timeout())
    tops: list[dict[int, float]] = []
    if s.recompute_url and not spent("the twin replay"):
        d.ab.twin, tops = replay(s.recompute_url, "twin", prompt, max_tokens, logprobs=TOP_K, timeout_s=timeout())
    lap("replays")
    truth = d.ab.twin.token_ids if d.ab.twin and d.ab.twin.token_ids is not None else expected
    if d.ab.twin and d.ab.twin.token_ids is not None and expected is not None and d.ab.twin.token_ids != expected:
        d.errors.append("the twin's answer now differs from the run's recompute oracle answer")
    for r in (d.ab.fresh, d.ab.bypass):
        if r is not None and r.token_ids is not None and truth is not None:
            r.matches_expected = r.token_ids == truth
    original.output_wrong = bool(truth is not None and rec.token_ids is not None and rec.token_ids != truth)
    fresh, bypass = d.ab.fresh, d.ab.bypass
    if bypass and bypass.matches_expected is False and bypass.hit_tokens == 0:
        d.ab.outcome = "engine-side"
    elif fresh and fresh.matches_expected is not None:
        d.ab.outcome = "transient" if fresh.matches_expected else "reproducible"
    # 2: where the tokens part.
    if truth is not None and rec.token_ids is not None:
        d.divergence = _divergence(truth, rec.token_ids, tops)
    # 3: length and mask.
    chunk = ctx.main.chunk_size if ctx.main else s.chunk_size
    length = LengthMask(prompt_tokens=len(prompt), chunk_size=chunk, claimed_local=original.local,
                        claimed_external=original.external)
    if fresh is not None and fresh.error is None:
        length.fresh_local, length.fresh_external = fresh.local_hit_tokens, fresh.external_hit_tokens
    own = d.key.lookups.get(salt or "")
    if d.key.lookups and model is not None:
        _judge_key(d.key, model, length.fresh_external, length.fresh_local or 0)
        held = d.key.lookups.get(d.key.used_salt if d.key.used_salt is not None else (salt or ""), own) or 0
        length.lmcache_prefix_tokens = held
        looked_up = fresh is not None and fresh.lookup not in (None, "disabled", "timeout", "error")
        if length.fresh_external is not None and not length.fresh_local and (
                length.fresh_external > 0 or (held > 0 and looked_up)):
            length.valid_prefix = held
            length.off_by = length.fresh_external - held
            if length.off_by:
                length.off_by_name = off_by_name(length.off_by, chunk)
                if length.fresh_external == len(prompt) - 1 and length.off_by > 0:
                    length.off_by_name += " (capped at the prompt length - 1)"
        if original.external > 0 or (check == "hit_quality" and held > 0):
            length.off_by_original = original.local + original.external - max(held, original.local)
    d.length = length
    # 4: KV content: what LMCache serves, then what the engine attends over, against the witness.
    witness = None
    if model is not None and ctx.main is not None and not spent("the KV comparison"):
        served_salt = d.key.used_salt if d.key.used_salt is not None else (salt or "")
        claimed = max((length.fresh_local or 0) + (length.fresh_external or 0), original.local + original.external)
        try:
            if ctx.witness is not None and ctx.layout is not None:
                witness = _witness_chunks(ctx, model, prompt)
            d.kv = _kv_content(ctx, model, prompt, served_salt, hashes, claimed, witness)
            if d.kv.status == "compared":
                length.lmcache_full_tokens = len(d.kv.chunks) * chunk
            elif d.kv.status == "self_checked":
                length.lmcache_full_tokens = d.kv.served_chunks * chunk
        except LMCacheReadError as exc:
            d.kv = KVContent(reason=str(exc))
    else:
        d.kv = KVContent(reason="; ".join(ctx.problems) or "no LMCache to read")
    if fresh is not None and fresh.error is None:
        d.engine_kv = _engine_kv(ctx, fresh_id, prompt, hashes, witness, armed)
    else:
        d.engine_kv = EngineKV(request_id=fresh_id, reason=armed or "the fresh replay failed")
    lap("kv_read_and_compare")
    if bypass_used:
        try:
            d.errors.extend(_clean_bypass(ctx, model, hashes or (chunk_hashes(prompt, ctx.main.chunk_size,
                                                                              ctx.main.hash_algorithm)
                                                                 if ctx.main else []), bypass_used))
        except LMCacheReadError as exc:
            d.errors.append(f"bypass clean-up: {exc}")
        lap("bypass_cleanup")
    decide(d, original)
    d.seconds = round(time.monotonic() - t0, 3)
    return d


def diagnose_failures(history: Iterable[Any], expected: dict[str, list[int]], checks: Iterable[CheckResult],
                      settings: KvchaosSettings, *, run_id: str = "", scenario: str = "",
                      options: DiagnoseOptions | None = None, request_ids: list[str] | None = None,
                      mode: str = "live", say: Callable[[str], None] = lambda _m: None) -> Diagnosis:
    """Diagnose the failing requests of a run on the running stack described by ``settings``.

    Args:
        history: the run's ops; expected: the recompute oracle's answers (snapshots).
        checks: the run's check results (which requests failed which check).
        settings: the stack's resolved ``x-kvchaos`` settings (URLs of engine, twin, LMCache,
            witness).
        options: limit, time budget, tolerance; request_ids: diagnose exactly these (any
            check, or none failed) instead of the first failing ones.

    Returns:
        The :class:`Diagnosis` (never raises for a failed step; each is recorded).
    """
    opts = options or DiagnoseOptions()
    t0 = time.monotonic()
    diag = Diagnosis(run_id=run_id, scenario=scenario, mode=mode, budget_s=opts.budget_s)  # type: ignore[arg-type]
    history = list(history)
    recs = {r.request_id: r for r in requests(history)}
    failing = failing_requests(checks, history, settings.chunk_size or 256)
    if request_ids:
        by_id = {rid: (rid, chk, line) for rid, chk, line in failing}
        failing = [by_id.get(rid, (rid, "requested", "")) for rid in request_ids]
    todo = failing if request_ids else failing[:opts.limit]
    for rid, chk, _ in failing[len(todo):]:
        diag.skipped.append(SkippedRequest(request_id=rid, check=chk, reason=f"beyond the first {opts.limit}"))
    if not todo:
        return diag
    ctx = _prepare(settings, opts, opts.deadline if opts.deadline is not None else t0 + opts.budget_s)
    diag.prepare_seconds = round(time.monotonic() - t0, 3)
    try:
        for rid, chk, line in todo:
            rec = recs.get(rid)
            if rec is None or not rec.prompt_token_ids:
                diag.skipped.append(SkippedRequest(request_id=rid, check=chk, reason="no prompt in the history"))
                continue
            if ctx.left() <= 0:
                diag.skipped.append(SkippedRequest(request_id=rid, check=chk,
                                                   reason=f"time budget of {opts.budget_s:g}s spent"))
                continue
            say(f"diagnose {rid}")
            diag.requests.append(diagnose_request(ctx, rec, expected.get(rid), chk, line))
    finally:
        ctx.stack.close()
    diag.seconds = round(time.monotonic() - t0, 3)
    return diag


def write_diagnosis(run_dir: Path, diagnosis: Diagnosis) -> Path:
    """Write ``run_dir/diagnosis.json``; returns its path."""
    path = Path(run_dir) / "diagnosis.json"
    path.write_text(diagnosis.model_dump_json(indent=2))
    return path


def load_diagnosis(run_dir: Path) -> Diagnosis | None:
    """``run_dir/diagnosis.json`` (None when absent or unreadable)."""
    path = Path(run_dir) / "diagnosis.json"
    try:
        return Diagnosis.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None
