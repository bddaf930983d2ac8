"""Step 6: the verdict, in the triage article's terms, from the evidence of steps 1-5.

Rules, first match wins (each writes the lines that decided it):

1. ``engine_side``: the bypass replay (nothing reused) is wrong too.
2. ``key_identity``: the fresh replay's hit is held only under another key than the request's,
   or the bypass replay reused tokens under a salt nobody used and the request failed isolation
   or its hit is not held under its own key (an engine that ignores cache_salt but failed for
   another reason goes on to the next rules, with the observation as a line).
3. ``prefix_length``: the fresh replay claims more loaded prefix than LMCache holds (off by N).
4. ``kv_content``: a chunk inside the claimed prefix differs from the witness (zero, corrupt,
   stale), with its first bad layer and position.
5. ``kv_content`` (stale): the engine reported a failed load yet counted those tokens as loaded.
6. ``kv_content`` (stale): the request was preempted, its replay without preemption is right,
   and LMCache's entries are right: it resumed on KV that was not its own.
7. ``logits_sampling``: reproducible, and length, key and KV (compared) all right.
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
    """``off by +1 token`` / ``off by +1 chunk (256 tokens)`` / ``off by +31 tokens``."""
    if n == 1:
        return "off by +1 token"
    if chunk_size and n % chunk_size == 0:
        k = n // chunk_size
        return f"off by +{k} chunk{'s' if k > 1 else ''} ({n} tokens)"
    return f"off by +{n} tokens"


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
        if kv.bad_chunks:
            ev.append(f"kv: chunks {kv.bad_chunks} differ from the witness too (stored after the wrong length)")
        return done("prefix_length", length.off_by_name)
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
    kv_right = kv.status == "compared" and not kv.bad_chunks
    if kv_right:
        ev.append(f"kv: the {len(kv.chunks)} chunk(s) LMCache serves for this prompt equal the witness "
                  "(max |delta| 0 within tolerance)")
    elif kv.status != "compared":
        ev.append(f"kv: not compared ({kv.reason})")
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
    if ab.outcome == "reproducible" and kv_right and (length is None or not length.off_by or length.off_by <= 0):
        ev.append("A/B: the fresh replay is wrong too, with the right prefix length and KV equal to the witness")
        return done("logits_sampling")
    if ab.outcome == "transient":
        ev.append("A/B: the fresh replay is right (transient: what broke the request has passed)")
    elif ab.outcome == "reproducible":
        ev.append("A/B: the fresh replay is wrong too")
    if not original.output_wrong:
        ev.append("the request's output equals the twin's; it failed another check")
    return done("unknown")
