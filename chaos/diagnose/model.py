"""The diagnosis of one failing request, and of a run: what ``diagnosis.json`` holds.

Each step of the triage (/work/shared/corpus/false-hit-triage.md, "The triage procedure") has
its own model; the verdict names the article's classes:

- ``kv_content``: the KV the request attended to was wrong (``kind``: zero | corrupt | stale);
- ``prefix_length``: the engine claimed more prefix than the cache held (the mask hid real
  positions; ``kind``: ``off by +N tokens``);
- ``key_identity``: the hit came from an entry stored under another key (cache_salt, model);
- ``kv_after_load``: LMCache served the right KV, but what the engine attends over after the
  load differs from the clean twin's KV (``kind`` names the layer, K or V, and the chunk, or the
  chunk whose KV it holds);
- ``logits_sampling``: the engine's KV, the length and the bypass replay right, the output
  still differs;
- ``engine_side``: the engine with the cache bypassed is wrong too (model, tokenizer, ...);
- ``unknown``: the evidence does not decide (said why in ``evidence``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["kv_content", "kv_after_load", "prefix_length", "key_identity", "logits_sampling", "engine_side", "unknown"]

#: The triage article's words for each verdict (report headings).
VERDICT_TITLES: dict[str, str] = {
    "kv_content": "KV content wrong",
    "kv_after_load": "KV content wrong after load (engine side)",
    "prefix_length": "prefix length wrong (offset)",
    "key_identity": "wrong entry (key identity)",
    "logits_sampling": "logits/sampling (KV and length right, output differs)",
    "engine_side": "engine-side (wrong with the cache bypassed too)",
    "unknown": "undecided",
}


class _Model(BaseModel):
    """Base of the diagnosis models: a non-finite float (a bit flip can turn KV into inf or NaN)
    is written to JSON as the string "Infinity"/"NaN" and read back as a float, rather than
    pydantic's default ``null``, which would lose what was found."""

    model_config = ConfigDict(ser_json_inf_nan="strings")


class Replay(_Model):
    """One replay of the request's prompt (A/B isolation).

    Attributes:
        kind: ``fresh`` (the engine, LMCache on, same cache_salt), ``bypass`` (the engine under a
            cache_salt nobody used, so nothing can be reused), ``twin`` (the recompute twin).
        token_ids: the output; None when the replay failed (``error``).
        local_hit_tokens, external_hit_tokens, load_failed_tokens, lookup: what the engine
            reported (``kv_transfer_params.cached_token_stats``; ``usage`` cached tokens count as
            local when that is all there is). ``external_hit_tokens`` is the engine's own count
            (usage cached tokens less the local hit) where that exceeds the connector's stats.
        connector_external_tokens: the connector's external figure when the engine counted more
            (vLLM with a connector that claims more than LMCache loads); None otherwise.
        matches_expected: output equals the twin's (None for the twin itself or on error).
        seconds: wall time of the replay.
    """

    kind: Literal["fresh", "bypass", "twin"]
    cache_salt: str | None = None
    token_ids: list[int] | None = None
    error: str | None = None
    local_hit_tokens: int | None = None
    external_hit_tokens: int | None = None
    load_failed_tokens: int | None = None
    lookup: str | None = None
    connector_external_tokens: int | None = None
    matches_expected: bool | None = None
    seconds: float = 0.0

    @property
    def hit_tokens(self) -> int:
        """Tokens the engine says it did not compute (local + external)."""
        return (self.local_hit_tokens or 0) + (self.external_hit_tokens or 0)


class ABIsolation(_Model):
    """Step 1: the same prompt with the cache on (fresh), bypassed, and on the twin.

    ``outcome``: ``reproducible`` (fresh replay wrong too), ``transient`` (fresh replay right:
    what broke the request has passed), ``engine-side`` (wrong with the cache bypassed), or
    ``unknown`` (a replay failed).
    """

    outcome: Literal["reproducible", "transient", "engine-side", "unknown"] = "unknown"
    fresh: Replay | None = None
    bypass: Replay | None = None
    twin: Replay | None = None
    prefix_cache_reset: bool | None = None


class Divergence(_Model):
    """Step 2: where the tokens part, and the twin's top-k logprobs there.

    Attributes:
        position: first output index that differs (None: outputs equal).
        expected_token, actual_token: the tokens there (actual None when the output is short).
        top_logprobs: the twin's top-k at that position, token id -> logprob.
        margin: logprob(expected) - logprob(actual) when the actual token is in the top-k: the
            tolerance a comparison would need to call the two equal (None otherwise).
        actual_rank: rank of the actual token in the twin's top-k (0 = best), None if absent.
    """

    position: int | None = None
    expected_token: int | None = None
    actual_token: int | None = None
    top_logprobs: dict[int, float] = Field(default_factory=dict)
    margin: float | None = None
    actual_rank: int | None = None


