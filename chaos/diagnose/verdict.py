"""Step 6: the verdict, in the triage article's terms, from the evidence of steps 1-5.

Rules, first match wins (each writes the lines that decided it):

1. ``engine_side``: the bypass replay (nothing reused) is wrong too.
2. ``key_identity``: the fresh replay's hit is held only under another key than the request's,
   or the bypass replay reused tokens under a salt nobody used and the request failed isolation
   or its hit is not held under its own key (an engine that ignores cache_salt but failed for
   another reason goes on to the next rules, with the observation as a line).
3. ``prefix_length``: the fresh replay claims more loaded prefix than LMCache holds (off by +N),
   or, for a request that failed hit_quality or whose output is right, less than LMCache holds
   and served (off by -N: a lost hit).
4. ``kv_content``: a chunk inside the claimed prefix differs from the witness (zero, corrupt,
   stale), with its first bad layer and position.
4a. ``kv_content`` (stale), on a stack without a witness: a chunk inside the claimed prefix that
   LMCache serves bit-identical to an earlier chunk of the same prompt (KV at two positions is
   never equal under rotary embedding: one chunk's KV was stored under another's key). Without a
   witness and without such a pair, LMCache's KV counts as not compared (never as right).
4b. ``kv_after_load``: LMCache's chunks equal the witness, but the KV the engine attends over
   after the load (its own blocks, where the engine can show them) differs: named by layer, K or
   V, and chunk, or as another chunk's KV (stale or wrong offset).
5. ``kv_content`` (stale): the engine reported a failed load yet counted those tokens as loaded.
6. ``kv_content`` (stale): the request was preempted, its replay without preemption is right,
   and LMCache's entries are right: it resumed on KV that was not its own.
7. ``logits_sampling``: reproducible, the bypass replay right, and length, key, LMCache's KV and
   the engine's KV after the load (compared) all right. Where the engine cannot show its KV,
   the verdict stays ``unknown`` and says so.
8. ``unknown``: nothing above holds (the lines say what was seen).
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.diagnose.model import VERDICT_TITLES, RequestDiagnosis


@dataclass
class Original:
    """What the failing request itself reported (history ``cached_token_stats``)."""

    local: int = 0
    external: int = 0
    load_failed: int = 0
    preemptions: int = 0
    output_wrong: bool = True


def off_by_name(n: int, chunk_size: int) -> str:
    """``off by +1 token`` / ``off by +1 chunk (256 tokens)`` / ``off by +31 tokens`` /
    ``off by -1 token`` (negative: the claim is short of what LMCache holds)."""
    sign, m = ("+", n) if n >= 0 else ("-", -n)
    if m == 1:
        return f"off by {sign}1 token"
    if chunk_size and m and m % chunk_size == 0:
        k = m // chunk_size
        return f"off by {sign}{k} chunk{'s' if k > 1 else ''} ({m} tokens)"
    return f"off by {sign}{m} tokens"


def _engine_kv_kind(d: RequestDiagnosis) -> tuple[str, list[str]]:
    """The kind (layer, K/V, chunk) and the evidence lines of a wrong engine KV after load."""
    ekv = d.engine_kv
    by = {c.chunk: c for c in ekv.chunks}
    bad = ekv.bad_chunks or ekv.computed_bad_chunks
    first = by[bad[0]]
    lines = []
    for i in bad:
        c = by[i]
        where = "loaded" if i in ekv.bad_chunks else "computed after the load"
        text = (f"engine kv: chunk {c.chunk} (tokens {c.start}-{c.end - 1}, {where}) differs from the witness in "
                f"{c.bad_layers()}: {c.kind}, max |delta| {c.max_abs_delta:.4g}, {c.zero_share:.0%} zeros "
                f"(witness {c.witness_zero_share:.0%})")
        if c.same_as_chunk is not None:
            text += f"; it equals chunk {c.same_as_chunk}'s witness KV (stale or wrong offset)"
        lines.append(text)
    if first.same_as_chunk is not None:
        kind = f"chunk {first.chunk} holds chunk {first.same_as_chunk}'s KV (stale or wrong offset)"
    else:
        kind = f"{first.bad_layers()}, chunk {first.chunk}"
    return kind, lines


def decide(d: RequestDiagnosis, original: Original) -> RequestDiagnosis:
    """Fill ``verdict``, ``kind``, ``title`` and ``evidence`` of ``d`` (returned)."""
    ev: list[str] = []
    ab, length, kv, key = d.ab, d.length, d.kv, d.key
    fresh, bypass = ab.fresh, ab.bypass

    def done(verdict: str, kind: str | None = None) -> RequestDiagnosis:
        d.verdict, d.kind = verdict, kind  # type: ignore[assignment]
        d.title = VERDICT_TITLES[verdict] + (f": {kind}" if kind else "")
        d.evidence = ev + d.evidence
        return d

    # 1. cache bypassed and still wrong
    if bypass and bypass.error is None and bypass.hit_tokens == 0 and bypass.matches_expected is False:
        ev.append(f"A/B: with the cache bypassed (cache_salt {bypass.cache_salt!r}, 0 tokens reused) the output "
                  "still differs from the twin's: the cache path is not at fault")
        return done("engine_side")
    # 2. key identity
    if key.mismatch:
        ev.append("key: " + key.mismatch)
        if bypass and bypass.error is None and bypass.hit_tokens > 0:
            ev.append(f"A/B: under a cache_salt nobody used ({bypass.cache_salt!r}) the engine reused "
                      f"{bypass.hit_tokens} tokens: its cache key ignores cache_salt")
        return done("key_identity")
    if bypass and bypass.error is None and bypass.hit_tokens > 0:
        line = (f"A/B: under a cache_salt nobody used ({bypass.cache_salt!r}) the engine reused "
                f"{bypass.hit_tokens} tokens: its cache key ignores cache_salt")
        own = key.lookups.get(key.request_salt)
        claimed = original.local + original.external
        if d.check == "isolation" or (own is not None and own < claimed):
            ev.append(line)
            return done("key_identity")
        # The request's own key explains its hit: the salt is ignored, but that is not why it failed.
        ev.append(line + f"; this request's hit ({claimed} tokens) is held under its own key, so that is "
                  "not why it failed")
    # 3. prefix length
    if length and length.off_by is not None and length.off_by > 0:
        ev.append(f"length: the fresh replay claims {length.fresh_local or 0} local + {length.fresh_external or 0} "
                  f"LMCache tokens of {length.prompt_tokens}, but LMCache holds {length.lmcache_prefix_tokens} "
                  f"tokens for this prefix: {length.off_by_name}; tokens past the valid prefix "
                  f"({length.valid_prefix}) were never computed")
        if fresh is not None and fresh.connector_external_tokens is not None:
            ev.append(f"length: the engine counted {fresh.hit_tokens} prompt tokens as not computed (its usage "
                      f"cached_tokens), its connector says LMCache loaded {fresh.connector_external_tokens}")
        if kv.bad_chunks:
            ev.append(f"kv: chunks {kv.bad_chunks} differ from the witness too (stored after the wrong length)")
        return done("prefix_length", length.off_by_name)
    if length and length.off_by is not None and length.off_by < 0:
        line = (f"length: the fresh replay claims {length.fresh_local or 0} local + {length.fresh_external or 0} "
                f"LMCache tokens of {length.prompt_tokens}, but LMCache holds {length.lmcache_prefix_tokens} tokens "
                f"for this prefix: {length.off_by_name} (a claim short of the hit)")
        ekv = d.engine_kv
        if d.check == "hit_quality" or not original.output_wrong:
            ev.append(line)
            if ekv.status == "compared" and not ekv.bad_chunks and ekv.loaded_end is not None:
                ev.append(f"engine kv: the tokens LMCache holds (0-{length.lmcache_prefix_tokens - 1}) hold the "
                          "witness's KV in the engine's blocks: they were loaded, and the report leaves "
                          f"{-length.off_by} of them out")
            if not original.output_wrong:
                ev.append("the output equals the twin's: the offset costs hits (and TTFT), not correctness")
            return done("prefix_length", length.off_by_name)
        d.evidence.append(line + "; not why the output is wrong")
    # 4. KV content from LMCache
    if kv.status == "compared" and kv.first_bad_chunk is not None:
        c = next(c for c in kv.chunks if c.chunk == kv.first_bad_chunk)
        ev.append(f"kv: chunk {c.chunk} (tokens {c.start}-{c.end - 1}) served from LMCache differs from the "
                  f"witness: {c.kind}, max |delta| {c.max_abs_delta:.4g}, {c.zero_share:.0%} zeros "
                  f"(witness {c.witness_zero_share:.0%}), checksum {c.served_checksum} vs {c.witness_checksum}; "
                  f"first bad layer {c.first_bad_layer} at position {c.first_bad_position}")
        if c.first_bad_layer and c.first_bad_layer > 0:
            ev.append(f"kv: layers 0-{c.first_bad_layer - 1} equal the witness: this chunk's KV was computed over "
                      "a wrong context (its earlier positions' KV was not this prefix's)")
        if len(kv.bad_chunks) > 1:
            ev.append(f"kv: bad chunks {kv.bad_chunks} (first bad layer over all: {kv.first_bad_layer})")
        return done("kv_content", kv.kind)
    if kv.status == "self_checked" and kv.duplicates:
        j, i = kv.duplicates[0]
        n = kv.served_chunks
        chunk = length.chunk_size if length else 0
        ev.append(f"kv: chunk {j} (tokens {j * chunk}-{(j + 1) * chunk - 1}) served from LMCache is bit-identical to "
                  f"chunk {i}'s (tokens {i * chunk}-{(i + 1) * chunk - 1}): the KV of two positions is never equal "
                  "(the cached keys carry their rotary positions), so what LMCache holds under chunk "
                  f"{j}'s key is chunk {i}'s KV")
        if len(kv.duplicates) > 1:
            ev.append("kv: chunks " + ", ".join(f"{a} = chunk {b}" for a, b in kv.duplicates)
                      + f" (of the {n} LMCache serves)")
        ev.append(f"kv: {kv.reason}: LMCache's chunks of the prompt were held against each other")
        return done("kv_content", f"chunk {j} holds chunk {i}'s KV (stored under the wrong key)")
    kv_right = kv.status == "compared" and not kv.bad_chunks
    if kv.status == "self_checked":
        ev.append(f"kv: not compared ({kv.reason}); the {kv.served_chunks} chunk(s) LMCache serves are pairwise "
                  "distinct (a check without a witness, not a proof that they are right)")
    if kv_right:
        ev.append(f"kv: the {len(kv.chunks)} chunk(s) LMCache serves for this prompt equal the witness "
                  "(max |delta| 0 within tolerance)")
    elif kv.status != "compared":
        ev.append(f"kv: not compared ({kv.reason})")
    # 4b. the engine's own KV after the load
    ekv = d.engine_kv
    engine_right = ekv.status == "compared" and not ekv.bad_chunks and not ekv.computed_bad_chunks
    if ekv.status == "compared" and (ekv.bad_chunks or ekv.computed_bad_chunks):
        kind, lines = _engine_kv_kind(d)
        ev.append(f"engine kv: the fresh replay's KV blocks after the load (tokens {ekv.loaded_start}-"
                  f"{(ekv.loaded_end or 0) - 1} from LMCache) differ from the clean twin's KV"
                  + (", while LMCache's copy equals it" if kv_right else ""))
        ev.extend(lines)
        if bypass and bypass.matches_expected:
            ev.append("A/B: with LMCache bypassed the output is right: what the engine put into its blocks after "
                      "the load is wrong")
        return done("kv_after_load", kind)
    if engine_right:
        ev.append(f"engine kv: the {len(ekv.chunks)} chunk(s) of KV the engine attends over after the load "
                  "equal the witness")
    elif ekv.reason:
        ev.append(f"engine kv: not compared ({ekv.reason})")
    # 5. a failed load trusted
    if original.load_failed > 0 and original.external >= original.load_failed:
        ev.append(f"history: the engine reported {original.load_failed} tokens failed to load and still counted "
                  f"{original.external} tokens as loaded from LMCache: it attended to blocks the load never "
                  "wrote (stale KV)")
        if ab.outcome == "transient":
            ev.append("A/B: the fresh replay (the load succeeds now) is right")
        return done("kv_content", "stale")
    # 6. preempted and resumed wrong
    if original.preemptions > 0 and original.output_wrong and ab.outcome == "transient":
        ev.append(f"history: the request was preempted {original.preemptions} time(s); its replay without "
                  "preemption is right" + (" and LMCache's entries equal the witness" if kv_right else "")
                  + ": it resumed on KV that was not its own (stale blocks)")
        return done("kv_content", "stale")
    # 7. logits / sampling
    length_right = length is None or not length.off_by
    bypass_right = bool(bypass and bypass.error is None and bypass.matches_expected)
    if ab.outcome == "reproducible" and kv_right and length_right and bypass_right and engine_right:
        ev.append("A/B: the fresh replay is wrong too, with the right prefix length, the bypass replay right, and "
                  "both LMCache's KV and the engine's KV after the load equal to the witness")
        return done("logits_sampling")
    if ab.outcome == "reproducible" and kv_right and length_right and bypass_right:
        ev.append("A/B: the fresh replay is wrong and the bypass replay right, with the right prefix length and "
                  "LMCache's KV equal to the witness: the engine's use of the loaded KV is at fault (its blocks "
                  "after the load, or how it attends over them); which one cannot be told without the engine's KV")
        return done("unknown", "engine side after load (engine KV not visible)")
    if ab.outcome == "transient":
        ev.append("A/B: the fresh replay is right (transient: what broke the request has passed)")
    elif ab.outcome == "reproducible":
        ev.append("A/B: the fresh replay is wrong too")
    if not original.output_wrong:
        ev.append("the request's output equals the twin's; it failed another check")
    return done("unknown")