class LengthMask(_Model):
    """Step 3: prefix length the engine claims against what LMCache holds for the prompt.

    Attributes:
        prompt_tokens: prompt length.
        chunk_size: LMCache's chunk size (tokens).
        claimed_local, claimed_external: the original request's report (engine prefix cache,
            LMCache).
        fresh_local, fresh_external: the fresh replay's report.
        lmcache_prefix_tokens: LMCache's lookup for the prompt under the request's key, with the
            last prompt token reserved (what an engine may load), just before the fresh replay.
        lmcache_full_tokens: the same lookup over every full chunk.
        valid_prefix: tokens whose KV is legitimately available for the fresh replay.
        off_by: fresh claim - valid prefix when the engine looked up LMCache (None: no claim
            to check): > 0 the engine claims tokens LMCache does not hold (never computed), < 0
            it claims fewer than LMCache holds and served (a lost hit); ``off_by_name`` says it
            in words (one token, one chunk, ...).
        off_by_original: the original claim - LMCache's prefix now (LMCache may hold more now
            than then, so only the fresh replay decides).
    """

    prompt_tokens: int
    chunk_size: int
    claimed_local: int | None = None
    claimed_external: int | None = None
    fresh_local: int | None = None
    fresh_external: int | None = None
    lmcache_prefix_tokens: int | None = None
    lmcache_full_tokens: int | None = None
    valid_prefix: int | None = None
    off_by: int | None = None
    off_by_name: str | None = None
    off_by_original: int | None = None


class LayerDiff(_Model):
    """Served vs witness KV of one layer of one chunk (K and V planes together).

    ``max_abs_delta``: max |served - witness|; ``zero_share``: share of exact zeros in the served
    tensor; ``first_position``: absolute token position of the first differing element (None:
    equal); ``plane``: "K" or "V" there; ``planes``: every plane that differs in this layer.
    """

    layer: int
    max_abs_delta: float
    zero_share: float
    served_checksum: str
    witness_checksum: str
    first_position: int | None = None
    plane: str | None = None
    planes: list[str] = Field(default_factory=list)


class ChunkDiff(_Model):
    """Served vs witness KV of one chunk (tokens ``[start, end)``), layer by layer.

    ``same_as_chunk``: a differing chunk whose KV equals another chunk's witness KV (that
    chunk's index: stale, or written at the wrong offset). ``bad_where``: :meth:`bad_layers`.
    """

    chunk: int
    start: int
    end: int
    chunk_hash: str
    equal: bool
    kind: Literal["zero", "corrupt", "stale"] | None = None
    max_abs_delta: float
    zero_share: float
    witness_zero_share: float
    served_checksum: str
    witness_checksum: str
    first_bad_layer: int | None = None
    first_bad_position: int | None = None
    same_as_chunk: int | None = None
    bad_where: str = ""
    layers: list[LayerDiff] = Field(default_factory=list)

    def bad_layers(self) -> str:
        """``layer 2 K`` / ``layers 0-3 K+V`` / ``layers 1, 3 V``: where this chunk differs."""
        bad = [x for x in self.layers if x.planes]
        if not bad:
            return ""
        planes = sorted({p for x in bad for p in x.planes})
        ids = [x.layer for x in bad]
        if len(ids) == 1:
            where = f"layer {ids[0]}"
        elif ids == list(range(ids[0], ids[-1] + 1)):
            where = f"layers {ids[0]}-{ids[-1]}"
        else:
            where = "layers " + ", ".join(str(i) for i in ids)
        return f"{where} {'+'.join(planes)}"


class KVContent(_Model):
    """Step 4: the KV LMCache serves for the prompt against the KV the clean twin stored in the
    witness LMCache, chunk by chunk and layer by layer.

    ``status``: ``compared``, ``self_checked`` (no witness: LMCache's chunks of the prompt held
    against each other, ``duplicates``; ``reason`` says why there is no witness) or
    ``unavailable`` (``reason`` says why: no witness, no layout, nothing stored). ``kind``,
    ``first_bad_*``: over the chunks within the claimed prefix.
    """

    status: Literal["compared", "self_checked", "unavailable"] = "unavailable"
    reason: str | None = None
    model_name: str | None = None
    served_salt: str | None = None
    layout: dict | None = None
    tolerance: float = 0.0
    chunks: list[ChunkDiff] = Field(default_factory=list)
    bad_chunks: list[int] = Field(default_factory=list)
    kind: Literal["zero", "corrupt", "stale"] | None = None
    first_bad_chunk: int | None = None
    first_bad_layer: int | None = None
    first_bad_position: int | None = None
    served_chunks: int = 0
    duplicates: list[tuple[int, int]] = Field(default_factory=list)


class EngineKV(_Model):
    """The KV the engine attends over after the fresh replay's load (its own blocks, read through
    the reference engine's ``/debug/kv``) against the witness KV, chunk by chunk, layer by layer,
    K and V apart.

    ``status``: ``compared`` or ``unavailable`` (``reason``: e.g. an engine without the route,
    as vLLM, which offers no API that returns a request's KV blocks). ``loaded_start`` /
    ``loaded_end``: the token range the engine reports it took from LMCache. ``bad_chunks``: chunks
    in that range that differ; ``first_bad_chunk`` the first of them; ``computed_bad_chunks``: chunks
    past it that differ (computed over the loaded KV).
    """

    status: Literal["compared", "unavailable"] = "unavailable"
    reason: str | None = None
    request_id: str | None = None
    prompt_tokens: int | None = None
    loaded_start: int | None = None
    loaded_end: int | None = None
    chunks: list[ChunkDiff] = Field(default_factory=list)
    bad_chunks: list[int] = Field(default_factory=list)
    computed_bad_chunks: list[int] = Field(default_factory=list)
    first_bad_chunk: int | None = None


class StoredEntry(_Model):
    """Objects LMCache's L2 holds for the prompt's chunk hashes under one (model, cache_salt)."""

    model_name: str
    cache_salt: str
    chunks: list[int]
    where: list[str]


class KeyIdentity(_Model):
    """Step 5: the key the request should use (model, chunk hashes, cache_salt) against the
    entries LMCache holds and the one the engine's hit can be explained by.

    Attributes:
        model_names: model names registered with LMCache (engines' KV contexts).
        request_salt: the request's cache_salt ("" for none).
        chunk_hashes: the prompt's chunk hashes (hex, LMCache's TokenHasher).
        lookups: cache_salt -> tokens LMCache holds for the prompt under it (last token
            reserved), the request's own salt first.
        l2_entries: what the L2 adapters hold for those hashes, by (model, salt).
        used_salt: the salt whose entries explain the engine's hit (None: none does).
        mismatch: a sentence when the hit came from another key.
    """

    model_names: list[str] = Field(default_factory=list)
    request_salt: str = ""
    chunk_hashes: list[str] = Field(default_factory=list)
    lookups: dict[str, int] = Field(default_factory=dict)
    l2_entries: list[StoredEntry] = Field(default_factory=list)
    used_salt: str | None = None
    mismatch: str | None = None


class RequestDiagnosis(_Model):
    """Why one request failed: the six steps and the verdict with the lines that decided it."""

    request_id: str
    check: str
    phase: str = ""
    failure: str = ""
    verdict: Verdict = "unknown"
    kind: str | None = None
    title: str = ""
    evidence: list[str] = Field(default_factory=list)
    ab: ABIsolation = Field(default_factory=ABIsolation)
    divergence: Divergence | None = None
    length: LengthMask | None = None
    kv: KVContent = Field(default_factory=KVContent)
    engine_kv: EngineKV = Field(default_factory=EngineKV)
    key: KeyIdentity = Field(default_factory=KeyIdentity)
    errors: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    step_seconds: dict[str, float] = Field(default_factory=dict)


class SkippedRequest(_Model):
    """A failing request the diagnosis did not get to (limit, time budget, no prompt)."""

    request_id: str
    check: str
    reason: str


class Diagnosis(_Model):
    """``diagnosis.json`` of a run.

    ``mode``: ``live`` (on the stack the run used, right after its checks) or ``replayed`` (a
    fresh stack warmed with the run's earlier requests; faults are not replayed).
    """

    run_id: str
    scenario: str = ""
    mode: Literal["live", "replayed"] = "live"
    requests: list[RequestDiagnosis] = Field(default_factory=list)
    skipped: list[SkippedRequest] = Field(default_factory=list)
    budget_s: float | None = None
    seconds: float = 0.0
    prepare_seconds: float = 0.0
    error: str | None = None

    def verdicts(self) -> dict[str, str]:
        """``{request_id: "verdict" or "verdict (kind)"}``."""
        return {r.request_id: r.verdict + (f" ({r.kind})" if r.kind else "") for r in self.requests}
